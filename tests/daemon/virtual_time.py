"""A virtual clock for agent/daemon_jobs/scheduler.py's IntervalScheduler: time moves only when the test says so,
and only once every job thread is blocked on it, so the times a job runs at are exact however slow the machine is.

Each job thread (``job-<id>``, for the ``job_ids`` given) blocks in one of two ways: the scheduler's wait
(``clock.wait``, given to ``IntervalScheduler(clock, clock.wait)``) or a job body taking time (``clock.sleep``).
:meth:`VirtualClock.run_until` waits (on the real clock, up to ``REAL_TIMEOUT_SECONDS``) until every live job thread
is blocked, then moves the time to the earliest deadline and wakes whoever it was for, as a discrete-event
simulation does; :meth:`VirtualClock.finish` ends every virtual sleep, for the end of a test. A call that notifies
the scheduler (``run_in``, ``set_interval``) goes through :meth:`VirtualClock.poke`, so the threads it wakes count
as running until they block again.
"""

from __future__ import annotations

import itertools
import threading
import time
from typing import Callable, Dict, Iterable, Tuple, TypeVar

REAL_TIMEOUT_SECONDS = 60.0  # only a broken scheduler waits this long: nothing here depends on the machine's speed

T = TypeVar("T")


class VirtualClock:
    """Now, in virtual seconds from 0; a callable, as IntervalScheduler's clock is."""

    def __init__(self, job_ids: Iterable[str]) -> None:
        self.now = 0.0
        self.thread_names = {f"job-{job_id}" for job_id in job_ids}
        self._finished = False
        self._lock = threading.Condition()
        self._ids = itertools.count(1)
        self._blocked: Dict[int, Tuple[float, threading.Condition, bool]] = {}  # id -> deadline, condition, is wait
        self._poked_at = 0  # waits registered before this id were notified: they count once they block again

    def __call__(self) -> float:
        return self.now

    def _register(self, deadline: float, condition: threading.Condition, is_wait: bool) -> int:
        with self._lock:
            token = next(self._ids)
            self._blocked[token] = (deadline, condition, is_wait)
            self._lock.notify_all()
            return token

    def _unregister(self, token: int) -> bool:
        with self._lock:
            return self._blocked.pop(token, None) is not None

    def wait(self, condition: threading.Condition, seconds: float) -> None:
        """The scheduler's wait (its lock held): until notified or ``seconds`` of virtual time passed."""
        token = self._register(self.now + seconds, condition, True)
        condition.wait(REAL_TIMEOUT_SECONDS)
        self._unregister(token)

    def sleep(self, seconds: float) -> None:
        """A body taking ``seconds`` of virtual time."""
        condition = threading.Condition()
        with condition:
            token = self._register(self.now + seconds, condition, False)
            real_deadline = time.monotonic() + REAL_TIMEOUT_SECONDS
            while token in self._blocked and not self._finished:
                if time.monotonic() > real_deadline:
                    raise AssertionError(f"virtual sleep never ended at {self.now}")
                condition.wait(1.0)

    def poke(self, call: Callable[[], T]) -> T:
        """Run ``call``, which notifies the scheduler's condition: the waits blocked now are woken by it."""
        with self._lock:
            self._poked_at = next(self._ids)
        return call()

    def _settled(self) -> bool:
        alive = sum(1 for thread in threading.enumerate() if thread.name in self.thread_names)
        return len(self._blocked) == alive and all(
            token > self._poked_at for token, (_, _, is_wait) in self._blocked.items() if is_wait)

    def _wait_settled(self) -> None:
        # A thread ending notifies nobody: look again every few milliseconds.
        real_deadline = time.monotonic() + REAL_TIMEOUT_SECONDS
        while not self._lock.wait_for(self._settled, 0.005):
            if time.monotonic() > real_deadline:
                raise AssertionError(f"job threads never all blocked at {self.now}: {self._blocked}")

    def run_until(self, end: float) -> None:
        """Move time on, deadline by deadline, while the earliest is before ``end``; then stop at ``end``."""
        while True:
            with self._lock:
                self._wait_settled()
                deadline = min((d for d, _, _ in self._blocked.values()), default=end)
                if deadline >= end:
                    self.now = end
                    return
                self.now = max(self.now, deadline)
                due = [token for token, (d, _, _) in self._blocked.items() if d <= self.now]
                woken = [self._blocked.pop(token)[1] for token in due]
            for condition in woken:
                with condition:
                    condition.notify_all()

    def finish(self) -> None:
        """End every virtual sleep (after the scheduler's shutdown), so the job threads can end."""
        with self._lock:
            self._finished = True
            woken = [condition for _, condition, _ in self._blocked.values()]
        for condition in woken:
            with condition:
                condition.notify_all()
