"""The debian13 .deb in a real Debian 13 (trixie) debootstrap chroot: installed with apt, run on Python 3.13, and
its installed apt hook judging real apt transactions of fake AMD and NVIDIA packages.

The chroot is the guard tests' harness (tests/guard/apt/chroot/harness.py) with a trixie base (cached as a
tarball outside CI); proc and devpts are mounted and always unmounted. No systemd runs there.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Callable, Dict, Iterator

import pytest

from tests.guard.apt.chroot.harness import (
    AMDGPU_62,
    AMDGPU_63,
    BASELINE,
    ROCM_62,
    ROCM_63,
    TEST_POLICY,
    Chroot,
)
from tests.guard.apt.chroot.test_nvidia_stack import NVIDIA_POLICY, STACK, _nvidia_packages
from tests.packaging.chroots import ok, packaging_chroot, refused

pytestmark = [pytest.mark.chroot, pytest.mark.timeout(900)]

@pytest.fixture(scope="module")
def trixie(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Chroot]:
    with packaging_chroot(tmp_path_factory, "trixie", suite="trixie", download=("procps",),
                          packages=_nvidia_packages) as chroot:
        yield chroot


def test_debian13_deb_installs_runs_on_python313_and_guards(trixie: Chroot,
                                                            built: Callable[[str], Dict[str, Path]]) -> None:
    """apt installs the debian13 .deb on trixie; the CLI runs on 3.13; the hook refuses a mispaired amdgpu/ROCm and
    a mispaired driver/CUDA transaction (installed set unchanged) and allows the paired ones."""
    c = trixie
    root = c.root
    deb = built("debian13")["gpuguard"]
    (root / "srv/pkgs").mkdir(parents=True, exist_ok=True)
    shutil.copy2(deb, root / "srv/pkgs" / deb.name)
    assert ok(c.run("python3", "-c", "import sys; print('%d.%d' % sys.version_info[:2])")).strip() == "3.13"

    out = ok(c.apt("install", f"/srv/pkgs/{deb.name}"))
    assert "gpuguard: warning" not in out, out
    assert list((root / "usr/lib/gpuguard/agent").glob("__pycache__/cli.cpython-313.pyc")), "postinst compiled nothing"
    result = c.run("gpuguard", "snapshot", "--json")
    ok(result)
    snap = json.loads(result.stdout)
    assert snap["os"]["data"]["id"] == "debian" and snap["os"]["data"]["version_id"] == "13"

    (root / "etc/gpuguard/policy.d/10-test.toml").write_text(TEST_POLICY + NVIDIA_POLICY)
    ok(c.run("gpuguard", "policy", "compile"))
    ok(c.apt("install", *(f"{n}={v}" for n, v in {**BASELINE, **STACK}.items())))  # the paired baseline
    installed = c.installed()

    out = refused(c, "install", f"rocm-core={ROCM_63}", f"rocm-hip-runtime={ROCM_63}")
    assert "REFUSED (amd.pairing)" in out, out
    out = refused(c, "install", "cuda-toolkit-13-1")
    assert "REFUSED (nvidia.pairing)" in out and "13.1.0 (cuda-toolkit-13-1)" in out, out
    assert c.installed() == installed

    ok(c.apt("install", f"amdgpu-dkms={AMDGPU_63}", f"rocm-core={ROCM_63}", f"rocm-hip-runtime={ROCM_63}"))
    assert c.installed()["rocm-core"] == ROCM_63 and c.installed()["amdgpu-dkms"] == AMDGPU_63
    ok(c.apt("install", "--allow-downgrades", f"amdgpu-dkms={AMDGPU_62}", f"rocm-core={ROCM_62}",
             f"rocm-hip-runtime={ROCM_62}"))
    assert c.installed()["rocm-core"] == ROCM_62
