"""Session sid root (tests/sidroot.py) with the real AMD and NVIDIA management libraries and no driver.

Debian's amd-smi and libamd-smi27 and non-free libnvidia-ml1 are in the root; the PyPI bindings (amdsmi 7.x and
nvidia-ml-py, this project's own dependencies, pure Python) are copied from the test environment into /opt/pypi.
Locally the suite is skipped (with the reason) when not root or without debootstrap; in CI it fails instead.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import time
from pathlib import Path
from typing import Iterator, NoReturn

import pytest

from tests import needs
from tests.sidroot import SidRoot, build_base, missing_tools

TIMINGS: dict = {}
PYPI_AMDSMI = "/opt/pypi/amdsmi"
PYPI_NVML = "/opt/pypi/nvml"
DEBIAN_ROCM_PATH = "/opt/rocm-debian"  # ROCM_PATH whose lib/libamd_smi.so is Debian's library (another release)


def _unavailable(reason: str) -> NoReturn:
    needs.unavailable("real GPU library tests", reason)


def _copy_binding(module: str, target: Path) -> None:
    spec = importlib.util.find_spec(module)  # finds without importing (amdsmi would print and raise here)
    if spec is None or spec.origin is None:
        _unavailable(f"the PyPI binding {module} is not installed in this Python (pip install -e '.[test]')")
    origin = Path(spec.origin)
    target.mkdir(parents=True, exist_ok=True)
    if origin.name == "__init__.py":
        shutil.copytree(origin.parent, target / origin.parent.name,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    else:
        shutil.copy2(origin, target / origin.name)


@pytest.fixture(scope="session")
def sid_libs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SidRoot]:
    if os.geteuid() != 0:
        _unavailable("they must run as root (debootstrap, chroot, mount)")
    missing = missing_tools()
    if missing:
        _unavailable(f"missing tools: {', '.join(missing)} (apt-get install debootstrap)")
    base = tmp_path_factory.mktemp("sidlibs")
    started = time.monotonic()
    TIMINGS.update(build_base(base / "sid", use_cache=not needs.IN_CI))
    sid = SidRoot(base / "sid")
    try:
        sid.mount()
        sid.install_agent()
        _copy_binding("amdsmi", sid.path(PYPI_AMDSMI))
        _copy_binding("pynvml", sid.path(PYPI_NVML))
        [library] = sorted(sid.path("/usr/lib").glob("*/libamd_smi.so.[0-9]*[0-9]"))[:1]
        lib_dir = sid.path(DEBIAN_ROCM_PATH) / "lib"
        lib_dir.mkdir(parents=True, exist_ok=True)
        (lib_dir / "libamd_smi.so").symlink_to("/" + str(library.relative_to(sid.root)))
        TIMINGS["setup_seconds"] = round(time.monotonic() - started, 1)
        print(f"\nsid root for the GPU libraries ready: {TIMINGS}")
        yield sid
    finally:
        sid.release(base)
