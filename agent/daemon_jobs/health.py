"""The health job: run the health check through agent.health (when installed) and report what it found.

It runs on its own interval and after the snapshot job sees the kernel, driver, ROCm/CUDA or watched packages
move. The probe measures the machine the agent runs on, so with ``--root`` pointing elsewhere it is skipped.
"""

from __future__ import annotations

import time

from agent.daemon_jobs.hooks import Hooks
from agent.daemon_jobs.runtime import Runtime
from agent.errors import GpuguardError
from agent.log import get_logger

log = get_logger("health_job")

# Payload kinds the health check raises, and the severity they are reported with.
_SEVERITY = {"cpu_fallback": "critical", "health_regression": "warning"}


class HealthJob:
    """Calls the health runner; records its status, commits the events it raises."""

    def __init__(self, runtime: Runtime, hooks: Hooks) -> None:
        self.runtime = runtime
        self.hooks = hooks
        self._skip_logged = False
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

    def run(self, reason: str = "interval") -> None:
        rt = self.runtime
        if not rt.settings.daemon.health_enabled:
            return
        if not rt.host.is_live:
            if not self._skip_logged:
                log.info("health_skipped", reason="the probe measures this machine, not the tree under --root",
                         root=str(rt.host.root))
                self._skip_logged = True
            return
        run_check, payloads_for = self.hooks.health_run, self.hooks.health_payloads
        if run_check is None or payloads_for is None:
            return
        started = time.monotonic()
        result = run_check(rt.host, rt.settings.health, rt.state_dir, snapshot=rt.state.last_snapshot)
        payloads = list(payloads_for(result))
        for payload in payloads:
            rt.emitter.emit(payload, severity=_SEVERITY.get(payload.kind, "warning"))  # type: ignore[arg-type]
        with rt.state.lock:
            rt.state.last_health_status = str(result.status)
            rt.state.last_health_at_seconds = time.time()
        log.info("health_job_done", reason=reason, status=str(result.status), events=len(payloads),
                 duration_seconds=round(time.monotonic() - started, 3))
