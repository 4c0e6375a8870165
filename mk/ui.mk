# The browser the UI test drives (tests/test_ui.py): Debian's Chromium, through Playwright with
# `executable_path` (Playwright's own browser download is never used). Usable on its own:
# `make -f mk/ui.mk ui-packages`.

UI_PACKAGES ?= chromium
CHROMIUM    ?= /usr/bin/chromium

.PHONY: ui-packages

# Installs Chromium (Debian) only where it is missing: a no-op on a machine that has it.
ui-packages:
	@if [ -x "$(CHROMIUM)" ]; then exit 0; fi; \
	if [ "$$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then \
	  echo "The UI test (tests/test_ui.py) needs Chromium at $(CHROMIUM), and installing it needs" >&2; \
	  echo "root and apt-get. As root: apt-get install -y $(UI_PACKAGES)" >&2; \
	  exit 1; fi; \
	echo "Installing $(UI_PACKAGES) (Debian, about 30 s)"; \
	apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $(UI_PACKAGES) >/dev/null
