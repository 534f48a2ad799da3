"""The health job: run the health check through agent.health (when installed) and report what it found.

It runs on its own interval and after the snapshot job sees the kernel, driver, ROCm/CUDA or watched packages
move. The probe measures the machine the agent runs on, so with ``--root`` pointing elsewhere it is skipped.

One run (:meth:`HealthJob.check`) is one check in the mode the daemon's schedule asks for (health_schedule.py).
After a package change, with the policy's ``[health] after_change = "rollback"``, a ``cpu_fallback`` or ``failed``
result (or a ``regression`` that a second, full run confirms) restores the guarded packages kept before the change
(agent/guard/rollback/health.py), commits the ``rollback`` event (reason ``health``) and runs the check again.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, List, Optional, Tuple

from agent.daemon_jobs.hooks import GuardedNow, Hooks
from agent.daemon_jobs.protocol import AskedMode, HealthSummary
from agent.daemon_jobs.runtime import Runtime
from agent.errors import GpuguardError
from agent.log import get_logger
from agent.report.plain import PlainWorkload, PlainWorkloadStack
from agent.wire import MAX_HEARTBEAT_WORKLOADS, MAX_STACK_TEXT_CHARS

if TYPE_CHECKING:  # pragma: no cover
    from agent.guard.rollback.health_gate import GateState
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


def workloads_of_result(result: HealthResult) -> Optional[Tuple[PlainWorkload, ...]]:
    """The registered workloads' verdicts for the heartbeat (the first MAX_HEARTBEAT_WORKLOADS, texts cut to their
    bound); None when the check ran none."""
    found = getattr(result, "workloads", None) or []
    if not found:
        return None

    def cut(text: Optional[str]) -> Optional[str]:
        return None if text is None else text[:MAX_STACK_TEXT_CHARS]

    return tuple(PlainWorkload(name=w.name, status=str(w.status), gates=w.gates, stack_id=w.stack_id,
                               stack=None if w.stack is None else PlainWorkloadStack(
                                   gpu_models=cut(w.stack.gpu_models), driver=cut(w.stack.driver),
                                   gpu_stack=cut(w.stack.gpu_stack), framework=cut(w.stack.framework),
                                   image=cut(w.stack.image)))
                 for w in found[:MAX_HEARTBEAT_WORKLOADS])


def result_busy(result: HealthResult) -> bool:
    """True when another job used a GPU (the status is then busy or deferred, or a failure found beside it)."""
    occupancy = getattr(result, "occupancy", None)
    return str(result.status) in ("busy", "deferred") or bool(occupancy is not None and occupancy.busy_gpus)


def after_change_action(runtime: Runtime) -> str:
    """The compiled policy's ``[health] after_change``; "alert" without a compiled policy or when it is unreadable."""
    from agent.policy.compiled import read_compiled
    from agent.statepaths import StatePaths

    path = runtime.host.file(StatePaths(runtime.settings.state_dir).compiled_policy)
    if not os.path.exists(path):
        return "alert"
    try:
        return read_compiled(path).health_after_change
    except (GpuguardError, OSError) as exc:
        log.warning("health_after_change_unknown", path=path, error=str(exc), action="alert")
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

    def __init__(self, runtime: Runtime, hooks: Hooks, clock: Callable[[], float] = time.time) -> None:
        self.runtime = runtime
        self.hooks = hooks
        self.clock = clock
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
                self.runtime.state.last_workloads = workloads_of_result(last)

    def run(self, reason: str = "interval", mode: Optional[AskedMode] = None,
            after_change: bool = False) -> Optional[HealthSummary]:
        """One check unless disabled, under another root or not installed; what it found (None: no check ran)."""
        if self._skips.skipped() or self.hooks.health_run is None or self.hooks.health_payloads is None:
            return None
        return self.check(reason, mode, after_change)

    def check(self, reason: str, mode: Optional[AskedMode] = None, after_change: bool = False) -> HealthSummary:
        """Run the check and judge it at the gate: what the result that stands says."""
        gate = _Gate()
        before = self._look(gate)
        result = self._once(reason, mode)
        after = self._look(gate)
        result = self._gate(reason, result, mode, gate, after_change, before, after)
        with self.runtime.state.lock:  # the heartbeat's last_health_after_change (the rollout's evidence)
            self.runtime.state.last_health_after_change = after_change
        return HealthSummary(status=str(result.status), at_seconds=self.runtime.state.last_health_at_seconds,
                             mode=mode, busy=result_busy(result), tenants=tuple(tenants_of_result(result)),
                             rollback=gate.rollback, reboot_required=gate.reboot_required,
                             recheck_status=gate.recheck_status, again=gate.again, covers=gate.covers[:2000])

    def _look(self, gate: _Gate, by: str = "package_manager") -> Optional[_Look]:
        """The guarded sets now, noted in the gate's window (a move since the last look is a change); None when the
        gate cannot follow (no compiled policy, not wired, a damaged state file: the set kept before the change is
        then what a rollback restores)."""
        from agent.guard.rollback.health_gate import GateStateDamaged, observe, update_gate

        rt, sets_now = self.runtime, self.hooks.guarded_sets
        if sets_now is None or gate.off:
            return None
        try:
            sets = sets_now(rt.host, rt.job_settings())
        except Exception as exc:  # noqa: BLE001 - the check is reported either way; the gate falls back
            log.warning("health_gate_sets_unreadable", error=f"{type(exc).__name__}: {exc}",
                        exc_info=not isinstance(exc, (GpuguardError, OSError)))
            return None
        if sets is None:
            return None
        now = self.clock()
        try:
            state = update_gate(self._gate_path(), lambda s: observe(s, sets.installed, now, by=by))
        except GateStateDamaged as exc:
            log.error("health_gate_state_damaged", error=str(exc), fallback="the set kept before the change")
            gate.off = True
            return None
        except OSError as exc:
            log.error("health_gate_state_unwritable", error=exc.strerror or str(exc),
                      fallback="the set kept before the change")
            gate.off = True
            return None
        return _Look(state, sets)

    def _gate_path(self) -> str:
        """health-gate.json where the guard's files are (under the Host root, as the guard's check writes it)."""
        return self.runtime.host.file(self.runtime.paths.health_gate)

    def _judged(self, change: Callable[[GateState], GateState]) -> Optional[GateState]:
        from agent.guard.rollback.health_gate import GateStateDamaged, update_gate

        try:
            return update_gate(self._gate_path(), change)
        except (GateStateDamaged, OSError) as exc:
            log.error("health_gate_state_unwritable", error=str(exc))
            return None

    def _passed(self, gate: _Gate, before: Optional[_Look], after: Optional[_Look], status: str) -> None:
        """A pass: the last set that passed when it covers the set installed throughout the check; else, when a
        change came during the check, a check after it (``again``)."""
        from agent.guard.rollback.health_gate import may_record_pass, record_pass

        if before is None or after is None:
            return
        if not may_record_pass(after.state, before.sets.installed, after.sets.installed, after.sets.known_good,
                               before.state.noted):
            if after.state.noted != before.state.noted or dict(before.sets.installed) != dict(after.sets.installed):
                gate.again = True  # the pass does not cover the change that came during it: a check after it
                log.info("health_gate_window_extended", changes=after.state.covered()[:500])
            return
        now, noted = self.clock(), after.state.noted

        def passed(s: GateState) -> GateState:
            return record_pass(s, after.sets.installed, now, status) if s.noted == noted else s

        state = self._judged(passed)
        if state is not None and state.verdict is not None and state.passed_at_seconds == now:
            gate.covers = after.state.covered() if after.state.window_open else ""
            if after.state.window_open:
                log.info("health_gate_passed", covers=gate.covers[:500], packages=len(after.sets.installed))
        elif state is not None:
            gate.again = True  # a change was noted between the look and the record

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
            rt.emitter.emit(payload, severity="critical" if payload.kind in ("cpu_fallback", "health_failed")
                            and hold is None else "warning")
        with rt.state.lock:
            rt.state.last_health_status = str(result.status)
            rt.state.last_health_at_seconds = self.clock()
            rt.state.last_workloads = workloads_of_result(result)
        log.info("health_job_done", reason=reason, mode=mode or "settings", status=str(result.status),
                 events=len(payloads), duration_seconds=round(time.monotonic() - started, 3))
        return result

    def _gate(self, reason: str, result: HealthResult, mode: Optional[AskedMode], gate: _Gate, after_change: bool,
              before: Optional[_Look], after: Optional[_Look]) -> HealthResult:
        """The policy's after_change on a result judged against the last set that passed; the result that stands
        (the recheck's, after a rollback)."""
        from agent.guard.rollback.health import decide
        from agent.guard.rollback.health_gate import gate_decision, judge

        if str(result.status) == "pass":
            self._passed(gate, before, after, "pass")
            return result
        window_open = after is not None and after.state.window_open
        action = after_change_action(self.runtime)
        decision = gate_decision(action, str(result.status), after_change, window_open)
        if decision == "confirm":
            log.info("health_regression_confirming", reason=reason, action=action)
            result = self._once("confirm_regression", "full")  # full: a busy GPU defers, never judges speed
            decision = gate_decision(action, str(result.status), after_change, window_open, confirmed=True)
            if str(result.status) == "pass":
                self._passed(gate, before, self._look(gate), "pass")
                return result
        if decision != "rollback" or self.hooks.health_rollback is None:
            return result
        rt = self.runtime
        trigger = str(result.status)
        target, covers = None, ""
        if after is not None:
            target = after.state.passed  # None: nothing passed yet here; the set kept before the change, as before
            covers = after.state.covered()
            gate.covers = covers
            now = self.clock()
            # Judged before apt runs: a crash half-way never leads to a second rollback for these changes.
            self._judged(lambda s: judge(s, now, trigger, "rolling_back"))

        def commit(event: Rollback) -> None:
            rt.emitter.emit(event, severity="warning" if event.succeeded else "critical")

        try:
            outcome = self.hooks.health_rollback(rt.host, rt.job_settings(), trigger, sink=commit, target=target,
                                                 covers=covers)
        except Exception as exc:  # noqa: BLE001 - reported as a failed rollback, never the job's end
            from agent.report.events import Rollback

            detail = f"{type(exc).__name__}: {exc}"
            log.error("health_rollback_failed", error=detail, exc_info=not isinstance(exc, (GpuguardError, OSError)))
            commit(Rollback(reason="health", from_versions={}, to_versions={}, succeeded=False, health_status=trigger,
                            detail=f"the health-gated rollback failed: {detail}"[:4000]))
            gate.rollback = "failed"
            self._outcome("failed")
            return result
        gate.rollback = str(outcome.status)
        gate.reboot_required = bool(getattr(outcome, "reboot_required", False))
        self._outcome(gate.rollback)
        if outcome.status != "rolled_back":
            log.warning("health_rollback_not_done", status=outcome.status, detail=outcome.detail, health_status=trigger,
                        covers=covers[:500])
            return result
        restored = self._look(gate, by="health_rollback")  # the gate's own move: the recheck judges it
        recheck = self._once("after_health_rollback", mode)
        gate.recheck_status = str(recheck.status)
        if decide("rollback", str(recheck.status), confirmed=True) == "rollback":
            # Not retried: the changes are judged, and health never rolls back to the set it removed.
            log.error("health_rollback_not_fixed", health_status=trigger, recheck_status=str(recheck.status))
        else:
            log.info("health_rollback_rechecked", health_status=trigger, recheck_status=str(recheck.status))
            if str(recheck.status) == "pass":
                self._passed(gate, restored, self._look(gate), "pass")
        return recheck

    def _outcome(self, outcome: str) -> None:
        """What came of the verdict's rollback, in the gate's last verdict (gpuguard status)."""
        import dataclasses

        def settle(s: GateState) -> GateState:
            if s.verdict is None or s.verdict.outcome != "rolling_back":
                return s
            return dataclasses.replace(s, verdict=dataclasses.replace(s.verdict, outcome=outcome))

        self._judged(settle)


class _Gate:
    """What the after-change gate did in one check (HealthSummary's rollback fields)."""

    def __init__(self) -> None:
        self.rollback: Optional[str] = None
        self.reboot_required = False
        self.recheck_status: Optional[str] = None
        self.again = False  # a change came during the check: a check after it
        self.covers = ""  # the changes the verdict covers, for people
        self.off = False  # the gate's state cannot be used in this check (damaged, unwritable)


@dataclass(frozen=True)
class _Look:
    """The gate's window and the guarded sets at one moment of a check."""

    state: GateState
    sets: GuardedNow
