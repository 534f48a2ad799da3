"""The daemon's scheduler: intervals keep their phase, requests move the next run, a job never overlaps itself."""

from __future__ import annotations

import datetime as dt
import threading
import time
from typing import List

import pytest

from agent.daemon_jobs.schedule import JobLookupError, Scheduler

UTC = dt.timezone.utc


def now_plus(seconds: float) -> dt.datetime:
    return dt.datetime.now(UTC) + dt.timedelta(seconds=seconds)


def test_an_interval_job_runs_on_time_and_a_modified_run_comes_early() -> None:
    """Runs every 0.2 s from its first run; modify_job brings one forward without shifting to a new phase later."""
    runs: List[float] = []
    scheduler = Scheduler()
    scheduler.add_job(lambda: runs.append(time.monotonic()), "tick", 0.2, 0.0)
    started = time.monotonic()
    scheduler.start()
    time.sleep(0.5)
    scheduler.modify_job("tick", next_run_time=now_plus(0.0))
    time.sleep(0.05)
    scheduler.shutdown()
    offsets = [round(t - started, 1) for t in runs]
    assert offsets[:3] == [0.0, 0.2, 0.4]
    assert len(runs) == 4, "the modified run did not happen at once"


def test_a_slow_job_never_overlaps_itself_and_missed_runs_collapse() -> None:
    """A 0.35 s body on a 0.1 s interval runs one at a time, and not once per missed interval."""
    running, most, runs = [0], [0], [0]
    lock = threading.Lock()

    def slow() -> None:
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        time.sleep(0.35)
        with lock:
            running[0] -= 1
            runs[0] += 1

    scheduler = Scheduler()
    scheduler.add_job(slow, "slow", 0.1, 0.0)
    scheduler.start()
    time.sleep(1.0)
    scheduler.shutdown(wait=True)
    assert most[0] == 1
    assert 2 <= runs[0] <= 4


@pytest.mark.parametrize("still_pending, expected_runs", [(True, 2), (False, 1)])
def test_a_request_during_a_run_runs_again_only_when_still_pending(still_pending: bool, expected_runs: int) -> None:
    """A run asked for while running follows it if the job still wants it, and is dropped if it served it."""
    runs: List[int] = []
    release = threading.Event()
    scheduler = Scheduler()

    def body() -> None:
        runs.append(1)
        if len(runs) == 1:
            release.wait(2)

    scheduler.add_job(body, "job", 3600, 0.0, pending=lambda: still_pending)
    scheduler.start()
    deadline = time.monotonic() + 2
    while not runs and time.monotonic() < deadline:
        time.sleep(0.01)
    scheduler.modify_job("job", next_run_time=now_plus(0.0))
    release.set()
    time.sleep(0.2)
    scheduler.shutdown()
    assert len(runs) == expected_runs


def test_reschedule_and_shutdown() -> None:
    """A new interval counts from now; after shutdown nothing runs and a modify raises JobLookupError."""
    runs: List[float] = []
    scheduler = Scheduler()
    scheduler.add_job(lambda: runs.append(time.monotonic()), "job", 3600, 3600)
    scheduler.start()
    scheduler.reschedule_job("job", trigger="interval", seconds=0.1)
    time.sleep(0.35)
    scheduler.shutdown()
    count = len(runs)
    assert 2 <= count <= 4
    time.sleep(0.2)
    assert len(runs) == count
    with pytest.raises(JobLookupError):
        scheduler.modify_job("job", next_run_time=now_plus(0))
