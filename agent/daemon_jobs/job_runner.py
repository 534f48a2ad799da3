"""How the daemon calls one job body for the scheduler: never raises, runs again when asked while running, reschedules.

The scheduler (agent/daemon_jobs/scheduler.py, wired in agent/daemon.py) calls a :class:`JobRunner` on its interval
and never more than once at a time; what a body returns or raises is the runner's to handle.
"""

from __future__ import annotations

import threading
import time
from typing import AbstractSet, Callable, Optional, Protocol

from agent.daemon_jobs.memory import release_free_memory
from agent.errors import Interrupted
from agent.log import get_logger

log = get_logger("daemon")

Body = Callable[[str], Optional[float]]


class Rescheduler(Protocol):
    """What a runner asks of the scheduler (agent/daemon_jobs/scheduler.py's IntervalScheduler)."""

    def run_in(self, job_id: str, delay_seconds: float) -> None:
        """Run the job ``delay_seconds`` from now."""


def without_retry(body: Callable[[str], None]) -> Body:
    """A body that never asks for an earlier run, as the runner calls it (None: the next interval)."""
    def call(reason: str) -> Optional[float]:
        body(reason)
        return None
    return call


class JobRunner:
    """Calls one job body for the scheduler: never raises, runs again when asked while running, reschedules.

    ``request(reason)`` asks for a run now. If the job is running at that moment the scheduler skips the extra run
    (a job never overlaps itself), so the running call notices the request and loops once more instead. Requests
    that arrive before the body takes the pending one are one run with the newest reason, except that a pending
    reason in ``sticky_reasons`` is not replaced by one outside them: the guard's ``package_change`` (check, then
    the snapshot and its post-change health check) must survive a ``policy_bundle_installed`` asked just after it.

    A failure is logged once per state change: ``job_failed`` (with the traceback) when the job starts failing or
    fails differently, ``job_recovered`` (with the count of failed runs) when it succeeds again. A job failing the
    same way on every run (the disk is full) does not flood the log.
    """

    def __init__(self, job_id: str, body: Callable[[str], Optional[float]], stopping: threading.Event,
                 after: Callable[[], None] = lambda: None, quiet: bool = False, trim: bool = True,
                 sticky_reasons: AbstractSet[str] = frozenset()) -> None:
        self.job_id = job_id
        self.sticky_reasons = sticky_reasons
        self.quiet = quiet
        self.trim = trim  # give freed memory back to the system after each run (agent/daemon_jobs/memory.py)
        self.body = body
        self.stopping = stopping
        self.after = after
        self.scheduler: Optional[Rescheduler] = None  # set when the job is added
        self._again = threading.Event()
        self._reason = "interval"
        self._pending = threading.Lock()  # the pending reason and the flag together
        self._busy = threading.Lock()
        self._failing: Optional[str] = None  # "Type: message" of the failure the log last reported
        self._failed_runs = 0

    def request(self, reason: str) -> None:
        with self._pending:
            if not (self._again.is_set() and self._reason in self.sticky_reasons
                    and reason not in self.sticky_reasons):
                self._reason = reason
            self._again.set()
        self.run_at(0.0)

    def run_at(self, delay_seconds: float) -> None:
        if self.scheduler is None or self.stopping.is_set():
            return
        try:
            self.scheduler.run_in(self.job_id, delay_seconds)
        except Exception as exc:  # noqa: BLE001 - never the runner's end: a job not (or no longer) scheduled
            log.debug("job_reschedule_skipped", job=self.job_id, error=str(exc))

    def wait_idle(self) -> None:
        """Return once the body is not running (it finishes its current step after ``stopping`` is set)."""
        with self._busy:
            pass

    def __call__(self) -> None:
        with self._busy:
            try:
                self._run()
            finally:
                if self.trim:
                    release_free_memory()

    def _run(self) -> None:
        reason = "interval"
        while not self.stopping.is_set():
            with self._pending:
                if self._again.is_set():
                    reason = self._reason
                self._again.clear()
            started = time.monotonic()
            try:
                retry_in = self.body(reason)
            except Interrupted as exc:  # the daemon is stopping: nothing failed
                log.info("job_interrupted", job=self.job_id, reason=reason, detail=str(exc))
                retry_in = None
            except Exception as exc:  # noqa: BLE001 - one job's failure is data, never the daemon's end
                self._failed(reason, exc)
                retry_in = None
            else:
                if self._failing is not None:
                    log.info("job_recovered", job=self.job_id, failed_runs=self._failed_runs, last_error=self._failing)
                    self._failing, self._failed_runs = None, 0
            if not self.quiet:
                log.debug("job_ran", job=self.job_id, reason=reason,
                          duration_seconds=round(time.monotonic() - started, 3))
            try:
                self.after()
            except Exception as exc:  # noqa: BLE001 - a failing after-hook must not end the job's loop
                log.error("job_after_failed", job=self.job_id, error=f"{type(exc).__name__}: {exc}")
            if self._again.is_set():
                continue  # asked again while running: now, not at the body's retry time
            if retry_in is not None:
                self.run_at(retry_in)
            return


    def _failed(self, reason: str, exc: Exception) -> None:
        error = f"{type(exc).__name__}: {exc}"
        self._failed_runs += 1
        if error == self._failing:
            log.debug("job_still_failing", job=self.job_id, reason=reason, error=error, failed_runs=self._failed_runs)
            return
        self._failing = error
        log.error("job_failed", job=self.job_id, reason=reason, error=error, failed_runs=self._failed_runs,
                  exc_info=True)
