"""The health-gated rollback after a package change: the decision table (pure) and the health job's gate with a
fake runner and a fake rollback (the real one runs under apt in tests/guard/apt/chroot/test_health_rollback.py)."""

from __future__ import annotations

import types
from pathlib import Path
from typing import Any, List, Optional

import pytest

from agent.config import Settings
from agent.daemon_jobs.health import HealthJob
from agent.daemon_jobs.hooks import Hooks
from agent.guard.rollback.health import decide
from agent.host import Host
from agent.policy.load import compiled_from, load_policy, write_compiled
from agent.report.events import Rollback
from agent.statepaths import StatePaths
from tests.daemon.test_jobs import make_runtime


@pytest.mark.parametrize("action,status,confirmed,expected", [
    ("rollback", "cpu_fallback", False, "rollback"),
    ("rollback", "failed", False, "rollback"),
    ("rollback", "regression", False, "confirm"),
    ("rollback", "regression", True, "rollback"),
    ("rollback", "busy", False, "none"),
    ("rollback", "deferred", False, "none"),
    ("rollback", "timeout", False, "none"),
    ("rollback", "skipped", False, "none"),
    ("rollback", "pass", True, "none"),
    ("alert", "cpu_fallback", False, "none"),
    ("alert", "failed", False, "none"),
    ("alert", "regression", True, "none"),
])
def test_decision_table(action: str, status: str, confirmed: bool, expected: str) -> None:
    """decide() maps the after_change action, the health status and its confirmation to rollback or nothing."""
    assert decide(action, status, confirmed) == expected


class Fakes:
    """A runner answering statuses in order (recording the modes) and a rollback recording its calls."""

    def __init__(self, *statuses: str, rollback_status: str = "rolled_back") -> None:
        self.statuses = list(statuses)
        self.modes: List[Optional[str]] = []
        self.rollbacks: List[str] = []
        self.rollback_status = rollback_status

    def run(self, host: Host, settings: Any, state_dir: str, snapshot: Any = None, mode: Optional[str] = None) -> Any:
        self.modes.append(mode)
        return types.SimpleNamespace(status=self.statuses.pop(0), occupancy=None)

    def rollback(self, host: Host, settings: Any, health_status: str, sink: Any, target: Any = None,
                 covers: str = "") -> Any:
        self.rollbacks.append(health_status)
        done = self.rollback_status == "rolled_back"
        if self.rollback_status in ("rolled_back", "failed"):
            sink(Rollback(reason="health", from_versions={"rocm-core": "6.3"}, to_versions={"rocm-core": "6.2"},
                          succeeded=done, health_status=health_status))
        return types.SimpleNamespace(status=self.rollback_status, reboot_required=False, detail="")

    def hooks(self) -> Hooks:
        return Hooks(health_run=self.run, health_payloads=lambda result: [], health_rollback=self.rollback)


def _job(tmp_path: Path, fakes: Fakes, after_change: Optional[str]) -> HealthJob:
    # The compiled policy is where the guard keeps it: the configured state directory under the Host root.
    rt = make_runtime(tmp_path, Host(root=Path("/")),
                      Settings.model_validate({"agent": {"state_dir": str(tmp_path / "state")}}))
    if after_change is not None:
        policy = tmp_path / "policy.toml"
        policy.write_text(f'[frozen]\npackages = ["rocm-core"]\n[health]\nafter_change = "{after_change}"\n')
        write_compiled(str(StatePaths(rt.state_dir).compiled_policy), compiled_from(load_policy(str(policy))))
    return HealthJob(rt, fakes.hooks())


def test_cpu_fallback_after_a_change_rolls_back_reports_and_checks_again(tmp_path: Path) -> None:
    """A CPU fallback after a stack change rolls back, reports a rollback event for health, checks again and keeps
    the pass."""
    fakes = Fakes("cpu_fallback", "pass")
    job = _job(tmp_path, fakes, "rollback")
    summary = job.check("stack_changed:rocm", "functional", after_change=True)
    assert fakes.rollbacks == ["cpu_fallback"] and fakes.modes == ["functional", "functional"]
    assert (summary.status, summary.rollback, summary.recheck_status) == ("pass", "rolled_back", "pass")
    [event] = job.runtime.outbox.pending(10)
    assert (event.kind, event.severity, event.payload.reason, event.payload.health_status) == (
        "rollback", "warning", "health", "cpu_fallback")
    assert job.runtime.state.last_health_status == "pass"


def test_a_regression_is_confirmed_by_a_full_run_before_a_rollback(tmp_path: Path) -> None:
    """A regression after a change is confirmed by a full run before the rollback, and checked again after it."""
    fakes = Fakes("regression", "regression", "pass")
    summary = _job(tmp_path, fakes, "rollback").check("interval", None, after_change=True)
    assert fakes.modes == [None, "full", None] and fakes.rollbacks == ["regression"]
    assert summary.recheck_status == "pass"


def test_a_regression_the_second_run_does_not_confirm_rolls_nothing_back(tmp_path: Path) -> None:
    """A regression that the confirming run does not repeat (pass, or deferred beside a busy GPU) rolls nothing back."""
    for second in ("pass", "deferred"):  # gone, or the GPU became busy: no judgement, no rollback
        fakes = Fakes("regression", second)
        summary = _job(tmp_path / second, fakes, "rollback").check("interval", None, after_change=True)
        assert fakes.rollbacks == [] and summary.status == second and summary.rollback is None


@pytest.mark.parametrize("status", ["busy", "deferred", "timeout", "pass"])
def test_never_a_rollback_on_busy_deferred_or_timeout(tmp_path: Path, status: str) -> None:
    """A busy, deferred, timed-out or passing check after a change never rolls back."""
    fakes = Fakes(status)
    _job(tmp_path, fakes, "rollback").check("stack_changed:dpkg", "functional", after_change=True)
    assert fakes.rollbacks == []


@pytest.mark.parametrize("after_change", ["alert", None])
def test_alert_or_no_policy_only_reports(tmp_path: Path, after_change: Optional[str]) -> None:
    """With after_change = alert or none set, a CPU fallback after a change is reported and nothing is rolled back."""
    fakes = Fakes("cpu_fallback")
    summary = _job(tmp_path, fakes, after_change).check("stack_changed:dpkg", "functional", after_change=True)
    assert fakes.rollbacks == [] and summary.status == "cpu_fallback"


def test_no_rollback_outside_the_check_after_a_change(tmp_path: Path) -> None:
    """A CPU fallback in a scheduled check (not the one after a change) rolls nothing back."""
    fakes = Fakes("cpu_fallback")
    _job(tmp_path, fakes, "rollback").check("interval", None, after_change=False)
    assert fakes.rollbacks == []


def test_a_rollback_that_does_not_fix_it_is_reported_once_not_retried(tmp_path: Path) -> None:
    """A rollback after which the check still fails is reported with the recheck's status and not tried again."""
    fakes = Fakes("failed", "failed")
    summary = _job(tmp_path, fakes, "rollback").check("stack_changed:dpkg", "functional", after_change=True)
    assert fakes.rollbacks == ["failed"] and summary.recheck_status == "failed"


def test_a_rollback_with_nothing_kept_runs_no_recheck(tmp_path: Path) -> None:
    """A rollback with no known-good set runs no second check and queues no event."""
    fakes = Fakes("cpu_fallback", rollback_status="no_known_good")
    job = _job(tmp_path, fakes, "rollback")
    summary = job.check("stack_changed:dpkg", "functional", after_change=True)
    assert summary.rollback == "no_known_good" and fakes.modes == ["functional"]
    assert job.runtime.outbox.depth() == 0


def test_a_rollback_that_raises_is_a_failed_rollback_event(tmp_path: Path) -> None:
    """A rollback that raises (disk full) becomes a critical rollback event, not succeeded, with the reason in its
    detail."""
    fakes = Fakes("cpu_fallback")

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise OSError(28, "No space left on device")

    rt = _job(tmp_path, fakes, "rollback").runtime
    job = HealthJob(rt, Hooks(health_run=fakes.run, health_payloads=lambda r: [], health_rollback=broken))
    summary = job.check("stack_changed:dpkg", "functional", after_change=True)
    [event] = rt.outbox.pending(10)
    assert (event.severity, event.payload.succeeded, summary.rollback) == ("critical", False, "failed")
    assert "No space left" in (event.payload.detail or "")


def test_the_heartbeat_says_when_the_last_check_finished_and_whether_it_followed_a_change(tmp_path: Path) -> None:
    """A post-change pass goes in the next heartbeat as last_health_at and last_health_after_change true; a later
    interval check makes the flag false; a daemon that read the result back after a restart sends no flag."""
    import datetime as dt
    import json
    import os

    from agent.daemon_jobs.heartbeat import HeartbeatJob

    fakes = Fakes("pass", "pass")
    job = _job(tmp_path, fakes, "rollback")
    before = dt.datetime.now(dt.timezone.utc)
    job.check("stack_changed:rocm", None, after_change=True)
    HeartbeatJob(job.runtime).run()
    beat = job.runtime.outbox.pending(10)[-1].payload
    assert beat.last_health_status == "pass" and beat.last_health_after_change is True
    assert beat.last_health_at is not None and before <= beat.last_health_at <= dt.datetime.now(dt.timezone.utc)
    job.check("interval", None)
    HeartbeatJob(job.runtime).run()
    assert job.runtime.outbox.pending(10)[-1].payload.last_health_after_change is False

    stored = Path(job.runtime.state_dir) / "health/last.json"
    stored.parent.mkdir(parents=True, exist_ok=True)
    stored.write_text(json.dumps({"status": "pass", "summary": "ok", "started_at": "2026-12-05T00:30:00+00:00",
                                  "wall_seconds": 42.0}))
    from agent.health.last import load_last_result

    again = tmp_path / "again"
    (again / "state/health").mkdir(parents=True)
    os.replace(stored, again / "state/health/last.json")
    restarted = HealthJob(make_runtime(again, Host(root=Path("/"))), Hooks(health_last=load_last_result))
    HeartbeatJob(restarted.runtime).run()
    beat = restarted.runtime.outbox.pending(10)[-1].payload
    assert beat.last_health_at == dt.datetime(2026, 12, 5, 0, 30, tzinfo=dt.timezone.utc)
    assert beat.last_health_after_change is None


def test_a_fallback_found_during_a_maintenance_hold_is_reported_as_maintenance(tmp_path: Path) -> None:
    """While a hand-off holds the node, a cpu_fallback event carries the hold's reason and is a warning; without a
    hold it is critical with no maintenance field."""
    import json

    from agent.report.events import CpuFallback

    fakes = Fakes("cpu_fallback", "cpu_fallback")
    job = HealthJob(_job(tmp_path, fakes, None).runtime, Hooks(
        health_run=fakes.run, health_payloads=lambda result: [CpuFallback(reason="no_gpu", fingerprint="f")]))
    job.check("interval", None)
    event = job.runtime.outbox.pending(10)[-1]
    assert (event.severity, event.payload.maintenance) == ("critical", None)
    Path(StatePaths(job.runtime.state_dir).maintenance).write_text(json.dumps({
        "scheduler": "slurm", "node": "gpu-07", "reason": "rollout r2-1a2b3c stage 0", "began_at_seconds": 1.0,
        "drained_by_us": True, "phase": "held", "detail": ""}))
    job.check("stack_changed:rocm", None)
    event = job.runtime.outbox.pending(10)[-1]
    assert (event.severity, event.kind, event.payload.maintenance) == ("warning", "cpu_fallback",
                                                                       "rollout r2-1a2b3c stage 0")
