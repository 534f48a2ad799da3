"""The resident's scheduler: each job on its own thread, every interval, never overlapping itself (stdlib only).

It keeps what the daemon asked of apscheduler's BackgroundScheduler (an interval trigger per job, a thread pool
larger than the number of jobs, ``max_instances=1``, ``coalesce=True``, no misfire limit): a job never overlaps
itself, runs missed while it was busy collapse into one, and a slow job (a health check) never holds up the others.
The times a job runs at are apscheduler's: after a run started at its due time T the next is due at T + interval;
due times that pass while the job is still running are skipped (logged at debug, ``job_skipped_still_running``)
and the next is the first T + k * interval after the run ends; :meth:`IntervalScheduler.run_in` moves the next due
time (the grid then counts from it) and :meth:`IntervalScheduler.set_interval` starts a new interval from now.
Waits are measured on the monotonic clock, so a step of the wall clock neither stalls nor bunches the jobs; the
clock and the wait are parameters, so tests run the scheduler on a virtual clock that a loaded machine cannot slow.

Why not apscheduler in the resident (issue #28): imported, apscheduler brings multiprocessing (for its process
pool executor), importlib.metadata with email and zipfile (its plugin entry points, read when the scheduler class is
defined), tzlocal and zoneinfo: 5.7 MiB of the resident's 25 (docs/reporting.md, "A resident without apscheduler").
This loop is the part of it the daemon used; tests/daemon/test_scheduler.py checks it against apscheduler's
BackgroundScheduler set up as the daemon had it.
"""

from __future__ import annotations

import threading
import time
from typing import Callable, Dict, List, Optional

from agent.log import get_logger

log = get_logger("daemon")

Clock = Callable[[], float]
# Waits on the scheduler's condition (its lock held) until notified or ``seconds`` of the clock have passed; may
# return early, as Condition.wait may: the loop looks at the clock again.
Wait = Callable[[threading.Condition, float], object]


def _condition_wait(condition: threading.Condition, seconds: float) -> object:
    return condition.wait(seconds)


class _Job:
    __slots__ = ("job_id", "func", "interval_seconds", "due", "thread")

    def __init__(self, job_id: str, func: Callable[[], None], interval_seconds: float, due: float) -> None:
        self.job_id = job_id
        self.func = func
        self.interval_seconds = interval_seconds
        self.due = due  # on the clock
        self.thread: Optional[threading.Thread] = None


def following(due: float, interval_seconds: float, now: float) -> float:
    """The first ``due + k * interval_seconds`` (k >= 1) after ``now``: the due times up to now are coalesced."""
    missed = int((now - due) // interval_seconds) if now > due else 0
    return due + (missed + 1) * interval_seconds


class IntervalScheduler:
    """Runs each added job on its own thread at its interval, from :meth:`start` until :meth:`shutdown`."""

    def __init__(self, clock: Clock = time.monotonic, wait: Wait = _condition_wait) -> None:
        self._clock = clock
        self._wait = wait
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._jobs: Dict[str, _Job] = {}
        self._started = False
        self._stopped = False

    def add(self, job_id: str, func: Callable[[], None], interval_seconds: float, first_in_seconds: float) -> None:
        """Run ``func`` every ``interval_seconds``, the first time ``first_in_seconds`` from now."""
        if interval_seconds <= 0:
            raise ValueError(f"job {job_id}: interval_seconds must be positive, got {interval_seconds}")
        with self._lock:
            if job_id in self._jobs:
                raise ValueError(f"job {job_id} is scheduled already")
            job = _Job(job_id, func, interval_seconds, self._clock() + max(first_in_seconds, 0.0))
            self._jobs[job_id] = job
            if self._started and not self._stopped:
                self._start_thread(job)

    def run_in(self, job_id: str, delay_seconds: float) -> None:
        """Move the job's next due time to ``delay_seconds`` from now; KeyError for a job never added."""
        with self._lock:
            self._jobs[job_id].due = self._clock() + max(delay_seconds, 0.0)
            self._wake.notify_all()

    def set_interval(self, job_id: str, interval_seconds: float) -> None:
        """A new interval for the job, the next run one new interval from now (apscheduler's reschedule_job)."""
        if interval_seconds <= 0:
            raise ValueError(f"job {job_id}: interval_seconds must be positive, got {interval_seconds}")
        with self._lock:
            job = self._jobs[job_id]
            job.interval_seconds = interval_seconds
            job.due = self._clock() + interval_seconds
            self._wake.notify_all()

    def job_ids(self) -> List[str]:
        with self._lock:
            return list(self._jobs)

    def start(self) -> None:
        """Start every job's thread (once)."""
        with self._lock:
            if self._started:
                return
            self._started = True
            for job in self._jobs.values():
                self._start_thread(job)

    def shutdown(self) -> None:
        """No job starts again; a running one finishes (not waited for here: the daemon waits for its runners)."""
        with self._lock:
            self._stopped = True
            self._wake.notify_all()

    def _start_thread(self, job: _Job) -> None:
        # A daemon thread, as apscheduler's scheduler thread: a process ending without shutdown() is not held up by
        # a thread waiting for its next run; the daemon's stop waits for running bodies itself.
        job.thread = threading.Thread(target=self._loop, args=(job,), name=f"job-{job.job_id}", daemon=True)
        job.thread.start()

    def _loop(self, job: _Job) -> None:
        while True:
            with self._lock:
                while not self._stopped:
                    wait_seconds = job.due - self._clock()
                    if wait_seconds <= 0:
                        break
                    self._wait(self._wake, wait_seconds)
                if self._stopped:
                    return
                job.due = following(job.due, job.interval_seconds, self._clock())
            try:
                job.func()
            except Exception as exc:  # noqa: BLE001 - a job's failure never ends its thread (JobRunner never raises)
                log.error("job_raised", job=job.job_id, error=f"{type(exc).__name__}: {exc}", exc_info=True)
            with self._lock:
                now = self._clock()
                skipped = job.due <= now and not self._stopped
                if skipped:  # came due while running: skipped, as max_instances=1 skipped it; the next is on from it
                    job.due = following(job.due, job.interval_seconds, now)
            if skipped:
                log.debug("job_skipped_still_running", job=job.job_id)
