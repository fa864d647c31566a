#!/usr/bin/env bash
# Headless Chromium and its WebDriver (Debian packages `chromium`, `chromium-driver`) for
# the viewer's browser tests. Needs root; does nothing when both are already installed.
# Exit 0: installed; 1: cannot install here (the tests then skip and say why).
set -euo pipefail
if command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; then
    exit 0
fi
if [ "$(id -u)" != "0" ]; then
    echo "install_chromium.sh: not root, cannot apt-get install chromium chromium-driver" >&2
    exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq chromium chromium-driver >/dev/null
command -v chromium >/dev/null && command -v chromedriver >/dev/null
