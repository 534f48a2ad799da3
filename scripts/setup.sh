#!/usr/bin/env bash
# Set up a development/CI environment on Debian 12 (or Ubuntu): system packages, then a venv at .venv.
#   scripts/setup.sh          runtime only (enough for `gpuguard snapshot`)
#   scripts/setup.sh --test   plus everything the test suite needs
set -euo pipefail
cd "$(dirname "$0")/.."

want_test=0
[ "${1:-}" = "--test" ] && want_test=1

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi

apt_packages=(python3 python3-venv python3-pip ca-certificates)
if [ "$want_test" = 1 ]; then
  # shellcheck source=scripts/test-packages.txt
  mapfile -t extra < <(grep -v '^\s*#' scripts/test-packages.txt | grep -v '^\s*$')
  apt_packages+=("${extra[@]}")
fi

missing=()
for pkg in "${apt_packages[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if [ "${#missing[@]}" -gt 0 ]; then
  echo "setup: installing Debian packages: ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

python=python3
[ -x .venv/bin/python ] || "$python" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip >/dev/null 2>&1 || true
# setuptools prints an "Editable installation." notice (its InformationOnly class, not a problem) on every editable
# install of a flat layout; only that message is silenced, every other warning still shows.
export PYTHONWARNINGS="ignore:Editable installation"
if [ "$want_test" = 1 ]; then
  .venv/bin/python -m pip install -q -e '.[test,probe]'
else
  .venv/bin/python -m pip install -q -e .
fi
echo "setup: ready (.venv/bin/gpuguard)"
