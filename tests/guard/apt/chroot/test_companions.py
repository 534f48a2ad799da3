"""Fabric manager against the NVIDIA driver under real apt and dpkg: NVIDIA's fabric manager package does not depend
on the driver's exact build, so apt upgrades the driver alone; the hook refuses it, the rollback watcher undoes a
``dpkg -i`` of a fabric manager that is not the driver's build."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, Iterator, List

import pytest

from agent.config import Settings
from agent.guard.rollback.core import GuardResult
from agent.host import Host
from tests.guard.apt.chroot.conftest import gpuguard
from tests.guard.apt.chroot.harness import BASELINE, TEST_POLICY, Chroot, FakePackage
from tests.guard.wiring import check

pytestmark = pytest.mark.timeout(900)

NV, NV_NEW = "580.95.05-0ubuntu0.24.04.2", "580.105.08-0ubuntu0.24.04.1"
FM, FM_NEW = "580.95.05-1", "580.105.08-1"  # nvidia-fabricmanager-580 and libnvidia-nscq-580 from NVIDIA's repository


def _packages(arch: str) -> List[FakePackage]:
    """Two driver builds with Ubuntu's ``=`` dependencies, and fabric manager and NSCQ at both builds with none on
    the driver (as NVIDIA ships them)."""
    out: List[FakePackage] = []
    for nv, fm in ((NV, FM), (NV_NEW, FM_NEW)):
        out += [
            FakePackage("libnvidia-compute-580", nv, arch),
            FakePackage("nvidia-utils-580", nv, arch, "libnvidia-compute-580"),
            FakePackage("nvidia-driver-580-open", nv, arch,
                        f"libnvidia-compute-580 (= {nv}), nvidia-utils-580 (= {nv})"),
            FakePackage("libnvidia-nscq-580", fm, arch),
            FakePackage("nvidia-fabricmanager-580", fm, arch),
        ]
    return out


STACK = {"libnvidia-compute-580": NV, "nvidia-utils-580": NV, "nvidia-driver-580-open": NV,
         "libnvidia-nscq-580": FM, "nvidia-fabricmanager-580": FM}


@pytest.fixture(scope="module")
def fm_repo(chroot_session: Chroot, tmp_path_factory: pytest.TempPathFactory) -> Iterator[List[Path]]:
    with chroot_session.packages_in_repo(_packages(chroot_session.native_arch),
                                         tmp_path_factory.mktemp("fm-debs")) as debs:
        yield debs


def _versions(chroot: Chroot) -> Dict[str, str]:
    return {name: version for name, version in chroot.present().items() if name in {*STACK, *BASELINE}}


def _rollback(chroot: Chroot) -> GuardResult:
    return check(Host.for_root(str(chroot.root)), Settings(), snapshot=lambda host: None)


@pytest.fixture
def stack(chroot: Chroot, fm_repo: List[Path]) -> Iterator[Chroot]:
    """The baseline plus the driver, fabric manager and NSCQ at 580.95.05 under [companions] (action rollback),
    recorded known-good."""
    policy = TEST_POLICY + '\n[companions]\naction = "rollback"\n'
    (chroot.root / "etc/gpuguard/policy.d/10-test.toml").write_text(policy)
    code, out = gpuguard(chroot, "policy", "compile")
    assert code == 0, out
    installed = chroot.apt("install", *(f"{n}={v}" for n, v in STACK.items()))
    assert installed.returncode == 0, installed.stdout + installed.stderr
    recorded = _rollback(chroot)
    assert recorded.status == "recorded", recorded.summary()
    yield chroot
    chroot.run("dpkg", "--purge", "--force-depends", *sorted(STACK), check=True)


def test_driver_upgrade_leaving_fabric_manager_behind_is_refused(stack: Chroot) -> None:
    """apt upgrades the three driver packages to 580.105.08 and leaves fabric manager at 580.95.05 (nothing in
    apt's dependencies stops it): the hook refuses, naming both builds, and nothing changes."""
    plan = stack.apt("install", "-s", "--only-upgrade", f"nvidia-driver-580-open={NV_NEW}",
                     f"libnvidia-compute-580={NV_NEW}", f"nvidia-utils-580={NV_NEW}", hook=False)
    assert "Inst nvidia-driver-580-open" in plan.stdout and "nvidia-fabricmanager" not in plan.stdout, plan.stdout
    result = stack.apt("install", "--only-upgrade", f"nvidia-driver-580-open={NV_NEW}",
                       f"libnvidia-compute-580={NV_NEW}", f"nvidia-utils-580={NV_NEW}")
    out = result.stdout + result.stderr
    assert result.returncode != 0, out
    assert "REFUSED (companion.fabricmanager)" in out, out
    assert "nvidia-fabricmanager-580 580.95.05 needs driver 580.95.05; the transaction leaves driver 580.105.08" in out
    assert _versions(stack) == {**STACK, **BASELINE}


def test_driver_and_fabric_manager_upgraded_together_pass(stack: Chroot) -> None:
    """The same upgrade with fabric manager and NSCQ at the new build goes through."""
    result = stack.apt("install", *(f"{n}={NV_NEW if v == NV else FM_NEW}" for n, v in STACK.items()))
    assert result.returncode == 0, result.stdout + result.stderr
    assert _versions(stack) == {**BASELINE, **{n: NV_NEW if v == NV else FM_NEW for n, v in STACK.items()}}


def test_fabric_manager_forced_past_the_driver_is_rolled_back(stack: Chroot) -> None:
    """``dpkg -i`` of fabric manager 580.105.08 (past the hook) is rolled back to the driver's build by the
    rollback watcher, and the known-good set keeps 580.95.05."""
    deb = next(p for p in _packages(stack.native_arch) if (p.name, p.version) == ("nvidia-fabricmanager-580", FM_NEW))
    forced = stack.run("dpkg", "-i", f"/srv/repo/pool/{deb.file_name}")
    assert forced.returncode == 0, forced.stderr
    result = _rollback(stack)
    assert result.status == "rolled_back", result.summary()
    assert {v.rule for v in result.violations} == {"companion.fabricmanager"}
    assert _versions(stack) == {**STACK, **BASELINE}
    known_good = json.loads((stack.state_dir / "known-good.json").read_text())["packages"]
    assert known_good["nvidia-fabricmanager-580"]["version"] == FM
