"""gpuguard status shows the daemon's deferral in progress and a reboot a health or guard rollback asked for."""

from __future__ import annotations

import json
import os
from pathlib import Path

from agent.status.assess import assess
from agent.status.facts import GuardFacts, HealthFacts, read_deferral, read_reboot_required
from tests.status.test_assess import MIN, NOW, healthy


def test_a_deferral_in_progress_is_read_and_shown_with_the_health_check(tmp_path: Path) -> None:
    """A deferral in progress is read into one line shown with the health check; a damaged file is ignored."""
    path = tmp_path / "health-deferral.json"
    assert read_deferral(str(path)) is None
    path.write_text(json.dumps({"since": "2026-06-01T10:00:00+00:00", "attempts": 3,
                                "next_attempt_at": "2026-06-01T12:20:00+00:00",
                                "tenants": ["gpu 0: pid 4242 (python3, 71.2 GiB)"]}))
    line = read_deferral(str(path))
    assert line == ("full check deferred since 2026-06-01T10:00:00+00:00 (3 attempt(s), next at "
                    "2026-06-01T12:20:00+00:00); in use by gpu 0: pid 4242 (python3, 71.2 GiB)")
    health = HealthFacts(status="busy", finished_at=NOW - MIN, summary="busy: functional checks passed",
                         deferral=line)
    [check] = [c for c in assess(healthy(health=health)).checks if c.name == "health"]
    assert check.state == "ok" and check.summary.endswith(line)
    path.write_text("{not json")
    assert read_deferral(str(path)) is None


def test_a_reboot_marked_by_a_rollback_is_attention(tmp_path: Path) -> None:
    """A reboot marked by a rollback and not done since boot makes the guard check attention (exit 30), naming the
    packages."""
    pkgs = tmp_path / "reboot-required.pkgs"
    assert read_reboot_required(str(pkgs)) is None
    pkgs.write_text("amdgpu-dkms\n")
    os.utime(pkgs, (1000.0, 1000.0))
    assert read_reboot_required(str(pkgs), booted_at_seconds=2000.0) is None  # rebooted since: done
    assert read_reboot_required(str(pkgs), booted_at_seconds=500.0) == ["amdgpu-dkms"]
    guard = GuardFacts(reboot_required=read_reboot_required(str(pkgs)))
    result = assess(healthy(guard=guard))
    [check] = [c for c in result.checks if c.name == "guard"]
    assert (check.state, result.exit_code) == ("warn", 30)
    assert check.summary == ("no guard events recorded; reboot needed: kernel module packages changed "
                             "(amdgpu-dkms)")


def test_the_health_gate_window_and_its_verdict_are_shown_with_the_health_check(tmp_path: Path) -> None:
    """Status names the changes since the last pass while unjudged, then the verdict and the changes it covered; a
    damaged gate file makes the health check a warning naming the file."""
    from agent.guard.rollback.health_gate import GateState, judge, observe, record_pass, render_gate
    from agent.status.facts import read_gate

    a = {"rocm-core": ("6.2.2", "amd64")}
    b = {"rocm-core": ("6.2.4", "amd64")}
    path = tmp_path / "health-gate.json"
    assert read_gate(str(path)) == (None, None)
    passed = record_pass(observe(GateState(), a, 1_796_000_000.0), a, 1_796_000_000.0)
    window = observe(observe(passed, a, 1_796_000_005.0, by="guard_rollback",
                             moved=({"amdgpu-dkms": "2"}, {"amdgpu-dkms": "1"})), b, 1_796_000_009.0)
    path.write_text(render_gate(window))
    line, problem = read_gate(str(path))
    assert problem is None and line == (
        "gate: last pass 2026-11-30T00:53:20Z; since then 2 package change(s): 2026-11-30T00:53:25Z the guard's "
        "rollback: amdgpu-dkms 2 -> 1; 2026-11-30T00:53:29Z rocm-core 6.2.2 -> 6.2.4, not judged yet")
    path.write_text(render_gate(judge(window, 1_796_000_020.0, "cpu_fallback", "rolled_back")))
    line, _ = read_gate(str(path))
    assert line is not None and line.startswith(
        "gate: last pass 2026-11-30T00:53:20Z; cpu_fallback at 2026-11-30T00:53:40Z (rolled_back) covering 2 "
        "package change(s): ")
    health = HealthFacts(status="pass", finished_at=NOW - MIN, summary="ok", gate=line)
    [check] = [c for c in assess(healthy(health=health)).checks if c.name == "health"]
    assert check.state == "ok" and check.summary.endswith(line)
    path.write_text("{damaged")
    line, problem = read_gate(str(path))
    assert line is None and problem is not None and str(path) in problem
    health = HealthFacts(status="pass", finished_at=NOW - MIN, summary="ok", gate_problem=problem)
    [check] = [c for c in assess(healthy(health=health)).checks if c.name == "health"]
    assert check.state == "warn" and problem in check.summary


def test_a_fifo_in_place_of_the_reboot_list_is_unreadable_at_once(tmp_path: Path) -> None:
    """A FIFO at reboot-required.pkgs is "(unreadable list)" at once (the daemon's NFD job reads it every minute),
    never a wait for a writer."""
    import signal

    pkgs = tmp_path / "reboot-required.pkgs"
    os.mkfifo(pkgs)

    def expired(signum: int, frame: object) -> None:
        raise AssertionError("blocked on a FIFO")  # not an OSError: the readers catch those

    signal.signal(signal.SIGALRM, expired)
    signal.alarm(10)
    try:
        assert read_reboot_required(str(pkgs)) == ["(unreadable list)"]
    finally:
        signal.alarm(0)
