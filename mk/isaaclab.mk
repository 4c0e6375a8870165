# Isaac Lab runtime: a separate Python 3.12 venv for the Robotics lane's Isaac Lab workloads.
#
# Isaac Lab 3.0 needs Python 3.12 while the project runs on 3.11, so its workloads run in
# their own venv (.venv-isaaclab/, never committed) and are started from the repo root with
# `.venv-isaaclab/bin/python -m ...`: the repo's packages import from the working directory,
# nothing from the main project is installed there. Build: `make isaaclab-runtime`
# (about 3 minutes and 8 GB the first time). Usable on its own: `make -f mk/isaaclab.mk`.

ISAACLAB_VENV     ?= .venv-isaaclab
ISAACLAB_PY       := $(ISAACLAB_VENV)/bin/python
ISAACLAB_STAMP    := $(ISAACLAB_VENV)/.installed
ISAACLAB_VERSION  ?= 3.0.0
# Free disk the first build needs (the venv is ~8 GB, pip's downloads pass through its cache):
# checked before anything is installed, so a full disk fails here with the reason, not mid-install.
ISAACLAB_DISK_GB  ?= 10
# What the workloads need beside Isaac Lab (kept in step with the main project's pins; pydantic for
# the typed workload inputs and configs, s3fs for an s3:// storage root, cryptography, the AWS
# Encryption SDK (the sealed format) and boto3 for
# a tenant's sealed data and KMS key; PyAV for LeRobot episodes with cameras, kept at the main venv's pin).
ISAACLAB_WORKLOAD_PACKAGES ?= dagster-pipes==1.13.27 pydantic safetensors fsspec s3fs pyarrow pandas numpy cryptography aws-encryption-sdk==4.0.7 boto3 av==18.1.0

# python3.12 on PATH first (a pyenv shim there may exist yet not run: check that it does),
# then pyenv's newest 3.12.x.
PYTHON312 ?= $(shell \
	  if command -v python3.12 >/dev/null 2>&1 && python3.12 -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))' >/dev/null 2>&1; then \
	    command -v python3.12; exit; fi; \
	  v=$$(pyenv versions --bare 2>/dev/null | grep -E '^3\.12\.[0-9]+$$' | sort -t. -k3 -n | tail -1); \
	  if [ -n "$$v" ]; then PYENV_VERSION=$$v pyenv which python 2>/dev/null; fi)

.PHONY: isaaclab-runtime isaaclab-selftest clean-isaaclab-runtime

isaaclab-runtime: $(ISAACLAB_STAMP)

$(ISAACLAB_STAMP): mk/isaaclab.mk
	@if [ -z "$(PYTHON312)" ]; then \
	  echo "The Isaac Lab runtime needs Python 3.12 (Isaac Lab $(ISAACLAB_VERSION) supports no other)." >&2; \
	  echo "None found: neither a working python3.12 on PATH nor a 3.12.x in 'pyenv versions'." >&2; \
	  echo "Install one (e.g. 'pyenv install 3.12') or pass PYTHON312=/path/to/python3.12." >&2; \
	  exit 1; fi
	@free_kb=$$(df -Pk . | awk 'NR == 2 {print $$4}'); \
	if [ -n "$$free_kb" ] && [ "$$free_kb" -lt $$(( $(ISAACLAB_DISK_GB) * 1024 * 1024 )) ] && [ ! -x $(ISAACLAB_PY) ]; then \
	  echo "The Isaac Lab runtime needs about $(ISAACLAB_DISK_GB) GB on this disk; only $$(( free_kb / 1024 / 1024 )) GB are free under $(CURDIR)." >&2; \
	  echo "Free some space (old clones and their .venv* folders, ~/.cache/pip) and rerun; nothing was installed." >&2; \
	  exit 1; fi
	@echo "Creating $(ISAACLAB_VENV) with $(PYTHON312)"
	@test -x $(ISAACLAB_PY) || $(PYTHON312) -m venv $(ISAACLAB_VENV)
	@$(ISAACLAB_PY) -m pip install --quiet --upgrade pip
	@echo "Installing isaaclab==$(ISAACLAB_VERSION) and the workload packages (a few minutes, ~8 GB)"
	@$(ISAACLAB_PY) -m pip install --quiet isaaclab==$(ISAACLAB_VERSION) $(ISAACLAB_WORKLOAD_PACKAGES)
	@touch $(ISAACLAB_STAMP)

# A real Cartpole rollout on the CPU in the runtime, printed as JSON (first run ~45 s: Warp compiles).
isaaclab-selftest: $(ISAACLAB_STAMP)
	$(ISAACLAB_PY) -m robotics_lane.sim.isaaclab_backend --selftest

clean-isaaclab-runtime:
	rm -rf $(ISAACLAB_VENV)
