"""Rollback from every state dpkg can be left in after a bypass: broken dependencies, several packages forced
together, old builds only in gpuguard's .deb cache, a frozen package among them, a half-configured package."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Dict

import pytest

from agent.config import Settings
from agent.guard.rollback.core import GuardResult
from agent.host import Host
from tests.guard.apt.chroot.conftest import gpuguard
from tests.guard.apt.chroot.harness import (
    AMDGPU_62_U,
    AMDGPU_63_U,
    FIRMWARE,
    ROCM_62,
    ROCM_63,
    TEST_POLICY,
    Chroot,
)
from tests.guard.wiring import check

pytestmark = pytest.mark.timeout(900)

GOOD = {"amdgpu-dkms": AMDGPU_62_U, FIRMWARE: AMDGPU_62_U, "rocm-core": ROCM_62, "rocm-hip-runtime": ROCM_62}


def _rollback(chroot: Chroot) -> GuardResult:
    return check(Host.for_root(str(chroot.root)), Settings(), snapshot=lambda host: None)


def _versions(chroot: Chroot) -> Dict[str, str]:
    """Every package dpkg has in any present state (not only 'ii'), so a half-configured one counts."""
    out = chroot.run("dpkg-query", "-W", "-f", "${Package} ${Version} ${db:Status-Abbrev}\n", check=True).stdout
    rows = [line.split() for line in out.splitlines()]
    return {r[0]: r[1] for r in rows if len(r) >= 3 and r[2][1] not in "nc" and r[0] in GOOD}


def _assert_clean(chroot: Chroot) -> None:
    audit = chroot.run("dpkg", "--audit")
    assert audit.returncode == 0 and not audit.stdout.strip(), audit.stdout
    check = chroot.run("apt-get", "-o", "Dir::Cache::pkgcache=", "-o", "Dir::Cache::srcpkgcache=", "check")
    assert check.returncode == 0, check.stdout + check.stderr


def _policy(chroot: Chroot, extra: str = "") -> None:
    """The test policy, with no ``guarded`` list: its [amd] section guards the driver's firmware and the ROCm stack
    by default (compiled.AMD_STACK_PACKAGES), so they belong to the known-good set."""
    (chroot.root / "etc/gpuguard/policy.d/10-test.toml").write_text(TEST_POLICY + extra)
    code, out = gpuguard(chroot, "policy", "compile")
    assert code == 0, out


def _firmware_baseline(chroot: Chroot, extra_policy: str = "") -> None:
    """Move through apt (hook active) to the 24.04-style driver with its firmware and record it as known-good."""
    _policy(chroot, extra_policy)
    moved = chroot.apt("install", f"amdgpu-dkms={AMDGPU_62_U}", f"{FIRMWARE}={AMDGPU_62_U}")
    assert moved.returncode == 0, moved.stderr
    assert _rollback(chroot).status == "recorded"
    assert _versions(chroot) == GOOD
    known_good = json.loads((chroot.state_dir / "known-good.json").read_text())["packages"]
    assert known_good["amdgpu-dkms"]["version"] == AMDGPU_62_U and known_good["amdgpu-dkms"]["deb"]
    assert known_good[FIRMWARE]["version"] == AMDGPU_62_U and known_good[FIRMWARE]["deb"]
    assert known_good["rocm-hip-runtime"]["version"] == GOOD["rocm-hip-runtime"]


def _force(chroot: Chroot, *debs: str) -> None:
    forced = chroot.run("dpkg", "-i", "--force-depends", *debs)
    assert forced.returncode == 0, forced.stderr
    state = chroot.run("dpkg-query", "-W", "-f", "${Package} ${Version} ${db:Status-Abbrev}\n").stdout
    broken = chroot.run("apt-get", "-o", "Dir::Cache::pkgcache=", "check")
    assert broken.returncode != 0, state  # the bypass left dependencies broken


def _assert_rolled_back(chroot: Chroot, result: GuardResult, via: str = "via dpkg -i of the kept .deb files") -> dict:
    assert result.status == "rolled_back", result.summary()
    assert _versions(chroot) == GOOD
    _assert_clean(chroot)
    assert not (chroot.state_dir / "rollback-authorization.json").exists()
    events = [json.loads(line) for line in (chroot.state_dir / "guard-events.jsonl").read_text().splitlines()]
    event = [e for e in events if e["kind"] == "rollback"][-1]
    assert event["succeeded"] is True and via in event["detail"], event["detail"]
    assert _rollback(chroot).status == "compliant"
    return event


def test_driver_forced_without_its_firmware_is_rolled_back(chroot: Chroot) -> None:
    """dpkg -i --force-depends of the newer driver alone (firmware dependency unmet): back to the exact set."""
    _firmware_baseline(chroot)
    _force(chroot, chroot.deb("amdgpu-dkms", AMDGPU_63_U))
    assert _versions(chroot)["amdgpu-dkms"] == AMDGPU_63_U
    event = _assert_rolled_back(chroot, _rollback(chroot))
    assert event["to_versions"] == {"amdgpu-dkms": AMDGPU_62_U}


def test_driver_and_rocm_runtime_forced_together_are_rolled_back(chroot: Chroot) -> None:
    """Two packages forced at once, each with an unmet dependency: both go back."""
    _firmware_baseline(chroot)
    _force(chroot, chroot.deb("amdgpu-dkms", AMDGPU_63_U), chroot.deb("rocm-hip-runtime", ROCM_63))
    event = _assert_rolled_back(chroot, _rollback(chroot))
    assert event["to_versions"] == {"amdgpu-dkms": AMDGPU_62_U, "rocm-hip-runtime": ROCM_62}


def test_driver_and_its_firmware_forced_together_go_back_together(chroot: Chroot) -> None:
    """A consistent dpkg -i of the newer driver with its firmware (exact-version dependency met) breaks only the
    pairing: the default guarded set holds the firmware, so the rollback restores both, not a broken half."""
    _firmware_baseline(chroot)
    forced = chroot.run("dpkg", "-i", chroot.deb("amdgpu-dkms", AMDGPU_63_U), chroot.deb(FIRMWARE, AMDGPU_63_U))
    assert forced.returncode == 0, forced.stderr
    event = _assert_rolled_back(chroot, _rollback(chroot), via="via apt-get install")
    assert event["to_versions"] == {"amdgpu-dkms": AMDGPU_62_U, FIRMWARE: AMDGPU_62_U}


def test_forced_driver_is_rolled_back_when_only_the_kept_debs_have_the_old_builds(chroot: Chroot) -> None:
    """The repository dropped the known-good driver and firmware: the kept .deb files restore them."""
    _firmware_baseline(chroot)
    for name in ("amdgpu-dkms", FIRMWARE):
        chroot.drop_from_repo(chroot.deb(name, AMDGPU_62_U).rsplit("/", 1)[-1])
    assert AMDGPU_62_U not in chroot.run("apt-cache", "madison", "amdgpu-dkms", FIRMWARE).stdout
    _force(chroot, chroot.deb("amdgpu-dkms", AMDGPU_63_U))
    result = _rollback(chroot)
    assert result.targets and all(t.startswith("/var/lib/gpuguard/debs/") for t in result.targets), result.targets
    _assert_rolled_back(chroot, result)


def test_frozen_package_forced_with_broken_dependencies_is_rolled_back(chroot: Chroot) -> None:
    """rocm-core is [frozen] and was forced with the driver (dependencies broken): both go back; afterwards the
    same move is still refused to everyone else."""
    _firmware_baseline(chroot, extra_policy='\n[frozen]\npackages = ["rocm-core"]\naction = "rollback"\n')
    _force(chroot, chroot.deb("amdgpu-dkms", AMDGPU_63_U), chroot.deb("rocm-core", ROCM_63))
    result = _rollback(chroot)
    event = _assert_rolled_back(chroot, result)
    assert event["to_versions"] == {"amdgpu-dkms": AMDGPU_62_U, "rocm-core": ROCM_62}
    audit = [json.loads(line) for line in (chroot.state_dir / "audit.log").read_text().splitlines()]
    kinds = [a["event"] for a in audit]
    assert "rollback_authorization_written" in kinds and "rollback_authorization_removed" in kinds
    refused = chroot.apt("install", f"rocm-core={ROCM_63}", f"rocm-hip-runtime={ROCM_63}")
    assert refused.returncode == 100 and "REFUSED (frozen)" in refused.stderr


def test_half_configured_driver_is_rolled_back(chroot: Chroot) -> None:
    """dpkg --unpack of the newer driver (unpacked, never configured, firmware unmet): back and configured."""
    _firmware_baseline(chroot)
    unpacked = chroot.run("dpkg", "--unpack", chroot.deb("amdgpu-dkms", AMDGPU_63_U))
    assert unpacked.returncode == 0, unpacked.stderr
    assert chroot.run("dpkg", "--audit").stdout.strip()
    _assert_rolled_back(chroot, _rollback(chroot))


def test_frozen_package_in_a_consistent_forced_set_is_rolled_back_through_the_agents_own_hook(chroot: Chroot) -> None:
    """A consistent dpkg -i of the whole 6.3 stack with rocm-core [frozen]: apt plans the rollback, and the apt hook
    lets exactly that transaction through on the one-shot authorization (audited), which is gone afterwards."""
    _firmware_baseline(chroot, extra_policy='\n[frozen]\npackages = ["rocm-core"]\naction = "rollback"\n')
    forced = chroot.run("dpkg", "-i", chroot.deb("amdgpu-dkms", AMDGPU_63_U), chroot.deb(FIRMWARE, AMDGPU_63_U),
                        chroot.deb("rocm-core", ROCM_63), chroot.deb("rocm-hip-runtime", ROCM_63))
    assert forced.returncode == 0, forced.stderr
    event = _assert_rolled_back(chroot, _rollback(chroot), via="via apt-get install")
    assert set(event["to_versions"]) == set(GOOD)
    audit = [json.loads(line) for line in (chroot.state_dir / "audit.log").read_text().splitlines()]
    granted = [a for a in audit if a["event"] == "rollback_authorized"]
    assert granted and granted[-1]["tool"] == "apt" and granted[-1]["target"]["rocm-core"] == ROCM_62
    assert [v["rule"] for v in granted[-1]["violations"]] == ["frozen"]
    refused = chroot.apt("install", f"rocm-core={ROCM_63}", f"rocm-hip-runtime={ROCM_63}")
    assert refused.returncode == 100 and "REFUSED (frozen)" in refused.stderr


def test_forced_set_with_an_allowed_pairing_but_broken_dependencies_is_rolled_back_not_recorded(chroot: Chroot
                                                                                                ) -> None:
    """Driver, its firmware and ROCm 6.3 forced together (an allowed pairing) without the runtime: never recorded
    as known-good; the broken set goes back to the known-good one exactly (a dependencies_broken event, then the
    rollback), whatever the pairing says of the versions."""
    _firmware_baseline(chroot)
    _force(chroot, chroot.deb("amdgpu-dkms", AMDGPU_63_U), chroot.deb(FIRMWARE, AMDGPU_63_U),
           chroot.deb("rocm-core", ROCM_63))
    result = _rollback(chroot)
    assert "dependencies_broken" in {v.rule for v in result.violations}, result.summary()
    event = _assert_rolled_back(chroot, result)
    assert event["reason"] == "dependencies_broken"
    assert event["to_versions"] == {"amdgpu-dkms": AMDGPU_62_U, FIRMWARE: AMDGPU_62_U, "rocm-core": ROCM_62}
    kinds = [json.loads(line)["kind"] for line in (chroot.state_dir / "guard-events.jsonl").read_text().splitlines()]
    assert "dependencies_broken" in kinds


def test_forced_set_with_broken_dependencies_and_rollback_off_is_reported_not_recorded(chroot: Chroot) -> None:
    """The same forced set with [guard] rollback_enabled = false: not recorded as known-good, nothing moved back,
    status inconsistent with the unmet dependency named."""
    from agent.guard.settings import GuardSettings

    _firmware_baseline(chroot)
    known_good = (chroot.state_dir / "known-good.json").read_bytes()
    _force(chroot, chroot.deb("amdgpu-dkms", AMDGPU_63_U), chroot.deb(FIRMWARE, AMDGPU_63_U),
           chroot.deb("rocm-core", ROCM_63))
    result = check(Host.for_root(str(chroot.root)), Settings(guard=GuardSettings(rollback_enabled=False)),
                   snapshot=lambda host: None)
    assert result.status == "inconsistent" and "apt-get check" in result.detail, result.summary()
    assert "not recorded as known-good" in result.detail
    assert (chroot.state_dir / "known-good.json").read_bytes() == known_good
    assert _versions(chroot)["rocm-core"] == ROCM_63


def test_an_open_authorization_lets_nothing_else_through_the_hook(chroot: Chroot) -> None:
    """While an authorization for the known-good set exists, any other transaction is decided as always: the
    pairing-breaking ROCm 6.3 upgrade is refused and the status file stays byte-identical."""
    import datetime as dt

    from agent.guard.rollback.core import _authorize, load_known_good
    from agent.statepaths import StatePaths

    host = Host.for_root(str(chroot.root))
    paths = StatePaths()
    known_good = load_known_good(host, paths)
    assert known_good is not None
    grant = _authorize(host, paths, known_good, "test", dt.datetime.now(dt.timezone.utc))
    assert (chroot.state_dir / "rollback-authorization.json").stat().st_mode & 0o777 == 0o600
    before = chroot.status_bytes()
    refused = chroot.apt("install", f"rocm-core={ROCM_63}", f"rocm-hip-runtime={ROCM_63}")
    assert refused.returncode == 100 and "REFUSED (amd.pairing)" in refused.stderr
    assert chroot.status_bytes() == before
    Path(grant).unlink()


def test_a_foreign_architecture_copy_is_keyed_kept_and_rolled_back_on_its_own(chroot: Chroot, tmp_path: Path) -> None:
    """hsa-rocr installed for amd64 and i386 (Multi-Arch: same) and [frozen]: the known-good set keys the i386
    copy ``hsa-rocr:i386`` as the apt hook does and keeps its own .deb. The i386 copy forced alone (dpkg leaves
    both unconfigured, and refuses the old build over the shared file the new one wrote) goes back with dpkg as
    a group; both forced together go back through apt and the hook on the one-shot authorization."""
    from tests.guard.apt.chroot.harness import FakePackage, build_deb

    debs = {}
    for arch in (chroot.native_arch, "i386"):
        for version in (ROCM_62, ROCM_63):
            pkg = FakePackage("hsa-rocr", version, arch, multi_arch="same")
            debs[arch, version] = build_deb(pkg, chroot.root / "var/cache/apt/archives", tmp_path / arch)
    inside = {key: "/var/cache/apt/archives/" + path.name for key, path in debs.items()}
    chroot.run("dpkg", "--add-architecture", "i386", check=True)
    try:
        chroot.run("dpkg", "-i", inside[chroot.native_arch, ROCM_62], inside["i386", ROCM_62], check=True)
        _firmware_baseline(chroot)  # hsa-rocr is guarded by the [amd] section's defaults (hsa-*)
        _policy(chroot, '\n[frozen]\npackages = ["hsa-rocr"]\naction = "rollback"\n')
        known_good = json.loads((chroot.state_dir / "known-good.json").read_text())["packages"]
        assert known_good["hsa-rocr"]["version"] == known_good["hsa-rocr:i386"]["version"] == ROCM_62
        assert known_good["hsa-rocr:i386"]["deb"].endswith("_i386.deb")
        assert known_good["hsa-rocr"]["deb"].endswith(f"_{chroot.native_arch}.deb")
        (chroot.root / inside["i386", ROCM_62].lstrip("/")).unlink()  # only gpuguard's kept copy is left
        # dpkg unpacks it and refuses to configure either copy (Multi-Arch: same needs one version): a broken state
        forced = chroot.run("dpkg", "-i", inside["i386", ROCM_63])
        assert forced.returncode != 0 and "at a different version" in forced.stderr, forced.stderr
        result = _rollback(chroot)
        assert result.status == "rolled_back", result.summary()
        rows = chroot.run("dpkg-query", "-W", "-f", "${Package}:${Architecture} ${Version}\n", "hsa-rocr",
                          check=True).stdout.split("\n")
        assert sorted(r for r in rows if r) == sorted([f"hsa-rocr:{chroot.native_arch} {ROCM_62}",
                                                        f"hsa-rocr:i386 {ROCM_62}"])
        assert "dpkg -i of the kept .deb files" in result.detail, result.detail
        _assert_clean(chroot)
        # Both copies forced to 6.3 together (a consistent state): apt plans the rollback from the kept files,
        # and the apt hook lets it through because the authorization names hsa-rocr:i386 as the hook keys it.
        forced = chroot.run("dpkg", "-i", inside[chroot.native_arch, ROCM_63], inside["i386", ROCM_63])
        assert forced.returncode == 0, forced.stderr
        result = _rollback(chroot)
        assert result.status == "rolled_back" and "via apt-get install" in result.detail, result.summary()
        audit = [json.loads(line) for line in (chroot.state_dir / "audit.log").read_text().splitlines()]
        granted = [a for a in audit if a["event"] == "rollback_authorized"]
        assert granted and granted[-1]["target"]["hsa-rocr:i386"] == granted[-1]["target"]["hsa-rocr"] == ROCM_62
        _assert_clean(chroot)
    finally:
        chroot.run("dpkg", "--purge", "hsa-rocr:i386", f"hsa-rocr:{chroot.native_arch}")
        chroot.run("dpkg", "--remove-architecture", "i386")
        for path in inside.values():
            (chroot.root / path.lstrip("/")).unlink(missing_ok=True)
