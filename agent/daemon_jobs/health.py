"""The health job: run the health check through agent.health (when installed) and report what it found.

It runs on its own interval and after the snapshot job sees the kernel, driver, ROCm/CUDA or watched packages
move. The probe measures the machine the agent runs on, so with ``--root`` pointing elsewhere it is skipped.

One run (:meth:`HealthJob.check`) is one check in the mode the daemon's schedule asks for (health_schedule.py).
After a package change, with the policy's ``[health] after_change = "rollback"``, a ``cpu_fallback`` or ``failed``
result (or a ``regression`` that a second, full run confirms) restores the guarded packages kept before the change
(agent/guard/rollback/health.py), commits the ``rollback`` event (reason ``health``) and runs the check again.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, List, Optional

from agent.daemon_jobs.hooks import Hooks
from agent.daemon_jobs.protocol import AskedMode, HealthSummary
from agent.daemon_jobs.runtime import Runtime
from agent.errors import GpuguardError
from agent.log import get_logger

if TYPE_CHECKING:  # pragma: no cover
    from agent.health.model import HealthResult
    from agent.report.events import Rollback

log = get_logger("health_job")

def tenants_of_result(result: HealthResult) -> List[str]:
    """The other jobs on the GPUs a result saw, as ``gpu 0: pid 4242 (python3, 71.2 GiB)``."""
    occupancy = getattr(result, "occupancy", None)
    if occupancy is None:
        return []
    from agent.health.tenants import describe_tenant

    return [f"gpu {gpu.smi_index}: {describe_tenant(t)}" for gpu in occupancy.gpus for t in gpu.tenants]


def result_busy(result: HealthResult) -> bool:
    """True when another job used a GPU (the status is then busy or deferred, or a failure found beside it)."""
    occupancy = getattr(result, "occupancy", None)
    return str(result.status) in ("busy", "deferred") or bool(occupancy is not None and occupancy.busy_gpus)


def after_change_action(runtime: Runtime) -> str:
    """The compiled policy's ``[health] after_change``; "alert" without a compiled policy or when it is unreadable."""
    from agent.policy.compiled import read_compiled
    from agent.statepaths import StatePaths

    path = runtime.host.path(StatePaths(runtime.settings.state_dir).compiled_policy)
    if not path.exists():
        return "alert"
    try:
        return read_compiled(str(path)).health_after_change
    except (GpuguardError, OSError) as exc:
        log.warning("health_after_change_unknown", path=str(path), error=str(exc), action="alert")
        return "alert"


class HealthSkips:
    """When the health job does not run: disabled, or a Host root other than this machine (logged once)."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self._logged = False

    def skipped(self) -> bool:
        rt = self.runtime
        if not rt.settings.health_enabled:
            return True
        if not rt.host.is_live:
            if not self._logged:
                log.info("health_skipped", reason="the probe measures this machine, not the tree under --root",
                         root=str(rt.host.root))
                self._logged = True
            return True
        return False



def maintenance_hold(rt: Runtime) -> Optional[str]:
    """The reason of the maintenance hand-off holding this node now (agent/integrations/maintenance.py), or None;
    a damaged record is logged and counts as none (the events are then reported as they are)."""
    from agent.integrations.hold import read_state

    try:
        state = read_state(rt.host, rt.paths)
    except GpuguardError as exc:
        log.warning("maintenance_state_unreadable", error=str(exc))
        return None
    return None if state is None else state.reason

class HealthJob:
    """Calls the health runner; records its status, commits the events it raises, gates a change on it."""

    def __init__(self, runtime: Runtime, hooks: Hooks) -> None:
        self.runtime = runtime
        self.hooks = hooks
        self._skips = HealthSkips(runtime)
        self._restore_last_status()

    def _restore_last_status(self) -> None:
        load_last = self.hooks.health_last
        if load_last is None:
            return
        try:
            last = load_last(self.runtime.state_dir)
        except GpuguardError as exc:
            log.warning("health_last_result_unreadable", error=str(exc))
            return
        if last is not None:
            with self.runtime.state.lock:
                self.runtime.state.last_health_status = str(last.status)
                self.runtime.state.last_health_at_seconds = last.started_at.timestamp()
                self.runtime.state.last_health_after_change = None  # the stored result does not say

    def run(self, reason: str = "interval", mode: Optional[AskedMode] = None,
            after_change: bool = False) -> Optional[HealthSummary]:
        """One check unless disabled, under another root or not installed; what it found (None: no check ran)."""
        if self._skips.skipped() or self.hooks.health_run is None or self.hooks.health_payloads is None:
            return None
        return self.check(reason, mode, after_change)

    def check(self, reason: str, mode: Optional[AskedMode] = None, after_change: bool = False) -> HealthSummary:
        """Run the check (and, after a change, the gate): what the result that stands says."""
        result = self._once(reason, mode)
        gate = _Gate()
        if after_change:
            result = self._gate(reason, result, mode, gate)
        with self.runtime.state.lock:  # the heartbeat's last_health_after_change (the rollout's evidence)
            self.runtime.state.last_health_after_change = after_change
        return HealthSummary(status=str(result.status), at_seconds=self.runtime.state.last_health_at_seconds,
                             mode=mode, busy=result_busy(result), tenants=tuple(tenants_of_result(result)),
                             rollback=gate.rollback, reboot_required=gate.reboot_required,
                             recheck_status=gate.recheck_status)

    def _once(self, reason: str, mode: Optional[AskedMode]) -> HealthResult:
        rt = self.runtime
        run_check, payloads_for = self.hooks.health_run, self.hooks.health_payloads
        assert run_check is not None and payloads_for is not None
        started = time.monotonic()
        settings = rt.job_settings().health
        if mode is None:  # the configured mode (fakes in tests take no mode)
            result = run_check(rt.host, settings, rt.state_dir, snapshot=rt.state.last_snapshot)
        else:
            result = run_check(rt.host, settings, rt.state_dir, snapshot=rt.state.last_snapshot, mode=mode)
        payloads = list(payloads_for(result))
        hold = maintenance_hold(rt)
        for payload in payloads:
            if hold is not None:  # the node is out of service for a change: reported as maintenance, not a fault
                payload = payload.model_copy(update={"maintenance": hold[:300]})
            rt.emitter.emit(payload, severity="critical" if payload.kind == "cpu_fallback" and hold is None
                            else "warning")
        with rt.state.lock:
            rt.state.last_health_status = str(result.status)
            rt.state.last_health_at_seconds = time.time()
        log.info("health_job_done", reason=reason, mode=mode or "settings", status=str(result.status),
                 events=len(payloads), duration_seconds=round(time.monotonic() - started, 3))
        return result

    def _gate(self, reason: str, result: HealthResult, mode: Optional[AskedMode], gate: _Gate) -> HealthResult:
        """The policy's after_change on a post-change result; the result that stands (the recheck's, after one)."""
        from agent.guard.rollback.health import decide

        action = after_change_action(self.runtime)
        decision = decide(action, str(result.status))
        if decision == "confirm":
            log.info("health_regression_confirming", reason=reason, action=action)
            result = self._once("confirm_regression", "full")  # full: a busy GPU defers, never judges speed
            decision = decide(action, str(result.status), confirmed=True)
        if decision != "rollback" or self.hooks.health_rollback is None:
            return result
        rt = self.runtime
        trigger = str(result.status)

        def commit(event: Rollback) -> None:
            rt.emitter.emit(event, severity="warning" if event.succeeded else "critical")

        try:
            outcome = self.hooks.health_rollback(rt.host, rt.job_settings(), trigger, sink=commit)
        except Exception as exc:  # noqa: BLE001 - reported as a failed rollback, never the job's end
            from agent.report.events import Rollback

            detail = f"{type(exc).__name__}: {exc}"
            log.error("health_rollback_failed", error=detail, exc_info=not isinstance(exc, (GpuguardError, OSError)))
            commit(Rollback(reason="health", from_versions={}, to_versions={}, succeeded=False, health_status=trigger,
                            detail=f"the health-gated rollback failed: {detail}"[:4000]))
            gate.rollback = "failed"
            return result
        gate.rollback = str(outcome.status)
        gate.reboot_required = bool(getattr(outcome, "reboot_required", False))
        if outcome.status != "rolled_back":
            log.warning("health_rollback_not_done", status=outcome.status, detail=outcome.detail, health_status=trigger)
            return result
        recheck = self._once("after_health_rollback", mode)
        gate.recheck_status = str(recheck.status)
        if decide("rollback", str(recheck.status), confirmed=True) == "rollback":
            # Not retried: the kept set is used up, and health never rolls back to the set it removed.
            log.error("health_rollback_not_fixed", health_status=trigger, recheck_status=str(recheck.status))
        else:
            log.info("health_rollback_rechecked", health_status=trigger, recheck_status=str(recheck.status))
        return recheck


class _Gate:
    """What the after-change gate did in one check (HealthSummary's rollback fields)."""

    def __init__(self) -> None:
        self.rollback: Optional[str] = None
        self.reboot_required = False
        self.recheck_status: Optional[str] = None
