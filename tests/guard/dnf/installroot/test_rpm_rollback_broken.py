"""Rollback on an rpm host after ``rpm -U --force --nodeps`` left dependencies broken (the driver without its firmware),
also when only gpuguard's kept .rpm files still have the old builds; exact builds and a clean rpm database after."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator, List

import pytest

from tests.guard.dnf.installroot.harness import ROCM_62, FakeRpm, Installroot, build_rpm, index_repo
from tests.guard.dnf.installroot.rollback_support import drop_from_repo, events, restore_repo
from tests.guard.dnf.installroot.test_rpm_rollback import _check, rpm_baseline  # noqa: F401 - the fixture

pytestmark = pytest.mark.timeout(300)

FIRMWARE = "amdgpu-dkms-firmware"
DRIVER_62 = "1:6.8.5.60202-2041575.el9_4"  # AMD's el9.4 builds: the driver needs its firmware at the same EVR
DRIVER_63 = "1:6.10.5.60300-2084815.el9_4"
EXTRA = [FakeRpm(FIRMWARE, DRIVER_62), FakeRpm(FIRMWARE, DRIVER_63),
         FakeRpm("amdgpu-dkms", DRIVER_62, requires=f"{FIRMWARE} = {DRIVER_62}"),
         FakeRpm("amdgpu-dkms", DRIVER_63, requires=f"{FIRMWARE} = {DRIVER_63}")]


def _path(root: Installroot, name: str, evr: str) -> str:
    return str(root.repo_dir / next(p.file_name for p in EXTRA if p.name == name and p.evr == evr))


@pytest.fixture
def root(installroot_session: Installroot, rpm_baseline: Path, tmp_path: Path) -> Iterator[Installroot]:  # noqa: F811
    """The baseline installroot with the firmware-dependent driver builds added to the repository for one test."""
    from tests.guard.dnf.installroot.harness import TEST_POLICY

    r = installroot_session
    r.restore(rpm_baseline)
    r.write_plugin_conf()
    r.install_gpuguard(TEST_POLICY)
    built: List[Path] = [build_rpm(p, r.repo_dir, r.work) for p in EXTRA]
    _reindex(r)
    try:
        yield r
    finally:
        restore_repo(r, tmp_path / "dropped")
        for path in built:
            path.unlink(missing_ok=True)
        _reindex(r)


def _reindex(root: Installroot) -> None:
    """Index the repository and drop dnf's metadata cache: createrepo_c's revision is a time in seconds, and two
    indexes within one second looked unchanged to dnf, which kept the old package list."""
    index_repo(root.repo_dir, root.work)
    root.dnf("clean", "metadata", plugin=False, check=True)


def _firmware_baseline(root: Installroot) -> List[str]:
    moved = root.dnf("install", f"amdgpu-dkms-{DRIVER_62.split(':', 1)[1]}", plugin=True)
    assert moved.returncode == 0, moved.stderr
    installed = root.installed()
    assert (installed["amdgpu-dkms"], installed[FIRMWARE], installed["rocm-core"]) == (DRIVER_62, DRIVER_62, ROCM_62)
    assert _check(root).status == "recorded"
    known_good = json.loads((root.state_dir / "known-good.json").read_text())["packages"]
    assert known_good["amdgpu-dkms"]["version"] == DRIVER_62 and known_good["amdgpu-dkms"]["rpm"]
    return root.nevras()


def _assert_clean(root: Installroot) -> None:
    verify = root.rpm("-Va", "--nofiles", "--nodigest", "--nosignature")
    assert verify.returncode == 0 and not verify.stdout.strip(), verify.stdout


def _force_driver_alone(root: Installroot) -> None:
    forced = root.rpm("-U", "--force", "--nodeps", _path(root, "amdgpu-dkms", DRIVER_63))
    assert forced.returncode == 0, forced.stderr
    assert root.installed()["amdgpu-dkms"] == DRIVER_63
    assert root.rpm("-Va", "--nofiles", "--nodigest", "--nosignature").returncode != 0  # firmware now unmet


def _assert_rolled_back(root: Installroot, before: List[str]) -> None:
    result = _check(root)
    assert result.status == "rolled_back", result.summary()
    assert root.nevras() == before
    _assert_clean(root)
    assert not (root.state_dir / "rollback-authorization.json").exists()
    rollback = [e for e in events(root) if e["kind"] == "rollback"][-1]
    assert rollback["succeeded"] is True and rollback["to_versions"] == {"amdgpu-dkms": DRIVER_62}
    assert "via dnf shell" in rollback["detail"]
    assert _check(root).status == "compliant"


def test_driver_forced_without_its_firmware_is_rolled_back(root: Installroot) -> None:
    """rpm -U --force --nodeps of the newer driver alone: one dnf transaction restores the exact builds."""
    before = _firmware_baseline(root)
    _force_driver_alone(root)
    _assert_rolled_back(root, before)


def test_driver_forced_without_firmware_is_rolled_back_from_the_kept_rpms(root: Installroot, tmp_path: Path) -> None:
    """The repository dropped the known-good driver and firmware: gpuguard's kept .rpm files restore them."""
    before = _firmware_baseline(root)
    for name in ("amdgpu-dkms", FIRMWARE):
        drop_from_repo(root, Path(_path(root, name, DRIVER_62)).name, tmp_path / "dropped")
    root.dnf("clean", "metadata", plugin=False, check=True)
    _force_driver_alone(root)
    _assert_rolled_back(root, before)


def test_frozen_package_forced_is_rolled_back_through_the_gpuguard_dnf_plugin(root: Installroot) -> None:
    """rocm-core is [frozen]; driver and ROCm 6.3 forced together (an allowed pairing): the dnf plugin's checker lets
    exactly the rollback to the known-good set through on the one-shot authorization, audited, and still refuses
    the same move to anyone else."""
    from tests.guard.dnf.installroot.conftest import compile_policy
    from tests.guard.dnf.installroot.harness import AMDGPU_62, AMDGPU_63, ROCM_63, TEST_POLICY

    root.install_gpuguard(TEST_POLICY + '\n[frozen]\npackages = ["rocm-core"]\naction = "rollback"\n')
    compile_policy(root)
    before = root.nevras()
    forced = root.rpm("-U", "--force", "--nodeps", root.rpm_path("amdgpu-dkms", AMDGPU_63),
                      root.rpm_path("rocm-core", ROCM_63))
    assert forced.returncode == 0, forced.stderr
    result = _check(root)
    assert result.status == "rolled_back", result.summary()
    assert {v.rule for v in result.violations} == {"frozen"}
    assert root.nevras() == before
    _assert_clean(root)
    assert not (root.state_dir / "rollback-authorization.json").exists()
    audit = [json.loads(line) for line in (root.state_dir / "audit.log").read_text().splitlines()]
    granted = [a for a in audit if a["event"] == "rollback_authorized"]
    assert granted and granted[-1]["tool"] == "dnf" and granted[-1]["target"]["rocm-core"] == ROCM_62
    assert granted[-1]["target"]["amdgpu-dkms"] == AMDGPU_62
    refused = root.dnf("install", f"rocm-core-{ROCM_63}", f"amdgpu-dkms-{AMDGPU_63.split(':', 1)[1]}")
    assert refused.returncode != 0 and "REFUSED (frozen)" in refused.stderr + refused.stdout
