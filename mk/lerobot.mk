# LeRobot runtime: a separate Python 3.12 venv holding LeRobot's own reader, for the test that opens
# every dataset we write with it (tests/test_lerobot_reader.py).
#
# `lerobot[dataset]==0.6.1` needs Python >= 3.12, numpy < 2.3 and torch < 2.12: it fits neither the
# project's venv (3.11) nor the Isaac Lab runtime (its numpy would be downgraded), so it gets its own
# venv (.venv-lerobot/, never committed). Nothing of the project is installed there: the checker
# (tests/lerobot_reader/check_dataset.py) runs as a script and imports only LeRobot and numpy.
# Build: `make lerobot-runtime` (about 90 s and 5.4 GB the first time: torch with its CUDA
# libraries, torchcodec, PyAV). `make test` builds it when missing, after the Isaac Lab runtime,
# whose torch 2.11 with its CUDA libraries (4.5 GB) it hard-links rather than installs a second
# time (mk/link_packages.py): 0.9 GB more on disk, not 5.4. Usable on its own:
# `make -f mk/lerobot.mk` (then it installs its own torch).

LEROBOT_VENV    ?= .venv-lerobot
LEROBOT_PY      := $(LEROBOT_VENV)/bin/python
LEROBOT_STAMP   := $(LEROBOT_VENV)/.installed
LEROBOT_VERSION ?= 0.6.1
ISAACLAB_VENV   ?= .venv-isaaclab
SITE_PACKAGES   := import sysconfig; print(sysconfig.get_path("purelib"))

# python3.12 on PATH first (a pyenv shim there may exist yet not run: check that it does), then
# pyenv's newest 3.12.x; the same search as mk/isaaclab.mk, which sets it first when both are included.
PYTHON312 ?= $(shell \
	  if command -v python3.12 >/dev/null 2>&1 && python3.12 -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))' >/dev/null 2>&1; then \
	    command -v python3.12; exit; fi; \
	  v=$$(pyenv versions --bare 2>/dev/null | grep -E '^3\.12\.[0-9]+$$' | sort -t. -k3 -n | tail -1); \
	  if [ -n "$$v" ]; then PYENV_VERSION=$$v pyenv which python 2>/dev/null; fi)

.PHONY: lerobot-runtime clean-lerobot-runtime

lerobot-runtime: $(LEROBOT_STAMP)

$(LEROBOT_STAMP): mk/lerobot.mk
	@if [ -z "$(PYTHON312)" ]; then \
	  echo "The LeRobot runtime needs Python 3.12 (lerobot $(LEROBOT_VERSION) needs 3.12 or newer, with numpy < 2.3)." >&2; \
	  echo "None found: neither a working python3.12 on PATH nor a 3.12.x in 'pyenv versions'." >&2; \
	  echo "Install one (e.g. 'pyenv install 3.12') or pass PYTHON312=/path/to/python3.12." >&2; \
	  exit 1; fi
	@echo "Creating $(LEROBOT_VENV) with $(PYTHON312)"
	@test -x $(LEROBOT_PY) || $(PYTHON312) -m venv $(LEROBOT_VENV)
	@$(LEROBOT_PY) -m pip install --quiet --upgrade pip
	@if [ -f $(ISAACLAB_VENV)/.installed ]; then \
	  $(LEROBOT_PY) mk/link_packages.py "$$($(ISAACLAB_VENV)/bin/python -c '$(SITE_PACKAGES)')" "$$($(LEROBOT_PY) -c '$(SITE_PACKAGES)')" torch; fi
	@echo "Installing lerobot[dataset]==$(LEROBOT_VERSION) (about 90 s; ~1 GB beside the linked torch, ~5 GB without)"
	@$(LEROBOT_PY) -m pip install --quiet 'lerobot[dataset]==$(LEROBOT_VERSION)'
	@$(LEROBOT_PY) -c 'import lerobot.datasets.lerobot_dataset, av' || { \
	  echo "$(LEROBOT_VENV): lerobot installed but its dataset reader does not import (see above); 'make clean-lerobot-runtime' and try again." >&2; exit 1; }
	@touch $(LEROBOT_STAMP)

clean-lerobot-runtime:
	rm -rf $(LEROBOT_VENV)
