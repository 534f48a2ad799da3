"""Rollback on a dnf5 host, for real: ``gpuguard guard rollback`` (this checkout's CLI on sid's python3, inside the sid
root) restores the exact known-good builds with one ``dnf5 do`` transaction after ``rpm -U --force --nodeps``, also
when only gpuguard's kept .rpm files still have them, and through gpuguard's own dnf5 action on the one-shot
rollback authorization."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import List

import pytest

from tests.guard.dnf.dnf5.conftest import compile_policy
from tests.guard.dnf.dnf5.harness import FIRMWARE, REPO, Dnf5Root
from tests.guard.dnf.installroot.harness import AMDGPU_62, AMDGPU_63, ROCM_62, ROCM_63, TEST_POLICY

pytestmark = pytest.mark.timeout(300)


def rollback(root: Dnf5Root) -> subprocess.CompletedProcess:
    result = root.gpuguard("guard", "rollback")
    assert "Traceback" not in result.stderr, result.stderr
    return result


def events(root: Dnf5Root) -> list:
    path = root.state_dir / "guard-events.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def record_known_good(root: Dnf5Root) -> List[str]:
    """The first check records the compliant baseline and keeps its .rpm files; the installed NEVRAs."""
    result = rollback(root)
    assert result.returncode == 0 and "guard: recorded" in result.stdout, result.stdout + result.stderr
    known_good = json.loads((root.state_dir / "known-good.json").read_text())["packages"]
    assert known_good["amdgpu-dkms"]["version"] == AMDGPU_62 and known_good["amdgpu-dkms"]["rpm"]
    assert (root.root / known_good["amdgpu-dkms"]["rpm"].lstrip("/")).is_file()
    return root.nevras()


def force(root: Dnf5Root, *files: str) -> None:
    forced = root.rpm("-U", "--force", "--nodeps", *files)
    assert forced.returncode == 0, forced.stderr


def assert_clean(root: Dnf5Root) -> None:
    verify = root.verify()
    assert verify.returncode == 0 and not verify.stdout.strip(), verify.stdout


def assert_rolled_back(root: Dnf5Root, before: List[str], to_versions: dict) -> None:
    result = rollback(root)
    assert result.returncode == 0 and "guard: rolled_back" in result.stdout, result.stdout + result.stderr
    assert root.nevras() == before
    assert_clean(root)
    assert not (root.state_dir / "rollback-authorization.json").exists()
    event = [e for e in events(root) if e["kind"] == "rollback"][-1]
    assert event["succeeded"] is True and event["to_versions"] == to_versions
    assert "via dnf5 do" in event["detail"]
    again = rollback(root)
    assert "guard: compliant" in again.stdout, again.stdout


def test_driver_forced_without_its_firmware_is_rolled_back_with_dnf5(dnf5_root: Dnf5Root) -> None:
    """``rpm -U --force --nodeps`` of the newer driver alone (its exact-EVR firmware unmet): one dnf5 transaction
    restores the exact known-good set and ``rpm -Va --nofiles`` is clean."""
    before = record_known_good(dnf5_root)
    force(dnf5_root, dnf5_root.rpm_path("amdgpu-dkms", AMDGPU_63))
    assert dnf5_root.installed()["amdgpu-dkms"] == AMDGPU_63
    assert dnf5_root.verify().returncode != 0  # amdgpu-dkms-firmware = 1:6.10... is needed
    assert_rolled_back(dnf5_root, before, {"amdgpu-dkms": AMDGPU_62})


def test_rollback_uses_the_kept_rpms_when_the_repository_dropped_the_builds(dnf5_root: Dnf5Root,
                                                                            tmp_path: Path) -> None:
    """The repository no longer offers the known-good driver and firmware: gpuguard's kept .rpm files restore them."""
    before = record_known_good(dnf5_root)
    dropped = tmp_path / "dropped"
    dropped.mkdir()
    repo = dnf5_root.sid.path(REPO)
    moved = []
    for name in ("amdgpu-dkms", FIRMWARE):
        source = dnf5_root.sid.path(dnf5_root.rpm_path(name, AMDGPU_62))
        moved.append((source, dropped / source.name))
        source.rename(dropped / source.name)
    try:
        dnf5_root.sid.run("createrepo_c", "--quiet", "--update", REPO, check=True)
        force(dnf5_root, dnf5_root.rpm_path("amdgpu-dkms", AMDGPU_63))
        assert_rolled_back(dnf5_root, before, {"amdgpu-dkms": AMDGPU_62})
    finally:
        for source, kept in moved:
            kept.rename(source)
        dnf5_root.sid.run("createrepo_c", "--quiet", "--update", REPO, check=True)
    assert sorted(p.name for p in repo.glob("amdgpu-dkms*-6.8.5.*.rpm")) == [
        "amdgpu-dkms-6.8.5.60202-2041575.el9.noarch.rpm", "amdgpu-dkms-firmware-6.8.5.60202-2041575.el9.noarch.rpm"]


def test_frozen_package_forced_is_rolled_back_through_the_gpuguard_dnf5_action(dnf5_root: Dnf5Root) -> None:
    """rocm-core is [frozen]; driver, firmware and ROCm 6.3 forced together (an allowed pairing): gpuguard's own
    dnf5 action lets exactly the rollback to the known-good set through on the one-shot authorization, audited, and
    still refuses the same move to anyone else. The firmware is in the known-good set because an [amd] policy
    guards the driver's firmware by default (without it, the plan that must move it back too was refused as "dnf
    would also change amdgpu-dkms-firmware")."""
    dnf5_root.install_gpuguard(TEST_POLICY + '\n[frozen]\npackages = ["rocm-core"]\naction = "rollback"\n')
    compile_policy(dnf5_root)
    before = record_known_good(dnf5_root)
    force(dnf5_root, *(dnf5_root.rpm_path(n, v) for n, v in (("amdgpu-dkms", AMDGPU_63), (FIRMWARE, AMDGPU_63),
                                                              ("rocm-core", ROCM_63))))
    assert_clean(dnf5_root)  # a consistent state: only the policy says no
    assert_rolled_back(dnf5_root, before, {"amdgpu-dkms": AMDGPU_62, FIRMWARE: AMDGPU_62, "rocm-core": ROCM_62})
    assert "frozen" in [e["rule"] for e in events(dnf5_root) if e["kind"] == "policy_violation"]
    audit = [json.loads(line) for line in (dnf5_root.state_dir / "audit.log").read_text().splitlines()]
    granted = [a for a in audit if a["event"] == "rollback_authorized"]
    assert granted and {a["tool"] for a in granted} == {"dnf5"}
    assert granted[-1]["target"]["rocm-core"] == ROCM_62 and granted[-1]["target"]["amdgpu-dkms"] == AMDGPU_62
    refused = dnf5_root.dnf5("upgrade", "amdgpu-dkms", "rocm-core")
    assert refused.returncode == 1 and "REFUSED (frozen)" in refused.stderr, refused.stdout + refused.stderr
