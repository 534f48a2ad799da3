"""When the health check runs, and in which mode: after a package change, and while the GPUs are busy.

The daemon's ``health`` job body. Production GPUs are busy most of the time, and a check never judges speed beside
another job (docs/health.md "Busy GPUs"), so:

    package change (snapshot: stack moved) -> mode functional now (correct work on every GPU, no fallback)
    a change during a check (gate: again)  -> the same, at once: the check after that change
        pass on idle GPUs                  -> the full check (the configured mode) right away
        busy (passed beside a job)         -> deferral: the full comparison later
    busy / deferred result                 -> deferral: retry with mode full after defer_first_retry_seconds,
                                              doubling up to defer_max_retry_seconds, for defer_window_seconds
        a result that is neither           -> the deferral ends (a pass, or a finding: that is reported as such)
        the window closes, still busy      -> health_deferred (tenants of the last attempt), back to the interval

A deferral in progress is written to ``health-deferral.json`` in the state directory for ``gpuguard status``.
``check(reason, mode, after_change)`` is the in-process HealthJob.run or the child (children.HealthInChild.run);
the after-change rollback decision is taken there, where the result is.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import time
from dataclasses import dataclass, field
from typing import Callable, List, Optional

from agent.daemon_jobs.protocol import AskedMode, HealthSummary
from agent.daemon_jobs.runtime import Runtime
from agent.files import write_atomically
from agent.log import get_logger
from agent.report.plain import PlainHealthDeferred

log = get_logger("health_schedule")

STACK_CHANGED_PREFIX = "stack_changed"
WAITING_STATUSES = frozenset({"busy", "deferred"})

# One check (reason, mode, after_change): what it found, None when none ran (disabled, another root, not installed).
CheckFunction = Callable[[str, Optional[AskedMode], bool], Optional[HealthSummary]]


@dataclass
class Deferral:
    """A full check waiting for idle GPUs."""

    since_seconds: float
    next_delay_seconds: float
    after_change: bool
    attempts: int = 0
    last_status: str = "busy"
    tenants: List[str] = field(default_factory=list)


class HealthSchedule:
    """Picks each run's mode, retries a check the GPUs' other jobs kept from running, reports when they never stop."""

    def __init__(self, runtime: Runtime, check: CheckFunction, clock: Callable[[], float] = time.time) -> None:
        self.runtime = runtime
        self.check = check
        self.clock = clock
        self.deferral: Optional[Deferral] = None
        self._after_change = False  # the comparison after a package change has not run yet
        self._change_pending = False  # a change came during the last check: the next one is the check after it
        self._forget_file()  # a deferral of an earlier daemon is not this one's

    def run(self, reason: str = "interval") -> Optional[float]:
        """One check; the seconds until the next one when it is sooner than the interval (None: the interval)."""
        if reason.startswith(STACK_CHANGED_PREFIX) or self._change_pending:
            self._change_pending = False
            self._after_change = True
            self._end()  # a new change restarts from its functional check
            mode: Optional[AskedMode] = "functional"
        elif self.deferral is not None:
            mode = "full"
        else:
            mode = None  # the configured mode (auto)
        summary = self.check(reason, mode, self._after_change)
        if summary is None:  # disabled, another root, not installed
            return None
        status = summary.status
        if summary.again:  # a change came during the check: the same window, and a check after it at once
            log.info("health_check_after_change_during_check", status=status, covers=summary.covers[:500])
            self._change_pending = True
            return 0.0
        if summary.rollback:
            self._after_change = False  # that change was judged (and its recheck ran)
            self._end()
            return None
        if status in WAITING_STATUSES:
            return self._defer(summary)
        if mode == "functional" and status == "pass" and not summary.busy:
            log.info("health_full_after_change", reason=reason)
            return 0.0
        self._after_change = False
        if self.deferral is not None:
            log.info("health_deferral_ended", status=status, attempts=self.deferral.attempts,
                     waited_seconds=round(self.clock() - self.deferral.since_seconds, 1))
        self._end()
        return None

    def _defer(self, summary: HealthSummary) -> Optional[float]:
        settings = self.runtime.settings
        now = self.clock()
        d = self.deferral
        if d is None:
            d = self.deferral = Deferral(since_seconds=now, next_delay_seconds=settings.defer_first_retry_seconds,
                                         after_change=self._after_change)
        d.attempts += 1
        d.last_status = summary.status
        d.tenants = list(summary.tenants[:50])
        waited = now - d.since_seconds
        if waited >= settings.defer_window_seconds:
            self._report(d, settings.defer_window_seconds)
            self._after_change = False
            self._end()
            return None
        # The last retry lands on the window's end, so health_deferred is reported then and not up to a delay later.
        delay = max(1.0, min(d.next_delay_seconds, settings.defer_window_seconds - waited))
        d.next_delay_seconds = min(d.next_delay_seconds * 2, max(settings.defer_max_retry_seconds,
                                                                 settings.defer_first_retry_seconds))
        log.info("health_check_deferred", status=d.last_status, attempt=d.attempts, retry_in_seconds=round(delay, 1),
                 after_change=d.after_change, tenants=d.tenants[:5])
        self._write_file(d, now + delay)
        return delay

    def _report(self, d: Deferral, window_seconds: float) -> None:
        since = dt.datetime.fromtimestamp(d.since_seconds, dt.timezone.utc)
        detail = ("the comparison after a package change " if d.after_change else "the full check ") + \
            f"found no idle moment in {window_seconds:g} s; back to the normal interval"
        self.runtime.emitter.emit(PlainHealthDeferred(deferred_since=since, window_seconds=window_seconds,
                                                      attempts=d.attempts, last_status=d.last_status,
                                                      after_change=d.after_change, tenants=tuple(d.tenants),
                                                      detail=detail), severity="warning")
        log.warning("health_deferred_window_closed", attempts=d.attempts, window_seconds=window_seconds,
                    after_change=d.after_change, tenants=d.tenants[:5])

    def _end(self) -> None:
        if self.deferral is not None:
            self.deferral = None
            self._forget_file()

    def _path(self) -> str:
        return self.runtime.paths.health_deferral

    def _write_file(self, d: Deferral, next_attempt_seconds: float) -> None:
        def iso(seconds: float) -> str:
            return dt.datetime.fromtimestamp(seconds, dt.timezone.utc).isoformat()

        data = {"since": iso(d.since_seconds), "next_attempt_at": iso(next_attempt_seconds), "attempts": d.attempts,
                "last_status": d.last_status, "after_change": d.after_change, "tenants": d.tenants,
                "window_seconds": self.runtime.settings.defer_window_seconds}
        try:
            write_atomically(self._path(), json.dumps(data, indent=2, sort_keys=True) + "\n")
        except OSError as exc:  # status only: the deferral itself lives in memory
            log.warning("health_deferral_file_failed", path=self._path(), error=exc.strerror or str(exc))

    def _forget_file(self) -> None:
        try:
            os.unlink(self._path())
        except FileNotFoundError:
            pass
        except OSError as exc:
            log.warning("health_deferral_file_failed", path=self._path(), error=exc.strerror or str(exc))
