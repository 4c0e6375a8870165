# Engines the tests run for real. The Slurm tests (tests/test_slurm_backend.py) start their own
# single-node cluster from the Debian packages below (testbed/slurm_cluster.py); nothing
# is configured system-wide. Usable on its own: `make -f mk/engines.mk slurm-packages`.
# runc: the OCI runtime the cluster's `oci.conf` names, for steps that run in a container
# (`srun --container`, tests/test_slurm_containers.py). slurmdbd and mariadb-server: the cluster's
# accounting (accounts, QOS, fair share; docs/queues_slurm.md), a throwaway database in its folder.

SLURM_PACKAGES ?= slurmctld slurmd slurm-client munge runc slurmdbd mariadb-server

.PHONY: slurm-packages

# Installs Slurm 22.05 (Debian) only where a command is missing: a no-op on a machine that has them.
slurm-packages:
	@if command -v sbatch >/dev/null 2>&1 && command -v slurmctld >/dev/null 2>&1 \
	    && command -v slurmd >/dev/null 2>&1 && command -v munged >/dev/null 2>&1 && command -v runc >/dev/null 2>&1 \
	    && command -v slurmdbd >/dev/null 2>&1 && command -v mariadb-install-db >/dev/null 2>&1 \
	    && { command -v mariadbd >/dev/null 2>&1 || [ -x /usr/sbin/mariadbd ]; }; then \
	  exit 0; fi; \
	if [ "$$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then \
	  echo "The Slurm tests need $(SLURM_PACKAGES) (sbatch, slurmctld, slurmd, munged, runc, slurmdbd, mariadbd), and installing" >&2; \
	  echo "them needs root and apt-get. As root: apt-get install -y $(SLURM_PACKAGES)" >&2; \
	  exit 1; fi; \
	echo "Installing $(SLURM_PACKAGES) (Debian, about 20 s)"; \
	apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $(SLURM_PACKAGES) >/dev/null

# The ledger's PostgreSQL tests (tests/test_ledger.py) start their own throwaway server in a
# temporary folder (testbed/postgres_server.py) from the server binaries of this package.
POSTGRES_PACKAGES ?= postgresql

.PHONY: postgres-packages

# Installs PostgreSQL (Debian: 15) only where no server binaries are found: a no-op on a machine that has them.
postgres-packages:
	@if ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || [ -x "$${POSTGRES_BIN:-/nonexistent}/initdb" ]; then \
	  exit 0; fi; \
	if [ "$$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then \
	  echo "The ledger's PostgreSQL tests need PostgreSQL's server binaries (initdb, pg_ctl), and installing" >&2; \
	  echo "them needs root and apt-get. As root: apt-get install -y $(POSTGRES_PACKAGES)" >&2; \
	  exit 1; fi; \
	echo "Installing $(POSTGRES_PACKAGES) (Debian, about 15 s)"; \
	apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $(POSTGRES_PACKAGES) >/dev/null
