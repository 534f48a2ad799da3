"""The health job's schedule: functional right after a change, retries with backoff while the GPUs are busy,
health_deferred when the window closes, a pass ending the deferral (fake checks, a fake clock)."""

from __future__ import annotations

import json
import types
from pathlib import Path
from typing import Any, List, Optional, Tuple

from agent.config import Settings
from agent.daemon_jobs.health import HealthJob
from agent.daemon_jobs.health_schedule import HealthSchedule
from agent.daemon_jobs.hooks import Hooks
from agent.daemon_jobs.protocol import HealthSummary
from agent.host import Host
from agent.report.events import CpuFallback
from tests.daemon.test_jobs import make_runtime

WINDOW = {"health": {"defer_window_seconds": 3600, "defer_first_retry_seconds": 300,
                     "defer_max_retry_seconds": 1200}}
TENANT = "gpu 0: pid 4242 (python3, 71.2 GiB)"


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


class FakeCheck:
    """Answers each call with the next summary and records (reason, mode, after_change)."""

    def __init__(self, *statuses: str, busy: bool = False) -> None:
        self.statuses = list(statuses)
        self.busy = busy
        self.calls: List[Tuple[str, Optional[str], bool]] = []

    def __call__(self, reason: str, mode: Optional[str], after_change: bool) -> Optional[HealthSummary]:
        self.calls.append((reason, mode, after_change))
        status = self.statuses.pop(0) if len(self.statuses) > 1 else self.statuses[0]
        waiting = status in ("busy", "deferred")
        return HealthSummary(status=status, at_seconds=None, busy=waiting or self.busy,
                             tenants=(TENANT,) if waiting else ())


def _schedule(tmp_path: Path, check: Any) -> Tuple[HealthSchedule, Clock, Any]:
    rt = make_runtime(tmp_path, Host(root=Path("/")), Settings.model_validate(WINDOW))
    clock = Clock()
    return HealthSchedule(rt, check, clock=clock), clock, rt


def _run_retries(schedule: HealthSchedule, clock: Clock, reason: str = "interval") -> List[Optional[float]]:
    """Run as the JobRunner would: again after each returned delay, until the schedule returns None."""
    delays = [schedule.run(reason)]
    while delays[-1] is not None and len(delays) < 50:
        clock.now += delays[-1]
        delays.append(schedule.run("interval"))
    return delays


def test_busy_twice_then_pass_retries_with_doubling_backoff_and_ends(tmp_path: Path) -> None:
    """busy -> retry in 300 s (mode full) -> busy -> 600 s -> pass: the deferral ends, nothing reported."""
    check = FakeCheck("busy", "busy", "pass")
    schedule, clock, rt = _schedule(tmp_path, check)
    assert schedule.run("interval") == 300
    state = json.loads(Path(rt.paths.health_deferral).read_text())
    assert state["attempts"] == 1 and state["tenants"] == [TENANT] and state["last_status"] == "busy"
    clock.now += 300
    assert schedule.run("interval") == 600
    clock.now += 600
    assert schedule.run("interval") is None
    assert [mode for _, mode, _ in check.calls] == [None, "full", "full"]
    assert schedule.deferral is None and not Path(rt.paths.health_deferral).exists()
    assert rt.outbox.depth() == 0


def test_busy_for_the_whole_window_reports_health_deferred_once_and_returns_to_the_interval(tmp_path: Path) -> None:
    """300, 600, 1200 (the max), then the remainder to the window's end; at the end one health_deferred."""
    check = FakeCheck("busy", "deferred")
    schedule, clock, rt = _schedule(tmp_path, check)
    started = clock.now
    delays = _run_retries(schedule, clock)
    assert delays == [300, 600, 1200, 1200, 300, None]
    assert clock.now - started == 3600
    [event] = rt.outbox.pending(10)
    assert (event.kind, event.severity) == ("health_deferred", "warning")
    p = event.payload
    assert (p.attempts, p.last_status, p.window_seconds, p.after_change, p.tenants) == (
        6, "deferred", 3600, False, [TENANT])
    assert p.deferred_since.timestamp() == started
    # back to the normal interval: the next run is the configured mode, a new deferral if still busy
    assert schedule.run("interval") == 300 and check.calls[-1][1] is None


def test_after_a_change_functional_at_once_then_the_full_check_on_idle_gpus(tmp_path: Path) -> None:
    """stack_changed -> functional (pass, idle) -> the full check right away (0 s), as after-change checks."""
    check = FakeCheck("pass")
    schedule, clock, rt = _schedule(tmp_path, check)
    assert schedule.run("stack_changed:dpkg") == 0.0
    assert schedule.run("interval") is None
    assert check.calls == [("stack_changed:dpkg", "functional", True), ("interval", None, True)]
    assert schedule.run("interval") is None and check.calls[-1] == ("interval", None, False)


def test_after_a_change_on_a_busy_host_the_comparison_waits_for_an_idle_moment(tmp_path: Path) -> None:
    """Functional passed beside a job (busy): full retries, still marked after-change, until it passes."""
    check = FakeCheck("busy", "deferred", "pass")
    schedule, clock, rt = _schedule(tmp_path, check)
    assert _run_retries(schedule, clock, "stack_changed:rocm") == [300, 600, None]
    assert check.calls == [("stack_changed:rocm", "functional", True), ("interval", "full", True),
                           ("interval", "full", True)]
    assert rt.outbox.depth() == 0


def test_a_change_during_a_deferral_starts_over_from_its_functional_check(tmp_path: Path) -> None:
    """A stack change during a deferral starts the deferral over with a functional check after the change."""
    check = FakeCheck("busy")
    schedule, clock, rt = _schedule(tmp_path, check)
    schedule.run("interval")
    clock.now += 300
    schedule.run("interval")
    assert schedule.deferral is not None and schedule.deferral.attempts == 2
    assert schedule.run("stack_changed:kernel") == 300
    assert check.calls[-1][1:] == ("functional", True) and schedule.deferral.attempts == 1
    assert schedule.deferral.after_change


def test_a_finding_ends_the_deferral_without_health_deferred(tmp_path: Path) -> None:
    """A retry that finds a problem ends the deferral and queues no health_deferred event."""
    check = FakeCheck("busy", "cpu_fallback")
    schedule, clock, rt = _schedule(tmp_path, check)
    assert _run_retries(schedule, clock) == [300, None]
    assert schedule.deferral is None and rt.outbox.depth() == 0


def test_a_disabled_check_changes_nothing(tmp_path: Path) -> None:
    """With the health check turned off a stack change schedules nothing and starts no deferral."""
    schedule, clock, rt = _schedule(tmp_path, lambda reason, mode, after_change: None)
    assert schedule.run("stack_changed:dpkg") is None and schedule.deferral is None


# --- with the real HealthJob and a fake runner -----------------------------------------------------------------

def test_health_job_passes_the_mode_to_the_runner_and_names_the_tenants(tmp_path: Path) -> None:
    """The schedule's mode reaches run_health_check(mode=...); busy tenants come from the result's occupancy."""
    modes: List[Optional[str]] = []
    tenant = types.SimpleNamespace(pid=4242, name="python3", name_unresolved=None, used_memory_bytes=None)
    busy_gpu = types.SimpleNamespace(smi_index=0, tenants=[tenant], busy=True)
    results = [types.SimpleNamespace(status="busy", occupancy=types.SimpleNamespace(gpus=[busy_gpu],
                                                                                     busy_gpus=[busy_gpu])),
               types.SimpleNamespace(status="cpu_fallback", occupancy=None)]

    def run_health_check(host: Host, settings: Any, state_dir: str, snapshot: Any = None,
                         mode: Optional[str] = None) -> Any:
        modes.append(mode)
        return results.pop(0)

    def payloads(result: Any) -> List[Any]:
        return [CpuFallback(reason="ran_on_cpu", fingerprint="fp")] if result.status == "cpu_fallback" else []

    rt = make_runtime(tmp_path, Host(root=Path("/")), Settings.model_validate(WINDOW))
    job = HealthJob(rt, Hooks(health_run=run_health_check, health_payloads=payloads))
    clock = Clock()
    schedule = HealthSchedule(rt, job.run, clock=clock)
    assert schedule.run("stack_changed:dpkg") == 300
    assert schedule.deferral is not None and schedule.deferral.tenants == ["gpu 0: pid 4242 (python3)"]
    clock.now += 300
    assert schedule.run("interval") is None
    assert modes == ["functional", "full"]
    assert [e.kind for e in rt.outbox.pending(10)] == ["cpu_fallback"]
    assert rt.state.last_health_status == "cpu_fallback"
