"""Real apt and dpkg in a debootstrap'd Debian 12 chroot, with the gpuguard hook installed as the package does."""

from __future__ import annotations

import datetime as dt
import json

import pytest

from agent.config import Settings
from agent.guard.apt.preferences import HEADER
from agent.guard.hotpath.overrides import start_window
from agent.host import Host
from tests.guard.apt.chroot.conftest import gpuguard
from tests.guard.apt.chroot.harness import (
    AMDGPU_62,
    AMDGPU_63,
    BASELINE,
    KERNEL_26,
    KERNEL_27,
    KERNEL_28,
    ROCM_62,
    ROCM_63,
    Chroot,
)
from tests.guard.wiring import check

pytestmark = pytest.mark.timeout(900)


def _events(chroot: Chroot) -> list:
    path = chroot.state_dir / "guard-events.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _rollback(chroot: Chroot):
    return check(Host.for_root(str(chroot.root)), Settings(), snapshot=lambda host: None)


def test_baseline_is_installed_through_the_hook(chroot: Chroot) -> None:
    """The session baseline went in through apt with the hook active and is the recorded known-good set."""
    installed = chroot.installed()
    assert {n: installed.get(n) for n in BASELINE} == BASELINE
    known_good = json.loads((chroot.state_dir / "known-good.json").read_text())
    assert known_good["packages"]["amdgpu-dkms"]["version"] == AMDGPU_62
    assert known_good["packages"]["amdgpu-dkms"]["deb"]


def test_allowed_pairing_upgrade_passes(chroot: Chroot) -> None:
    """Moving driver and ROCm together to another allowed pairing goes through."""
    result = chroot.apt("install", f"amdgpu-dkms={AMDGPU_63}", f"rocm-core={ROCM_63}", f"rocm-hip-runtime={ROCM_63}")
    assert result.returncode == 0, result.stderr
    installed = chroot.installed()
    assert (installed["amdgpu-dkms"], installed["rocm-core"], installed["rocm-hip-runtime"]) == \
        (AMDGPU_63, ROCM_63, ROCM_63)
    assert _rollback(chroot).status == "recorded"


def test_pairing_breaking_upgrade_is_refused_and_nothing_changes(chroot: Chroot) -> None:
    """ROCm 6.3 on driver 6.2: apt exits 100 before dpkg runs; the status file is byte-identical."""
    before = chroot.status_bytes()
    log_before = (chroot.root / "var/log/dpkg.log").read_bytes()
    result = chroot.apt("install", f"rocm-core={ROCM_63}", f"rocm-hip-runtime={ROCM_63}")
    assert result.returncode == 100
    err = result.stderr
    assert "gpuguard: REFUSED (amd.pairing)" in err
    assert "rocm-core" in err and "'rocm-6.2'" in err and "gpuguard override start --minutes 60" in err
    assert chroot.status_bytes() == before
    assert (chroot.root / "var/log/dpkg.log").read_bytes() == log_before
    assert any(e["kind"] == "transaction_blocked" and e["rule"] == "amd.pairing" for e in _events(chroot))


def test_removing_the_driver_under_rocm_is_refused(chroot: Chroot) -> None:
    """Removing amdgpu-dkms would leave ROCm without its pinned driver."""
    before = chroot.status_bytes()
    result = chroot.apt("remove", "amdgpu-dkms")
    assert result.returncode == 100, result.stderr
    assert "amdgpu-dkms" in result.stderr and chroot.status_bytes() == before


def test_kernel_the_pinned_driver_does_not_support_is_refused(chroot: Chroot) -> None:
    """6.1.0-28 is not in the pinned pairing's kernels: refused; 6.1.0-27 is and goes through."""
    before = chroot.status_bytes()
    refused = chroot.apt("install", KERNEL_28)
    assert refused.returncode == 100
    assert "amd.pairing.kernels" in refused.stderr and "6.1.0-28-amd64" in refused.stderr
    assert "'rocm-6.2'" in refused.stderr
    assert chroot.status_bytes() == before
    allowed = chroot.apt("install", KERNEL_27)
    assert allowed.returncode == 0, allowed.stderr


def test_dpkg_i_violation_is_rolled_back_to_the_exact_previous_versions(chroot: Chroot) -> None:
    """dpkg -i skips apt's hook; the watcher sees the broken pairing and restores the known-good versions."""
    forced = chroot.run("dpkg", "-i", chroot.deb("amdgpu-dkms", AMDGPU_63))
    assert forced.returncode == 0, forced.stderr
    assert chroot.installed()["amdgpu-dkms"] == AMDGPU_63
    result = _rollback(chroot)
    assert result.status == "rolled_back", result.summary()
    installed = chroot.installed()
    assert {n: installed.get(n) for n in BASELINE} == BASELINE
    assert result.reboot_required
    assert "amdgpu-dkms" in (chroot.state_dir / "reboot-required.pkgs").read_text()
    rollbacks = [e for e in _events(chroot) if e["kind"] == "rollback"]
    assert rollbacks and rollbacks[-1]["succeeded"] is True
    assert rollbacks[-1]["to_versions"] == {"amdgpu-dkms": AMDGPU_62}
    assert _rollback(chroot).status == "compliant"


def test_rollback_works_after_the_repository_dropped_the_old_version(chroot: Chroot) -> None:
    """The known-good .deb comes from gpuguard's cache when no index lists the old version any more."""
    chroot.drop_from_repo(chroot.deb("amdgpu-dkms", AMDGPU_62).rsplit("/", 1)[-1])
    madison = chroot.run("apt-cache", "madison", "amdgpu-dkms").stdout
    assert f"| {AMDGPU_62} |" not in madison and f"| {AMDGPU_63} |" in madison
    assert chroot.run("dpkg", "-i", chroot.deb("amdgpu-dkms", AMDGPU_63)).returncode == 0
    result = _rollback(chroot)
    assert result.status == "rolled_back", result.summary()
    assert any(t.endswith(".deb") and "amdgpu-dkms" in t for t in result.targets)
    assert chroot.installed()["amdgpu-dkms"] == AMDGPU_62


def test_rollback_uses_the_kept_deb_when_the_index_still_lists_a_lost_file(chroot: Chroot) -> None:
    """Stale lists or a mirror that lost the file (seen on the H200: no network, lists from before): apt must
    install the kept .deb, not try to fetch the same version from the repository ("Unable to fetch")."""
    chroot.lose_from_pool(chroot.deb("amdgpu-dkms", AMDGPU_62).rsplit("/", 1)[-1])
    assert f"| {AMDGPU_62} |" in chroot.run("apt-cache", "madison", "amdgpu-dkms").stdout
    assert chroot.run("dpkg", "-i", chroot.deb("amdgpu-dkms", AMDGPU_63)).returncode == 0
    result = _rollback(chroot)
    assert result.status == "rolled_back", result.summary()
    assert chroot.installed()["amdgpu-dkms"] == AMDGPU_62


def test_rollback_dry_run_plans_without_changing_anything(chroot: Chroot) -> None:
    """guard rollback --dry-run prints the apt-get -s plan and leaves the package state alone."""
    assert chroot.run("dpkg", "-i", chroot.deb("amdgpu-dkms", AMDGPU_63)).returncode == 0
    before = chroot.status_bytes()
    code, out = gpuguard(chroot, "guard", "rollback", "--dry-run")
    assert code == 0, out
    assert "planned" in out and "amdgpu-dkms" in out
    assert chroot.status_bytes() == before


def test_override_window_allows_then_expires_and_refuses_again(chroot: Chroot) -> None:
    """An open window lets a violating upgrade through (audited); after it expires the same upgrade is refused."""
    # An hour's window, however slowly a loaded machine runs apt in it; its end is then moved into the past, as if
    # the hour had passed, instead of a 6 s window waited out (which a slow apt run could outlast before its check).
    overrides = chroot.state_dir / "overrides.json"
    opened = dt.datetime.now(dt.timezone.utc)
    start_window(str(overrides), str(chroot.state_dir / "audit.log"),
                 minutes=60, reason="chroot test maintenance", max_minutes=60,
                 now=lambda: opened, opened_by="tester")
    allowed = chroot.apt("install", f"rocm-core={ROCM_63}", f"rocm-hip-runtime={ROCM_63}")
    assert allowed.returncode == 0, allowed.stderr
    assert "override window" in allowed.stderr
    audit = (chroot.state_dir / "audit.log").read_text()
    assert '"event":"override_used"' in audit and "chroot test maintenance" in audit
    chroot.apt("install", "--allow-downgrades", f"rocm-core={ROCM_62}", f"rocm-hip-runtime={ROCM_62}", hook=False,
               check=True)
    recorded = json.loads(overrides.read_text())
    for window in recorded["windows"]:
        window["started_at"] = (opened - dt.timedelta(hours=2)).isoformat()
        window["expires_at"] = (opened - dt.timedelta(hours=1)).isoformat()
    overrides.write_text(json.dumps(recorded))
    refused = chroot.apt("install", f"rocm-core={ROCM_63}", f"rocm-hip-runtime={ROCM_63}")
    assert refused.returncode == 100
    assert chroot.installed()["rocm-core"] == ROCM_62


def test_override_cli_start_list_end(chroot: Chroot) -> None:
    """gpuguard override start/list/end against the chroot's state directory."""
    code, out = gpuguard(chroot, "override", "start", "--minutes", "30", "--reason", "driver swap")
    assert code == 0 and "open until" in out
    code, out = gpuguard(chroot, "override", "list")
    assert code == 0 and " open " in out and "driver swap" in out
    code, out = gpuguard(chroot, "override", "end")
    assert code == 0 and "closed" in out
    code, out = gpuguard(chroot, "override", "start", "--minutes", "100000", "--reason", "too long")
    assert code == 2


def test_pin_apply_forbids_versions_and_removes_only_its_own_stale_files(chroot: Chroot) -> None:
    """Pins make apt itself refuse the unsupported kernel even with the hook blanked; foreign files stay."""
    prefs = chroot.root / "etc/apt/preferences.d"
    (prefs / "gpuguard-old.pref").write_text(HEADER + "\n\nPackage: foo\nPin: version 1\nPin-Priority: -1\n")
    (prefs / "gpuguard-mine.pref").write_text("# an operator's own file\nPackage: bar\nPin: version 1\n"
                                              "Pin-Priority: 600\n")
    code, out = gpuguard(chroot, "pin", "apply")
    assert code == 0, out
    assert "removed stale" in out and "gpuguard-old.pref" in out and "left alone" in out
    assert not (prefs / "gpuguard-old.pref").exists() and (prefs / "gpuguard-mine.pref").exists()
    forbidden = (prefs / "gpuguard-forbidden.pref").read_text()
    assert KERNEL_28 in forbidden and KERNEL_27 not in forbidden and KERNEL_26 not in forbidden
    policy = chroot.run("apt-cache", "policy", KERNEL_28).stdout
    assert "Candidate: (none)" in policy
    bypass = chroot.apt("install", KERNEL_28, hook=False)
    assert bypass.returncode != 0 and KERNEL_28 not in chroot.installed()
    code, out = gpuguard(chroot, "pin", "apply")
    assert "unchanged" in out


def test_corrupt_compiled_policy_fails_safe(chroot: Chroot) -> None:
    """A corrupt compiled policy: guarded packages are refused (one clear line), others go through."""
    (chroot.state_dir / "policy.compiled.json").write_text("{not json")
    before = chroot.status_bytes()
    refused = chroot.apt("install", f"rocm-core={ROCM_63}", f"rocm-hip-runtime={ROCM_63}")
    assert refused.returncode == 100
    assert "REFUSED by fail-safe 'block-guarded'" in refused.stderr and "not valid JSON" in refused.stderr
    assert "Traceback" not in refused.stderr
    assert chroot.status_bytes() == before
    other = chroot.apt("install", "hello-fake")
    assert other.returncode == 0, other.stderr
    assert "fail-safe 'block-guarded' lets this transaction through" in other.stderr


def test_policy_explain_on_the_chroot(chroot: Chroot) -> None:
    """policy explain names the pinned pairing and says the host is compliant."""
    code, out = gpuguard(chroot, "policy", "explain")
    assert code == 0
    assert "pinned pairing: 'rocm-6.2'" in out and f"amdgpu-dkms {AMDGPU_62}" in out and "compliant" in out


def test_rocm_versions_used_by_the_harness_are_consistent() -> None:
    """The fake versions encode the releases the test policy talks about."""
    from agent.policy.releases import amdgpu_driver_release, rocm_release

    assert (amdgpu_driver_release(AMDGPU_62), amdgpu_driver_release(AMDGPU_63)) == ("6.2.2", "6.3.0")
    assert (rocm_release(ROCM_62), rocm_release(ROCM_63)) == ("6.2.2", "6.3.0")


def test_kernel_installed_with_dpkg_i_is_removed_again(chroot: Chroot) -> None:
    """A guarded package that was not in the known-good set is removed by the rollback; a reboot is flagged."""
    assert chroot.run("dpkg", "-i", chroot.deb(KERNEL_28, "6.1.119-1")).returncode == 0
    result = _rollback(chroot)
    assert result.status == "rolled_back", result.summary()
    assert f"{KERNEL_28}-" in result.targets and KERNEL_28 not in chroot.installed()
    assert result.reboot_required and KERNEL_28 in (chroot.state_dir / "reboot-required.pkgs").read_text()


def test_open_override_window_suspends_rollback(chroot: Chroot) -> None:
    """While a maintenance window is open the watcher reports the violation but leaves the packages alone."""
    code, _ = gpuguard(chroot, "override", "start", "--minutes", "10", "--reason", "manual driver test")
    assert code == 0
    assert chroot.run("dpkg", "-i", chroot.deb("amdgpu-dkms", AMDGPU_63)).returncode == 0
    result = _rollback(chroot)
    assert result.status == "override" and chroot.installed()["amdgpu-dkms"] == AMDGPU_63
    code, out = gpuguard(chroot, "guard", "rollback")
    assert code == 10 and "override" in out


def test_hook_configured_for_protocol_2_fails_safe(chroot: Chroot) -> None:
    """A snippet that forgot Version "3": apt sends version 2, the hook refuses every transaction (exit 12): a
    stream it cannot read whole may touch guarded packages whatever it names."""
    conf = chroot.root / "etc/apt/apt.conf.d/50gpuguard"
    conf.write_text(conf.read_text().replace('::Version "3"', '::Version "2"'))
    before = chroot.status_bytes()
    refused = chroot.apt("install", f"rocm-core={ROCM_63}", f"rocm-hip-runtime={ROCM_63}")
    assert refused.returncode == 100
    assert "hook protocol version 2 cannot be checked" in refused.stderr and "error code (12)" in refused.stderr
    assert chroot.status_bytes() == before
    unguarded = chroot.apt("install", "hello-fake")
    assert unguarded.returncode == 100 and "what it does not show may touch guarded packages" in unguarded.stderr
    assert chroot.status_bytes() == before


def test_one_daemon_guard_tick_rolls_back_dpkg_i_and_queues_the_events(chroot: Chroot, tmp_path) -> None:
    """The daemon's guard job, run once for a package change, rolls back and commits the events before the snapshot."""
    from agent.daemon_jobs.guard import GuardJob
    from agent.daemon_jobs.guard_events import GuardEventForwarder
    from tests.daemon.test_jobs import make_runtime

    forced = chroot.run("dpkg", "-i", chroot.deb("amdgpu-dkms", AMDGPU_63))
    assert forced.returncode == 0, forced.stderr
    rt = make_runtime(tmp_path, Host.for_root(str(chroot.root)))
    asked = []
    job = GuardJob(rt, GuardEventForwarder(rt, str(chroot.state_dir / "guard-events.jsonl")).run,
                   on_checked=lambda reason: asked.append((reason, [e.kind for e in rt.outbox.pending(1000)])))
    try:
        job.run("package_change")
        installed = chroot.installed()
        assert {n: installed.get(n) for n in BASELINE} == BASELINE
        (reason, kinds_then), = asked
        assert reason == "package_change" and "rollback" in kinds_then and "policy_violation" in kinds_then
        rollback = [e for e in rt.outbox.pending(1000) if e.kind == "rollback"][-1]
        assert rollback.payload.succeeded and rollback.payload.to_versions == {"amdgpu-dkms": AMDGPU_62}
    finally:
        rt.outbox.close()
