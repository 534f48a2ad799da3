"""The resident's scheduler (agent/daemon_jobs/scheduler.py): intervals, no overlap, coalesced runs, requests,
new intervals and shutdown, and the same run times as apscheduler's BackgroundScheduler set up as the daemon had it."""

from __future__ import annotations

import datetime as dt
import threading
import time
from typing import Callable, List

import pytest

from agent.daemon_jobs.scheduler import IntervalScheduler, following


@pytest.mark.parametrize(("due", "interval", "now", "expected"), [
    (10.0, 2.0, 9.0, 12.0),   # not due yet: one interval on
    (10.0, 2.0, 10.0, 12.0),  # due now
    (10.0, 2.0, 11.9, 12.0),
    (10.0, 2.0, 12.0, 14.0),  # the due time at now is coalesced into this run
    (10.0, 2.0, 17.5, 18.0),  # three missed, one run
])
def test_following_is_the_first_grid_time_after_now(due: float, interval: float, now: float,
                                                     expected: float) -> None:
    """The next due time steps on from the last by whole intervals, past now."""
    assert following(due, interval, now) == expected


class Recorder:
    """A job body that records its start times (monotonic) and how many of it ran at once."""

    def __init__(self, seconds: float = 0.0) -> None:
        self.seconds = seconds
        self.starts: List[float] = []
        self.running = 0
        self.most_at_once = 0
        self._lock = threading.Lock()

    def __call__(self) -> None:
        with self._lock:
            self.starts.append(time.monotonic())
            self.running += 1
            self.most_at_once = max(self.most_at_once, self.running)
        time.sleep(self.seconds)
        with self._lock:
            self.running -= 1


def _run_for(scheduler: IntervalScheduler, seconds: float) -> None:
    scheduler.start()
    try:
        time.sleep(seconds)
    finally:
        scheduler.shutdown()


def test_a_slow_job_never_overlaps_itself_nor_holds_up_another() -> None:
    """A 0.5 s body due every 0.1 s runs once at a time without catching up its missed runs; a fast job beside it
    keeps its own interval."""
    scheduler = IntervalScheduler()
    slow, fast = Recorder(0.5), Recorder()
    scheduler.add("slow", slow, 0.1, 0.0)
    scheduler.add("fast", fast, 0.1, 0.0)
    _run_for(scheduler, 1.6)
    assert slow.most_at_once == 1
    assert 2 <= len(slow.starts) <= 4  # 0, 0.6, 1.2 (missed due times are skipped, not run in a burst)
    assert len(fast.starts) >= 8


def test_run_in_moves_the_next_run_and_set_interval_starts_a_new_one() -> None:
    """A job a minute away runs at once when asked; a new interval of 0.1 s makes it run every 0.1 s from then."""
    scheduler = IntervalScheduler()
    asked, reinterval = Recorder(), Recorder()
    scheduler.add("asked", asked, 60.0, 60.0)
    scheduler.add("reinterval", reinterval, 60.0, 60.0)
    scheduler.start()
    try:
        scheduler.run_in("asked", 0.0)
        scheduler.set_interval("reinterval", 0.1)
        time.sleep(0.75)
    finally:
        scheduler.shutdown()
    assert len(asked.starts) == 1
    assert 4 <= len(reinterval.starts) <= 8
    with pytest.raises(KeyError):
        scheduler.run_in("never_added", 0.0)


def test_shutdown_lets_a_running_job_finish_and_starts_none_after() -> None:
    """A body running at shutdown ends normally; nothing runs after it, and the job threads end."""
    scheduler = IntervalScheduler()
    body = Recorder(0.3)
    scheduler.add("slow", body, 0.05, 0.0)
    scheduler.start()
    time.sleep(0.1)
    scheduler.shutdown()
    time.sleep(0.5)
    assert len(body.starts) == 1 and body.running == 0
    assert all(not thread.is_alive() for thread in threading.enumerate() if thread.name == "job-slow")


def test_a_raising_job_keeps_its_schedule() -> None:
    """A body that raises (JobRunner never does) is logged and runs again at its next time."""
    calls: List[int] = []

    def fails() -> None:
        calls.append(1)
        raise RuntimeError("boom")

    scheduler = IntervalScheduler()
    scheduler.add("fails", fails, 0.1, 0.0)
    _run_for(scheduler, 0.45)
    assert len(calls) >= 3


def _apscheduler_starts(body: Recorder, interval_seconds: float, seconds: float, request_at: float) -> None:
    """The daemon's apscheduler set-up before issue #28 (agent/daemon.py at 1f18c29), running ``body``."""
    from apscheduler.executors.pool import ThreadPoolExecutor
    from apscheduler.schedulers.background import BackgroundScheduler

    utc = dt.timezone.utc
    scheduler = BackgroundScheduler(executors={"default": ThreadPoolExecutor(max_workers=10)},
                                    job_defaults={"max_instances": 1, "coalesce": True, "misfire_grace_time": None},
                                    timezone=utc)
    scheduler.add_job(body, "interval", seconds=interval_seconds, id="job", next_run_time=dt.datetime.now(utc))
    scheduler.start()
    time.sleep(request_at)
    scheduler.modify_job("job", next_run_time=dt.datetime.now(utc))
    time.sleep(seconds - request_at)
    scheduler.shutdown(wait=False)


def _interval_scheduler_starts(body: Recorder, interval_seconds: float, seconds: float, request_at: float) -> None:
    scheduler = IntervalScheduler()
    scheduler.add("job", body, interval_seconds, 0.0)
    scheduler.start()
    time.sleep(request_at)
    scheduler.run_in("job", 0.0)
    time.sleep(seconds - request_at)
    scheduler.shutdown()


def _offsets(body: Recorder) -> List[float]:
    return [round(start - body.starts[0], 2) for start in body.starts]


@pytest.mark.parametrize("run", [_apscheduler_starts, _interval_scheduler_starts], ids=["apscheduler", "interval"])
def test_run_times_are_apschedulers(run: Callable[[Recorder, float, float, float], None]) -> None:
    """A 0.55 s body every 0.2 s, asked to run again 0.25 s into its first run: both schedulers start it at 0, then
    (the due times and the request passing while it runs are skipped) at 0.65 (the request plus two intervals), 1.25
    and 1.85 s."""
    body = Recorder(0.55)
    run(body, 0.2, 2.15, 0.25)
    time.sleep(0.6)  # the last run ends
    assert body.most_at_once == 1
    expected = [0.0, 0.65, 1.25, 1.85]
    assert len(body.starts) == len(expected), _offsets(body)
    assert all(abs(got - want) < 0.12 for got, want in zip(_offsets(body), expected)), _offsets(body)
