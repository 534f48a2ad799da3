"""The hub's periodic work on one apscheduler scheduler: the retention pass and the rollout tick.

Each job runs at its interval on the scheduler's thread pool, never two runs of one job at once, missed runs merged
into one (apscheduler's ``max_instances=1``, ``coalesce=True``). ``run_soon`` moves a job's next run forward (the
rollout tick when failing evidence arrives), never sooner than ``min_gap_seconds`` after its last run ended; asked
while the job runs, it runs the job again right after (``min_gap_seconds`` later, on the same thread): apscheduler
would skip a run due while one is in flight, so the nudge would wait for the next interval (issue #43). A job
that raises is logged and runs again at its next time: periodic work never takes the hub down. A run longer than
its interval (a rollout evaluation over a large fleet on a busy machine: its next tick is merged into it) is logged
as ``hub_periodic_job_overran`` with both times, so an operator (and bench/bench_hub_load.py) sees the ticks lost.

The hub is a long-running server whose memory is not the agent's budget, so it uses apscheduler; the agent's
resident daemon schedules with a small stdlib loop instead (agent/daemon_jobs/scheduler.py: apscheduler's imports
cost it 5.7 MiB, issue #28).
"""

from __future__ import annotations

import datetime as dt
import threading
import time
from typing import Callable, Dict, List, Set

from apscheduler.executors.pool import ThreadPoolExecutor
from apscheduler.schedulers.background import BackgroundScheduler

from agent.errors import StoreError
from agent.log import get_logger

log = get_logger("hub.periodic")


class Periodic:
    """Named jobs at intervals; ``start`` once the store is open, ``stop`` before it closes."""

    def __init__(self) -> None:
        self._scheduler = BackgroundScheduler(
            executors={"default": ThreadPoolExecutor(max_workers=4)},
            job_defaults={"coalesce": True, "max_instances": 1, "misfire_grace_time": None},
            timezone=dt.timezone.utc)
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._running = 0
        self._last_ended: Dict[str, dt.datetime] = {}
        self._min_gap_seconds: Dict[str, float] = {}
        self._interval_seconds: Dict[str, float] = {}
        self._in_flight: Set[str] = set()
        self._again: Set[str] = set()  # asked to run soon while in flight: run again once the run ends
        self._stopping = threading.Event()

    def add(self, name: str, body: Callable[[], object], interval_seconds: float, first_after_seconds: float,
            min_gap_seconds: float = 0.0) -> None:
        """Run ``body`` every ``interval_seconds``, the first time ``first_after_seconds`` after ``start``."""
        self._min_gap_seconds[name] = min(min_gap_seconds, interval_seconds)
        self._interval_seconds[name] = interval_seconds
        self._scheduler.add_job(self._guarded, "interval", args=(name, body), id=name, name=name,
                                seconds=interval_seconds,
                                next_run_time=_now() + dt.timedelta(seconds=first_after_seconds))

    def run_soon(self, name: str) -> None:
        """Run the job now, or once its minimum gap after the last run has passed (a run in flight: right after it,
        so what it was asked for is not lost); never blocks."""
        with self._lock:
            if name in self._in_flight:
                self._again.add(name)
                return
            ended = self._last_ended.get(name)
        due = _now()
        if ended is not None:
            due = max(due, ended + dt.timedelta(seconds=self._min_gap_seconds.get(name, 0.0)))
        job = self._scheduler.get_job(name)
        if job is not None and job.next_run_time is not None and due < job.next_run_time:
            job.modify(next_run_time=due)

    def job_names(self) -> List[str]:
        """The jobs added, in the order they were."""
        return [job.id for job in self._scheduler.get_jobs()]

    def start(self) -> None:
        self._scheduler.start()

    def stop(self, timeout_seconds: float = 10.0) -> None:
        """Stop scheduling and wait up to ``timeout_seconds`` for the runs in flight (each job ends its own work at
        its stop signal: RetentionWorker.stop; a rollout tick is one transaction), as a thread join would."""
        self._stopping.set()
        if self._scheduler.running:
            self._scheduler.shutdown(wait=False)
        with self._idle:
            self._idle.wait_for(lambda: self._running == 0, timeout_seconds)

    def _guarded(self, name: str, body: Callable[[], object]) -> None:
        with self._lock:
            self._running += 1
            self._in_flight.add(name)
        try:
            while True:
                self._run_once(name, body)
                with self._lock:
                    self._last_ended[name] = _now()
                    again = name in self._again and not self._stopping.is_set()
                    self._again.discard(name)
                    if not again:
                        self._in_flight.discard(name)
                        break
                if self._stopping.wait(self._min_gap_seconds.get(name, 0.0)):
                    with self._lock:
                        self._in_flight.discard(name)
                    break
        finally:
            with self._lock:
                self._running -= 1
                self._idle.notify_all()

    def _run_once(self, name: str, body: Callable[[], object]) -> None:
        started = time.monotonic()
        try:
            body()
        except StoreError as exc:  # logged by the store; the next run tries again
            log.warning("hub_periodic_job_failed", job=name, error=exc.reason)
        except Exception as exc:  # noqa: BLE001 - never take the hub down for periodic work
            log.error("hub_periodic_job_failed", job=name, error=repr(exc))
        duration_seconds = time.monotonic() - started
        interval_seconds = self._interval_seconds.get(name, 0.0)
        if duration_seconds > interval_seconds:
            log.warning("hub_periodic_job_overran", job=name, duration_seconds=round(duration_seconds, 3),
                        interval_seconds=interval_seconds)


def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)
