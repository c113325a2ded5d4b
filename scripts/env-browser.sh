#!/usr/bin/env bash
# Install (once) Debian's Chromium and ChromeDriver for the report's browser test
# (tests/report/test_report_browser.py). Needs root or passwordless sudo and Debian's package registry; measured
# here: about 30 s. Exits non-zero when they cannot be installed (scripts/test.sh then lets the test skip).
set -euo pipefail
if [ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ]; then
  exit 0
fi
SUDO=""
if [ "$(id -u)" != "0" ]; then
  sudo -n true 2>/dev/null || { echo "env-browser: not root and no passwordless sudo; chromium not installed" >&2; exit 1; }
  SUDO="sudo -n"
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends chromium chromium-driver >/dev/null
[ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ]
