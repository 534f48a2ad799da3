"""The NVIDIA stack as Ubuntu 24.04 and NVIDIA's CUDA repository ship it, under real apt and dpkg: every driver part
and every CUDA release is judged by the hook, the rollback watcher and the pins; a mixed AMD + NVIDIA host."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Dict, Iterator, List

import pytest

from agent.config import Settings
from agent.guard.rollback.core import GuardResult
from agent.host import Host
from tests.guard.apt.chroot.conftest import gpuguard
from tests.guard.apt.chroot.harness import BASELINE, ROCM_62, ROCM_63, TEST_POLICY, Chroot, FakePackage
from tests.guard.wiring import check

pytestmark = pytest.mark.timeout(900)

NV, NV_NEW = "580.95.05-0ubuntu0.24.04.2", "580.105.08-0ubuntu0.24.04.1"
CD, CD_NEW = "580.95.05-1", "580.105.08-1"  # cuda-drivers from NVIDIA's repository
CTK, CTK_NEW = "1.17.8-1", "1.18.0-1"


def _nvidia_packages(arch: str) -> List[FakePackage]:
    """One exact build per driver release with ``=`` dependencies, CUDA 13.0 and 13.1 with the cuda-toolkit-13
    meta, the container toolkit and its libraries, and a versioned side-by-side ROCm."""
    out: List[FakePackage] = []
    for nv, cd in ((NV, CD), (NV_NEW, CD_NEW)):
        out += [
            FakePackage("nvidia-kernel-common-580", nv, arch),
            FakePackage("nvidia-dkms-580-open", nv, arch, f"nvidia-kernel-common-580 (= {nv})"),
            FakePackage("libnvidia-compute-580", nv, arch),
            FakePackage("nvidia-utils-580", nv, arch, "libnvidia-compute-580"),
            FakePackage("nvidia-driver-580-open", nv, arch,
                        f"nvidia-dkms-580-open (= {nv}), nvidia-kernel-common-580 (= {nv}), "
                        f"libnvidia-compute-580 (= {nv}), nvidia-utils-580 (= {nv})"),
            FakePackage("cuda-drivers-580", cd, arch, f"nvidia-driver-580-open (= {nv})"),
            FakePackage("cuda-drivers", cd, arch, f"cuda-drivers-580 (= {cd})"),
        ]
    for ctk in (CTK, CTK_NEW):
        out += [
            FakePackage("libnvidia-container1", ctk, arch),
            FakePackage("libnvidia-container-tools", ctk, arch, f"libnvidia-container1 (>= {ctk})"),
            FakePackage("nvidia-container-toolkit-base", ctk, arch),
            FakePackage("nvidia-container-toolkit", ctk, arch,
                        f"nvidia-container-toolkit-base (= {ctk}), libnvidia-container-tools (>= {ctk})"),
        ]
    out += [
        FakePackage("cuda-toolkit-13-0", "13.0.2-1", arch),
        FakePackage("cuda-toolkit-13-1", "13.1.0-1", arch),
        FakePackage("cuda-toolkit-13", "13.0.2-1", arch, "cuda-toolkit-13-0 (>= 13.0.2)"),
        FakePackage("cuda-toolkit-13", "13.1.0-1", arch, "cuda-toolkit-13-1 (>= 13.1.0)"),
        FakePackage("rocm-core6.3.0", ROCM_63, arch),
    ]
    return out


STACK = {"nvidia-kernel-common-580": NV, "nvidia-dkms-580-open": NV, "libnvidia-compute-580": NV,
         "nvidia-utils-580": NV, "nvidia-driver-580-open": NV, "cuda-drivers-580": CD, "cuda-drivers": CD,
         "cuda-toolkit-13-0": "13.0.2-1", "cuda-toolkit-13": "13.0.2-1", "nvidia-container-toolkit": CTK,
         "nvidia-container-toolkit-base": CTK, "libnvidia-container1": CTK, "libnvidia-container-tools": CTK}
WATCHED = set(STACK) | {"cuda-toolkit-13-1", "rocm-core6.3.0", *BASELINE}

NVIDIA_POLICY = """
[nvidia]
action = "rollback"

[[nvidia.pairing]]
name = "r580-cuda13.0"
driver = "580.95.05"
cuda = "13.0.*"

[[versions]]
name = "container-toolkit"
packages = ["nvidia-container-toolkit*", "libnvidia-container*"]
allow = ">= 1.17.3, << 1.18"
"""


@pytest.fixture(scope="module")
def nvidia_repo(chroot_session: Chroot, tmp_path_factory: pytest.TempPathFactory) -> Iterator[List[Path]]:
    """The NVIDIA packages added to the session repository for this module, and taken out again after it."""
    packages = _nvidia_packages(chroot_session.native_arch)
    with chroot_session.packages_in_repo(packages, tmp_path_factory.mktemp("nvidia-debs")) as debs:
        yield debs


def _deb(chroot: Chroot, name: str, version: str) -> str:
    for pkg in _nvidia_packages(chroot.native_arch):
        if (pkg.name, pkg.version) == (name, version):
            return f"/srv/repo/pool/{pkg.file_name}"
    raise KeyError((name, version))


def _versions(chroot: Chroot) -> Dict[str, str]:
    """Every watched package dpkg has in any present state (a half-installed one counts)."""
    out = chroot.run("dpkg-query", "-W", "-f", "${Package} ${Version} ${db:Status-Abbrev}\n", check=True).stdout
    rows = [line.split() for line in out.splitlines()]
    return {r[0]: r[1] for r in rows if len(r) >= 3 and r[2][1] not in "nc" and r[0] in WATCHED}


def _rollback(chroot: Chroot) -> GuardResult:
    return check(Host.for_root(str(chroot.root)), Settings(), snapshot=lambda host: None)


def _assert_clean(chroot: Chroot) -> None:
    audit = chroot.run("dpkg", "--audit")
    assert audit.returncode == 0 and not audit.stdout.strip(), audit.stdout
    check = chroot.run("apt-get", "-o", "Dir::Cache::pkgcache=", "-o", "Dir::Cache::srcpkgcache=", "check")
    assert check.returncode == 0, check.stdout + check.stderr


@pytest.fixture
def stack(chroot: Chroot, nvidia_repo: List[Path]) -> Iterator[Chroot]:
    """The AMD baseline plus the whole NVIDIA stack at 580.95.05 with CUDA 13.0, installed through apt under the
    mixed policy and recorded as known-good; every NVIDIA package is purged again afterwards."""
    (chroot.root / "etc/gpuguard/policy.d/10-test.toml").write_text(TEST_POLICY + NVIDIA_POLICY)
    code, out = gpuguard(chroot, "policy", "compile")
    assert code == 0, out
    installed = chroot.apt("install", *(f"{n}={v}" for n, v in STACK.items()))
    assert installed.returncode == 0, installed.stdout + installed.stderr
    assert _versions(chroot) == {**STACK, **BASELINE}
    recorded = _rollback(chroot)
    assert recorded.status == "recorded", recorded.summary()
    yield chroot
    names = sorted({p.name for p in _nvidia_packages(chroot.native_arch)})
    chroot.run("dpkg", "--purge", "--force-depends", *names, check=True)


def _refused(chroot: Chroot, *args: str) -> str:
    result = chroot.apt(*args)
    assert result.returncode != 0, result.stdout + result.stderr
    assert _versions(chroot) == {**STACK, **BASELINE}  # nothing moved
    _assert_clean(chroot)
    return result.stdout + result.stderr


def test_library_upgraded_alone_is_refused(stack: Chroot) -> None:
    """The archive offers the newer libnvidia-compute before the rest of its build (a phased update): `apt-get
    install --only-upgrade libnvidia-compute-580` would remove the driver meta and cuda-drivers to do it, and the
    library would run ahead of the kernel module, NVML's 'Driver/library version mismatch'."""
    for pkg in _nvidia_packages(stack.native_arch):
        if pkg.version in (NV_NEW, CD_NEW) and pkg.name != "libnvidia-compute-580":
            shutil.move(str(stack.pool / pkg.file_name), str(stack.attic / pkg.file_name))
    stack.index_repo()
    plan = stack.apt("install", "-s", "--only-upgrade", "libnvidia-compute-580", hook=False)
    assert "Remv nvidia-driver-580-open" in plan.stdout and "Remv cuda-drivers " in plan.stdout, plan.stdout
    out = _refused(stack, "install", "--only-upgrade", "libnvidia-compute-580")
    assert "REFUSED (nvidia.driver_parts)" in out and "580.105.08 (libnvidia-compute-580)" in out, out
    assert "REFUSED (nvidia.driver_removed)" in out, out


def test_the_whole_driver_moving_together_is_judged_by_the_pairing(stack: Chroot) -> None:
    """Upgrading every part at once keeps them one build: only the pairing (pinned to 580.95.05) refuses it."""
    out = _refused(stack, "install", "--only-upgrade", f"libnvidia-compute-580={NV_NEW}")
    assert "REFUSED (nvidia.pairing)" in out and "nvidia.driver_parts" not in out, out


def test_a_second_cuda_release_is_refused(stack: Chroot) -> None:
    """cuda-toolkit-13-1 beside 13.0 under a cuda = "13.0.*" pairing."""
    out = _refused(stack, "install", "cuda-toolkit-13-1")
    assert "REFUSED (nvidia.pairing)" in out and "13.1.0 (cuda-toolkit-13-1)" in out, out


def test_the_cuda_meta_pulling_the_next_release_is_refused(stack: Chroot) -> None:
    """Real apt: a CUDA meta package that pulls the next CUDA release is refused by the NVIDIA pairing."""
    out = _refused(stack, "install", "cuda-toolkit-13=13.1.0-1")
    assert "REFUSED (nvidia.pairing)" in out and "cuda-toolkit-13-1" in out, out


@pytest.mark.parametrize("package", ["nvidia-driver-580-open", "nvidia-dkms-580-open"])
def test_removing_one_driver_part_is_refused(stack: Chroot, package: str) -> None:
    """apt-get remove of the driver meta, or of the dkms module (apt takes the meta and cuda-drivers with it)."""
    out = _refused(stack, "remove", package)
    assert "REFUSED (nvidia.driver_removed)" in out and "leaves the NVIDIA driver 580.95.05 incomplete" in out, out


def test_container_toolkit_libraries_past_their_rule_are_refused(stack: Chroot) -> None:
    """Real apt: container toolkit libraries past their versions rule are refused by that rule."""
    out = _refused(stack, "install", f"libnvidia-container1={CTK_NEW}", f"libnvidia-container-tools={CTK_NEW}")
    assert "REFUSED (versions.container-toolkit)" in out, out


def test_mixed_host_is_judged_on_both_sides(stack: Chroot) -> None:
    """ROCm 6.3 under the 6.2 driver and CUDA 13.1 in one transaction: both pairings are named."""
    out = _refused(stack, "install", f"rocm-core={ROCM_63}", f"rocm-hip-runtime={ROCM_63}", "cuda-toolkit-13-1")
    assert "REFUSED (amd.pairing)" in out and "REFUSED (nvidia.pairing)" in out, out


def test_versioned_side_by_side_rocm_is_refused(stack: Chroot) -> None:
    """`apt install rocm-core6.3.0` (AMD's multi-version layout) beside ROCm 6.2 under the 6.2 driver."""
    out = _refused(stack, "install", "rocm-core6.3.0")
    assert "REFUSED (amd.pairing)" in out and "rocm-core6.3.0" in out, out
    assert ROCM_62 in out


def test_forced_library_alone_is_rolled_back_not_recorded(stack: Chroot) -> None:
    """dpkg -i --force-depends of only the newer libnvidia-compute: a rollback to the exact known-good build, never
    a 'compliant change' recorded over it."""
    forced = stack.run("dpkg", "-i", "--force-depends", _deb(stack, "libnvidia-compute-580", NV_NEW))
    assert forced.returncode == 0, forced.stderr
    assert stack.run("apt-get", "-o", "Dir::Cache::pkgcache=", "check").returncode != 0
    result = _rollback(stack)
    assert result.status == "rolled_back", result.summary()
    assert {v.rule for v in result.violations} >= {"nvidia.driver_parts", "nvidia.pairing"}
    assert _versions(stack) == {**STACK, **BASELINE}
    _assert_clean(stack)
    known_good = json.loads((stack.state_dir / "known-good.json").read_text())["packages"]
    assert known_good["libnvidia-compute-580"]["version"] == NV
    assert _rollback(stack).status == "compliant"


def test_pinned_host_upgrades_cleanly_and_moves_nothing_guarded(stack: Chroot) -> None:
    """After `gpuguard pin apply`, a routine `apt-get upgrade` and `full-upgrade` (newer driver build, CUDA meta,
    toolkit 1.18 all offered) exit 0 and leave every NVIDIA package where it was. The policy is the NVIDIA one
    alone; the AMD side of the same check is test_amd_pins.py."""
    (stack.root / "etc/gpuguard/policy.d/10-test.toml").write_text('[policy]\nname = "nvidia"\n' + NVIDIA_POLICY)
    code, out = gpuguard(stack, "policy", "compile")
    assert code == 0, out
    unpinned = stack.apt("upgrade")
    assert unpinned.returncode != 0 and "REFUSED" in unpinned.stdout + unpinned.stderr  # the guard alone refuses
    code, out = gpuguard(stack, "pin", "apply")
    assert code == 0, out
    for command in ("upgrade", "full-upgrade"):
        upgraded = stack.apt(command)
        assert upgraded.returncode == 0, upgraded.stdout + upgraded.stderr
        assert {k: v for k, v in _versions(stack).items() if k in STACK} == STACK, command
    _assert_clean(stack)
