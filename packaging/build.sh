#!/usr/bin/env bash
# Build gpuguard's packages for one target distribution (packaging/README.md):
#   packaging/build.sh --target debian12|debian13|ubuntu2204|ubuntu2404|ubuntu2604|el8|el9|el10|sles15|sles16
#                      [--version V] [--release N] [--out dist/]
#                      [--wheelhouse DIR] [--offline] [--no-hub]
# Needs dpkg-deb (deb targets) or rpmbuild (rpm targets) and a Python >= 3.11 with pip (the repo's .venv when it
# exists). The first build of a target downloads its wheels from PyPI into the wheelhouse; later ones are offline.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
python="${GPUGUARD_BUILD_PYTHON:-}"
if [ -z "$python" ]; then
  if [ -x "$here/../.venv/bin/python" ]; then python="$here/../.venv/bin/python"; else python=python3; fi
fi
exec "$python" "$here/build.py" "$@"
