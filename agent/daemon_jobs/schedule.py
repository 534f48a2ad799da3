"""The daemon's scheduler: one thread per job, each sleeping until its job's next run time or a request.

What the daemon used apscheduler's BackgroundScheduler for, in the stdlib (apscheduler brought importlib.metadata,
tzlocal and asyncio into the resident process: about 2 MiB; issue #17). The guarantees the jobs rely on:

- a job never overlaps itself (its own thread runs it) and a slow job never holds up another (each has a thread);
- interval runs keep their phase: after a run due at T the next is due at T + interval, and runs missed while the
  job was busy (or the host suspended) collapse into one;
- ``modify_job(next_run_time=...)`` moves the next run; a run asked for while the job is running happens after it
  only if the job still says it is wanted (``pending``): ``JobRunner`` loops over requests that arrive while it
  runs, so a request it already served is not run a second time;
- ``shutdown`` stops dispatching at once; it does not wait for a running job (the daemon waits per job).
"""

from __future__ import annotations

import datetime as dt
import threading
import time
from typing import Callable, Dict, Optional

_UTC = dt.timezone.utc


class JobLookupError(KeyError):
    """No job of that id (or the scheduler is shut down)."""


class _Job:
    def __init__(self, job_id: str, func: Callable[[], None], interval_seconds: float, first_monotonic: float,
                 pending: Callable[[], bool]) -> None:
        self.job_id = job_id
        self.func = func
        self.interval_seconds = interval_seconds
        self.next_monotonic = first_monotonic
        self.pending = pending
        self.running = False
        self.asked_while_running = False
        self.thread: Optional[threading.Thread] = None


class Scheduler:
    """Interval jobs on their own threads; the subset of apscheduler's interface the daemon uses."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._jobs: Dict[str, _Job] = {}
        self._cond = threading.Condition()
        self._stopped = False
        self._started = False

    def add_job(self, func: Callable[[], None], job_id: str, interval_seconds: float, first_in_seconds: float,
                pending: Callable[[], bool] = lambda: False) -> None:
        job = _Job(job_id, func, interval_seconds, self._clock() + first_in_seconds, pending)
        with self._cond:
            self._jobs[job_id] = job
            if self._started:
                self._start_thread(job)

    def start(self) -> None:
        with self._cond:
            self._started = True
            for job in self._jobs.values():
                self._start_thread(job)

    def modify_job(self, job_id: str, next_run_time: dt.datetime) -> None:
        """Run the job at ``next_run_time`` (an aware datetime) instead of its next interval run."""
        delay = (next_run_time - dt.datetime.now(_UTC)).total_seconds()
        with self._cond:
            job = self._job(job_id)
            if job.running and delay <= 0:
                job.asked_while_running = True
            else:
                job.next_monotonic = self._clock() + max(0.0, delay)
            self._cond.notify_all()

    def reschedule_job(self, job_id: str, trigger: str = "interval", seconds: float = 0.0) -> None:
        """A new interval, counted from now."""
        if trigger != "interval":
            raise ValueError(f"only interval triggers, not {trigger!r}")
        with self._cond:
            job = self._job(job_id)
            job.interval_seconds = seconds
            job.next_monotonic = self._clock() + seconds
            self._cond.notify_all()

    def shutdown(self, wait: bool = False) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify_all()
            threads = [job.thread for job in self._jobs.values() if job.thread is not None]
        if wait:
            for thread in threads:
                if thread is not threading.current_thread():
                    thread.join()

    def _job(self, job_id: str) -> _Job:
        if self._stopped or job_id not in self._jobs:
            raise JobLookupError(job_id)
        return self._jobs[job_id]

    def _start_thread(self, job: _Job) -> None:
        job.thread = threading.Thread(target=self._loop, args=(job,), name=f"job-{job.job_id}", daemon=True)
        job.thread.start()

    def _loop(self, job: _Job) -> None:
        while True:
            with self._cond:
                while not self._stopped:
                    wait = job.next_monotonic - self._clock()
                    if wait <= 0:
                        break
                    self._cond.wait(wait)
                if self._stopped:
                    return
                due = job.next_monotonic
                now = self._clock()
                # The next interval run after now, keeping the phase; missed runs collapse into this one.
                skipped = int((now - due) // job.interval_seconds) if job.interval_seconds > 0 else 0
                job.next_monotonic = due + (skipped + 1) * job.interval_seconds
                job.running, job.asked_while_running = True, False
            try:
                job.func()
            except Exception:  # noqa: BLE001, S110 - the job's own runner logs; a stray error never ends its thread
                pass
            finally:
                with self._cond:
                    job.running = False
                    if job.asked_while_running and job.pending():
                        job.next_monotonic = self._clock()
