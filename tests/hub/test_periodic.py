"""The hub's periodic work on apscheduler: intervals, a run moved forward with its minimum gap, a failing job."""

from __future__ import annotations

import io
import json
import threading
import time
from contextlib import contextmanager
from typing import Callable, Iterator, List

from agent.errors import StoreError
from agent.hub.periodic import Periodic
from agent.log import configure


def _wait_for(condition: Callable[[], bool], seconds: float) -> bool:
    """Whether ``condition`` held within ``seconds``."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.01)
    return condition()


@contextmanager
def _running(periodic: Periodic) -> Iterator[Periodic]:
    """The scheduler started for the block and stopped after it, whatever the block asserts."""
    periodic.start()
    try:
        yield periodic
    finally:
        periodic.stop()


def test_a_job_runs_at_its_interval_and_never_twice_at_once() -> None:
    """A 0.1 s job that takes 0.25 s runs again only after it ended (max_instances=1), missed runs merged."""
    starts: List[float] = []
    running = threading.Event()
    overlaps: List[bool] = []

    def body() -> None:
        overlaps.append(running.is_set())
        running.set()
        starts.append(time.monotonic())
        time.sleep(0.25)
        running.clear()

    periodic = Periodic()
    periodic.add("job", body, interval_seconds=0.1, first_after_seconds=0.0)
    with _running(periodic):
        assert _wait_for(lambda: len(starts) >= 3, 120)
    assert overlaps[:3] == [False, False, False]
    assert all(b - a >= 0.2 for a, b in zip(starts, starts[1:]))


def test_run_soon_moves_the_next_run_forward_but_keeps_the_minimum_gap() -> None:
    """A job due in an hour runs within a minute (not the hour) of run_soon; a second run_soon right after waits out
    the gap."""
    ended: List[float] = []
    periodic = Periodic()
    periodic.add("tick", lambda: ended.append(time.monotonic()), interval_seconds=3600, first_after_seconds=3600,
                 min_gap_seconds=0.5)
    with _running(periodic):
        asked = time.monotonic()
        periodic.run_soon("tick")
        assert _wait_for(lambda: len(ended) == 1, 120) and ended[0] - asked < 60  # not the hour: load-proof
        periodic.run_soon("tick")
        assert _wait_for(lambda: len(ended) == 2, 120)
        assert ended[1] - ended[0] >= 0.45


def test_a_failing_job_is_logged_and_runs_again() -> None:
    """A StoreError or any other exception in a run does not stop the job (nor the hub)."""
    calls: List[int] = []

    def body() -> None:
        calls.append(1)
        if len(calls) == 1:
            raise StoreError("write", "database is locked")
        if len(calls) == 2:
            raise RuntimeError("bug")

    periodic = Periodic()
    periodic.add("flaky", body, interval_seconds=0.05, first_after_seconds=0.0)
    with _running(periodic):
        assert _wait_for(lambda: len(calls) >= 3, 120)


def test_stop_waits_for_a_run_in_flight_but_no_longer_than_its_timeout() -> None:
    """A run that ends within the timeout is waited for; one that does not is left after the timeout."""
    release = threading.Event()
    started = threading.Event()
    finished: List[bool] = []

    def body() -> None:
        started.set()
        release.wait(5)
        finished.append(True)

    periodic = Periodic()
    periodic.add("slow", body, interval_seconds=3600, first_after_seconds=0.0)
    periodic.start()
    assert started.wait(5)
    threading.Timer(0.2, release.set).start()
    periodic.stop(timeout_seconds=5)
    assert finished == [True]

    stuck = threading.Event()
    other = Periodic()
    other.add("stuck", lambda: stuck.wait(120), interval_seconds=3600, first_after_seconds=0.0)
    other.start()
    time.sleep(0.2)
    begun = time.monotonic()
    other.stop(timeout_seconds=0.3)
    assert time.monotonic() - begun < 60  # gave up after its 0.3 s, not after the body's 120 s: load-proof
    stuck.set()


def test_run_soon_during_a_run_runs_the_job_again_right_after_it() -> None:
    """A nudge that arrives while the job runs is not lost behind it: the job runs again once the run ends (after
    its minimum gap), not at its next interval an hour later."""
    release = threading.Event()
    started: List[float] = []
    ended: List[float] = []

    def body() -> None:
        started.append(time.monotonic())
        if len(started) == 1:
            release.wait(60)
        ended.append(time.monotonic())

    periodic = Periodic()
    periodic.add("tick", body, interval_seconds=3600, first_after_seconds=0.0, min_gap_seconds=0.2)
    with _running(periodic):
        assert _wait_for(lambda: len(started) == 1, 120)
        periodic.run_soon("tick")  # the failing report arrives during the evaluation
        time.sleep(0.5)  # apscheduler finds the run it was asked for due while this one is in flight
        release.set()
        assert _wait_for(lambda: len(ended) == 2, 60)  # well before the hour
        assert started[1] - ended[0] >= 0.15  # the gap is kept
        periodic.run_soon("tick")  # idle again: the ordinary path
        assert _wait_for(lambda: len(ended) == 3, 120)


def test_a_run_longer_than_its_interval_is_logged_with_both_times() -> None:
    """A 0.1 s job whose first run takes 0.3 s logs hub_periodic_job_overran (the ticks it swallowed are visible);
    its quick runs after that log nothing."""
    stream = io.StringIO()
    configure(level="info", json_output=True, stream=stream)
    runs: List[int] = []

    def body() -> None:
        runs.append(1)
        if len(runs) == 1:
            time.sleep(0.3)

    periodic = Periodic()
    periodic.add("tick", body, interval_seconds=0.1, first_after_seconds=0.0)
    with _running(periodic):
        assert _wait_for(lambda: len(runs) >= 3, 120)
    overran = [line for line in map(json.loads, stream.getvalue().splitlines())
               if line["event"] == "hub_periodic_job_overran"]
    assert len(overran) == 1 and overran[0]["job"] == "tick" and overran[0]["interval_seconds"] == 0.1
    assert overran[0]["duration_seconds"] >= 0.3
