"""One SLES-like overlay host per module for the real zypper tests, reset to its baseline before each test.

The zypper guard installed on the host is the one the sles15 .rpm ships (built once per module with
packaging/build.sh). Locally the tests are skipped (with the reason) when libzypp, rpm, rpmbuild, createrepo_c,
rpm2cpio, cpio, gcc, librpm's headers or root are missing; in CI (CI=true) that fails the run instead
(tests/needs.py).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Iterator

import pytest

from tests import needs
from tests.guard.dnf.installroot.harness import FakeRpm, build_repo
from tests.guard.zypper.harness import ZypperHost, missing_tools, unpacked_sles_package, zypper_debs

AMDGPU_62, AMDGPU_63 = "1:6.8.5.60202-2041575.sles15", "1:6.10.5.60300-2084815.sles15"
ROCM_62, ROCM_63 = "6.2.2.60202-116.sles15", "6.3.0.60300-39.sles15"
# NVIDIA's SLES 15 repository: the signed open kernel module package (KMP) carries the kernel it was built for.
KMP = "nvidia-open-driver-G06-signed-kmp-default"
NV, NV_NEW = "580.95.05", "580.105.08"
KMP_RELEASE = "_k6.4.0_150700.53.3-1.1"
CUDA_130, CUDA_131 = "13.0.2-1", "13.1.0-1"
HELLO_10, HELLO_11 = "1.0-1", "1.1-1"

POLICY = """\
[policy]
name = "sles-test"
action = "block"

[amd]
action = "rollback"

[[amd.pairing]]
name = "rocm-6.2"
amdgpu = "6.2.*"
rocm = "6.2.*"

[[amd.pairing]]
name = "rocm-6.3"
amdgpu = "6.3.*"
rocm = "6.3.*"

[nvidia]
action = "rollback"

[[nvidia.pairing]]
name = "r580-cuda13.0"
driver = "580.95.05"
cuda = "13.0.*"
"""


def packages() -> list:
    """AMD driver/ROCm pairs, NVIDIA's G06 driver at two builds, CUDA 13.0 and 13.1, a harmless package."""
    out = [FakeRpm("amdgpu-dkms", AMDGPU_62), FakeRpm("amdgpu-dkms", AMDGPU_63),
           FakeRpm("rocm-core", ROCM_62, "x86_64"), FakeRpm("rocm-core", ROCM_63, "x86_64"),
           FakeRpm("cuda-toolkit-13-0", CUDA_130, "x86_64"), FakeRpm("cuda-toolkit-13-1", CUDA_131, "x86_64"),
           FakeRpm("hello-fake", HELLO_10), FakeRpm("hello-fake", HELLO_11)]
    for version in (NV, NV_NEW):
        out.append(FakeRpm(KMP, f"{version}{KMP_RELEASE}", "x86_64",
                           provides=f"nvidia-open-driver-G06-kmp = {version}"))
        out.append(FakeRpm("nvidia-compute-G06", f"{version}-1.1", "x86_64",
                           requires=f"nvidia-open-driver-G06-kmp = {version}"))
    return out


BASELINE = {"amdgpu-dkms": AMDGPU_62, "rocm-core": ROCM_62, KMP: f"{NV}{KMP_RELEASE}",
            "nvidia-compute-G06": f"{NV}-1.1", "cuda-toolkit-13-0": CUDA_130, "hello-fake": HELLO_10}


def spec(name: str, evr: str) -> str:
    """``name=[epoch:]version-release`` as zypper takes it."""
    return f"{name}={evr}"


@pytest.fixture(scope="module")
def zypper_session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ZypperHost]:
    missing = missing_tools()
    if missing:
        needs.unavailable("zypper guard tests", f"missing: {', '.join(missing)} (apt-get install libzypp-bin "
                                                 "rpm createrepo-c gcc librpm-dev cpio; run as root)")
    try:
        debs = zypper_debs()
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:  # no Debian mirror to fetch zypper's .debs from
        needs.unavailable("zypper guard tests", f"zypper's .debs: {exc}")
    base = tmp_path_factory.mktemp("zypper")
    repo = build_repo(base / "repo", base / "rpmbuild", packages())
    host = ZypperHost(base / "host", repo, debs)
    host.install_gpuguard(POLICY, unpacked_sles_package(base / "package"))
    host.compile_policy()
    result = host.zypper("install", *(spec(n, v) for n, v in BASELINE.items()))
    assert result.returncode == 0, result.stdout + result.stderr
    assert host.installed() == BASELINE
    host.save(base / "baseline")
    try:
        yield host
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def host(zypper_session: ZypperHost) -> ZypperHost:
    """The module's host reset to its baseline (packages, gpuguard, policy, zypp state)."""
    zypper_session.restore(zypper_session.base.parent / "baseline")
    return zypper_session


@pytest.fixture
def payload(host: ZypperHost) -> Path:
    return host.path("/usr/share/gpuguard-fake")
