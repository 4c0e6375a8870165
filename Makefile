# Sinewgrid — the two commands a newcomer needs: `make demo` and `make test`.
# Each one creates .venv and installs the project on a fresh machine.

SHELL := /bin/bash
VENV  := .venv
PY    := $(VENV)/bin/python
STAMP := $(VENV)/.installed

# The storage root and the Dagster instance folder (override on the command line).
export SINEWGRID_HOME ?= $(CURDIR)/.sinewgrid
export DAGSTER_HOME   ?= $(SINEWGRID_HOME)/dagster

# Python 3.11 first: the CPU build of torch that this project pins lies on disk for 3.11.
# Then any 3.11+ on PATH, then pyenv's.
PYTHON ?= $(shell for p in python3.11 python3.12 python3.13 python3; do \
	  if command -v $$p >/dev/null 2>&1 && $$p -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then command -v $$p; exit; fi; done; \
	  for v in 3.11 3.12 3.13; do p=$$(PYENV_VERSION=$$(pyenv versions --bare 2>/dev/null | grep "^$$v" | tail -1) pyenv which python 2>/dev/null); \
	  if [ -n "$$p" ]; then echo $$p; exit; fi; done)

.PHONY: help venv demo test test-fast test-random ui ui-tour bench images rehearsal clean-home clean

help:
	@echo "make demo   run the Cell and Robotics loops end to end on this machine, then a summary"
	@echo "make test   run the whole test suite (what CI runs)"
	@echo "make test-fast   the quick loop while working: leaves out the engines, e2e and ui tiers"
	@echo "make test-random [SEED=n]   the whole suite in a shuffled order (prints the seed to repeat it)"
	@echo "make ui     open the Dagster UI (http://127.0.0.1:3000) on the same storage root"
	@echo "make ui-tour   take the pictures of docs/ui-tour.md again (the UI test on a fresh demo)"
	@echo "make bench  print the benchmark figures, each beside its baseline (benchmarks/README.md)"
	@echo "make images build the orchestration and workload images with podman and check each (deploy/docker)"
	@echo "make rehearsal   the production shape on this machine (PostgreSQL, S3 with IAM/KMS/SQS, daemon, code servers, a container per run, a Slurm pool in the workload image) driven through both lanes (docs/deploy.md)"
	@echo "storage root: $(SINEWGRID_HOME)   Dagster instance: $(DAGSTER_HOME)"

venv: $(STAMP)

$(STAMP): pyproject.toml
	@if [ -z "$(PYTHON)" ]; then echo "Sinewgrid needs Python 3.11 or newer (python3.11 on PATH or through pyenv)." >&2; exit 1; fi
	@echo "Creating $(VENV) with $(PYTHON)"
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@$(PY) -m pip install --quiet --upgrade pip
	@$(PY) -m pip install --quiet -e '.[test]'
	@touch $(STAMP)

# Isaac Lab runs in its own Python 3.12 runtime (mk/isaaclab.mk): built once, ~3 minutes.
demo: $(STAMP) isaaclab-runtime
	$(VENV)/bin/sinewgrid demo

# The suite runs Slurm, Ray and PostgreSQL for real: it starts and stops a single-node Slurm
# cluster, a Ray head and a PostgreSQL server itself (testbed/); `slurm-packages` and
# `postgres-packages` install their Debian packages if missing; `ui-packages` installs the
# Chromium the UI test drives (tests/test_ui.py).
# Three workers (pytest-xdist) on two cores: a test often waits (on a workload's start, Slurm's
# or Ray's scheduler, a page to render), and a third worker fills the CPU it leaves idle. Tests
# sharing the Slurm cluster and the Ray head stay on one worker, and so does each module
# (tests/conftest.py, `_worker_group`); the demo runs once beside them (tests/fixtures/demo.py).
TEST_WORKERS ?= 3
test: $(STAMP) isaaclab-runtime lerobot-runtime slurm-packages postgres-packages ui-packages
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadgroup --no-loadscope-reorder

# LeRobot's own reader opens every dataset the demo writes (tests/test_lerobot_reader.py), in its
# own Python 3.12 runtime (mk/lerobot.mk). Under `make test` that test must run, never skip: the
# runtime is a prerequisite and named here. `make test-fast` skips it only where the runtime is missing.
test test-random: export SINEWGRID_LEROBOT_PYTHON = $(CURDIR)/$(LEROBOT_PY)

# Tiers (pyproject.toml): `engines` start Slurm, Ray, PostgreSQL or the S3 API server, `e2e`
# run workloads or a loop end to end, `ui` drives the Dagster UI. None of them here.
test-fast: $(STAMP)
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadgroup --no-loadscope-reorder -m "not engines and not e2e and not ui"

# Every test passes alone and in any order: modules and the tests in each, shuffled.
SEED ?= $(shell echo $$RANDOM)
test-random: $(STAMP) isaaclab-runtime lerobot-runtime slurm-packages postgres-packages ui-packages
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadgroup --no-loadscope-reorder -p random_order --random-order-bucket=module --random-order-seed=$(SEED)

# The pictures of docs/ui-tour.md: the UI test (tests/test_ui.py) on a fresh demo writes them into
# docs/ui-tour/, half size (~6 minutes).
ui-tour: $(STAMP) isaaclab-runtime ui-packages
	SINEWGRID_UI_TOUR=1 $(PY) -m pytest tests/test_ui.py -q

ui: $(STAMP)
	@mkdir -p "$(DAGSTER_HOME)"
	$(VENV)/bin/sinewgrid init-instance
	$(VENV)/bin/dagster dev -w workspace.yaml -h 127.0.0.1 -p 3000

# The orchestration and workload images (deploy/docker/README.md), built with podman on a Debian
# base made here, from the wheels of exactly what .venv runs; each checked, tagged by the digest of
# its inputs. As root (podman, runc and mmdebstrap are installed if missing); ~7 minutes the first
# time, seconds when nothing changed.
images: $(STAMP)
	$(PY) deploy/docker/build.py

# The production rehearsal (docs/deploy.md): rehearsal/stack.py brings up PostgreSQL, the S3 API
# with IAM, KMS and SQS, and, each in a container of the orchestration image, a code server per
# location, dagster-daemon and dagster-webserver from deploy/dagster.yaml, each run in a container
# of its own, and a Slurm cluster whose steps run in the workload image (the Cell steady pool);
# tests/rehearsal/ drives both lanes through them, with faults, and opens the UI in Chromium. The
# stack's logs and the timings stay in build/rehearsal/. As root (the images need podman);
# ~18 minutes once the images are built.
rehearsal: $(STAMP) postgres-packages slurm-packages ui-packages images
	SINEWGRID_REHEARSAL=1 $(PY) -m pytest tests/rehearsal

bench: $(STAMP) slurm-packages
	$(PY) -m benchmarks.run

clean-home:
	rm -rf "$(SINEWGRID_HOME)"

clean: clean-home
	rm -rf $(VENV) *.egg-info

include mk/isaaclab.mk
include mk/lerobot.mk
include mk/engines.mk
include mk/ui.mk
