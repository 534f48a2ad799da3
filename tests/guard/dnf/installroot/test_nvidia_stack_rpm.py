"""The NVIDIA stack as NVIDIA's RHEL 9 repository ships it (nvidia-driver, -libs, -cuda, -cuda-libs,
kmod-nvidia-open-dkms, nvidia-kmod-common at one build with epoch 3 and ``=`` requires, cuda-drivers, CUDA 13.0 and
13.1) under real dnf4 and rpm: every driver part and CUDA release is judged by the plugin and the rollback."""

from __future__ import annotations

import shutil
from typing import Dict, Iterator, List

import pytest

from agent.config import Settings
from tests import needs
from tests.guard.dnf.installroot.conftest import compile_policy
from tests.guard.dnf.installroot.harness import FakeRpm, Installroot, build_repo, install_specs, missing_tools
from tests.guard.dnf.installroot.rollback_support import backend_for_root
from tests.guard.wiring import check

pytestmark = pytest.mark.timeout(600)

NV, NV_NEW = "3:580.95.05-1.el9", "3:580.105.08-1.el9"
PARTS = ("nvidia-kmod-common", "kmod-nvidia-open-dkms", "nvidia-driver-libs", "nvidia-driver-cuda-libs",
         "nvidia-driver-cuda", "nvidia-driver", "cuda-drivers")
CUDA = {"cuda-toolkit-13-0": "13.0.2-1", "cuda-toolkit-13-1": "13.1.0-1"}
# The NVIDIA section (tests/packaging/test_el10_dnf.py appends it to the installroot harness's TEST_POLICY).
NVIDIA_POLICY = """
[nvidia]
action = "rollback"
[[nvidia.pairing]]
name = "r580-cuda13.0"
driver = "580.95.05"
cuda = "13.0.*"
"""
POLICY = """\
[policy]
name = "rhel9-nvidia"
""" + NVIDIA_POLICY


def driver_rpms(evr: str) -> List[FakeRpm]:
    """The driver's parts at one build EVR, with the ``=`` requires of NVIDIA's repository."""
    plain = evr.split(":", 1)[1]
    return [
        FakeRpm("nvidia-kmod-common", evr),
        FakeRpm("kmod-nvidia-open-dkms", evr, "x86_64", provides=f"nvidia-kmod = {evr}",
                requires=f"nvidia-kmod-common = {evr}"),
        FakeRpm("nvidia-driver-libs", evr, "x86_64"),
        FakeRpm("nvidia-driver-cuda-libs", evr, "x86_64"),
        FakeRpm("nvidia-driver-cuda", evr, "x86_64", requires=f"nvidia-driver-cuda-libs = {evr}"),
        FakeRpm("nvidia-driver", evr, "x86_64",
                requires=f"nvidia-kmod = {evr}, nvidia-driver-libs = {evr}, nvidia-kmod-common = {evr}"),
        FakeRpm("cuda-drivers", plain.replace(".el9", ""), "x86_64",
                requires=f"nvidia-driver = {evr}, nvidia-driver-cuda = {evr}"),
    ]


def cuda_rpms() -> List[FakeRpm]:
    """The two CUDA toolkit releases of CUDA."""
    return [FakeRpm(n, v, "x86_64") for n, v in CUDA.items()]


# The NVIDIA stack installed before each test: the r580 driver with CUDA 13.0.
NVIDIA_BASELINE = {**{p.name: p.evr for p in driver_rpms(NV)}, "cuda-toolkit-13-0": CUDA["cuda-toolkit-13-0"]}


@pytest.fixture(scope="module")
def session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Installroot]:
    missing = missing_tools()
    if missing:
        needs.unavailable("installroot tests", f"missing: {', '.join(missing)}")
    base = tmp_path_factory.mktemp("rhel9-nvidia")
    packages = [*driver_rpms(NV), *driver_rpms(NV_NEW), *cuda_rpms()]
    repo = build_repo(base / "repo", base / "rpmbuild", packages)
    root = Installroot(base / "root", repo, base / "work")
    root.install_gpuguard(POLICY)
    compile_policy(root)
    root.dnf("install", *install_specs(NVIDIA_BASELINE), plugin=False, check=True)
    result = _check(root)
    assert result.status == "recorded", result.summary()
    root.save(base / "baseline")
    try:
        yield root
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def root(session: Installroot) -> Installroot:
    session.restore(session.root.parent / "baseline")
    session.write_plugin_conf()
    return session


def _check(root: Installroot):
    backend = backend_for_root(root)
    return check(backend.host, Settings(), backend=backend, snapshot=lambda host: None)


def _versions(root: Installroot) -> Dict[str, str]:
    return {k: v for k, v in root.installed().items() if k in NVIDIA_BASELINE or k in CUDA}


def _clean(root: Installroot) -> None:
    verify = root.rpm("-Va", "--nofiles", "--nodigest", "--nosignature")
    assert verify.returncode == 0 and not verify.stdout.strip(), verify.stdout + verify.stderr


def _refused(root: Installroot, *args: str) -> str:
    before = root.rpmdb_bytes()
    result = root.dnf(*args)
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.stderr.startswith("Error: gpuguard: REFUSED ("), result.stderr
    assert _versions(root) == NVIDIA_BASELINE and root.rpmdb_bytes() == before
    return result.stderr


def test_a_second_cuda_release_is_refused(root: Installroot) -> None:
    """Real dnf: installing a second CUDA release is refused by the NVIDIA pairing, naming it."""
    out = _refused(root, "install", "cuda-toolkit-13-1")
    assert "REFUSED (nvidia.pairing)" in out and "13.1.0 (cuda-toolkit-13-1)" in out, out


def test_removing_the_kernel_module_is_refused(root: Installroot) -> None:
    """dnf remove kmod-nvidia-open-dkms takes nvidia-driver and cuda-drivers with it; the libraries would stay."""
    out = _refused(root, "remove", "kmod-nvidia-open-dkms")
    assert "REFUSED (nvidia.driver_removed)" in out and "leaves the NVIDIA driver 580.95.05 incomplete" in out, out


def test_the_whole_driver_moving_is_judged_by_the_pairing(root: Installroot) -> None:
    """Real dnf: moving the whole NVIDIA driver is judged by the pairing, not as driver parts out of step."""
    out = _refused(root, "upgrade", "nvidia-driver", "cuda-drivers")
    assert "REFUSED (nvidia.pairing)" in out and "nvidia.driver_parts" not in out, out


def test_forced_library_alone_is_rolled_back_not_recorded(root: Installroot) -> None:
    """rpm -U --nodeps of only the newer nvidia-driver-libs: rolled back to the exact build, rpm database clean."""
    newer = next(p for p in driver_rpms(NV_NEW) if p.name == "nvidia-driver-libs")
    forced = root.rpm("-U", "--nodeps", str(root.repo_dir / newer.file_name))
    assert forced.returncode == 0, forced.stderr
    assert root.rpm("-Va", "--nofiles", "--nodigest", "--nosignature").returncode != 0  # = requires now unmet
    result = _check(root)
    assert result.status == "rolled_back", result.summary()
    assert {v.rule for v in result.violations} >= {"nvidia.driver_parts", "nvidia.pairing"}
    assert _versions(root) == NVIDIA_BASELINE
    _clean(root)
    assert _check(root).status == "compliant"
