#!/usr/bin/env bash
# Headless Chromium for the page tests (tests/browser; docs/report.md); `make test` runs it. Idempotent,
# and a few hundred milliseconds when everything is there already.
#   - chromium, chromium-driver (Debian packages): the browser the tests open the pages in, and its
#     WebDriver (for whoever drives it with Selenium; the tests themselves use the DevTools protocol)
#   - fonts-dejavu-core: the pages' text has a font on a bare host (Chromium only recommends fonts)
#   - playwright (PyPI): the Python client that drives it; it is pointed at /usr/bin/chromium, so
#     Playwright's own browser downloads (`playwright install`) are never needed
set -euo pipefail
PYTHON="${PYTHON:-.venv/bin/python}"

if ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null || [ ! -e /usr/share/fonts/truetype/dejavu/DejaVuSans.ttf ]; then
  apt_pkgs=(chromium chromium-driver fonts-dejavu-core)
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get install -y --no-install-recommends "${apt_pkgs[@]}" || {
    $SUDO apt-get update && $SUDO apt-get install -y --no-install-recommends "${apt_pkgs[@]}"
  }
fi

if ! "$PYTHON" -c "import playwright.async_api" 2>/dev/null; then
  "$PYTHON" -m pip install --quiet --disable-pip-version-check "playwright>=1.45"
fi
echo "browser ready: $(chromium --version 2>/dev/null | head -1), playwright $("$PYTHON" -c 'from importlib.metadata import version; print(version("playwright"))')"
