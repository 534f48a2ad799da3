"""The delivery job: drain the outbox to the endpoint in sequence order, backing off while it is down.

A batch leaves the outbox only when the receiver acknowledged it (accepted or duplicate). Retryable failures
(unreachable, timeout, TLS, 5xx/429, auth, unexpected replies) keep every event and back off with full jitter;
a 413 splits the batch; a 400/422 is narrowed down to the one event the receiver refuses, which is moved to the
outbox's ``rejected`` table so it cannot block the queue.

Events queued before ``agent.host_id`` changed are sent under the current id: they are this host's events, and the
hub, which authenticates each host's token against the events' host id, refused the old id with 403 forever.

Two halves: :func:`drain_outbox` sends (it needs the Sender, hence requests), :class:`DeliveryJob` decides when to
send and backs off. Under ``gpuguard run`` the drain runs in a job child (``gpuguard _job deliver``, started only
while the outbox holds events), so requests, urllib3 and OpenSSL's trust store never stay resident (issue #17);
the backoff, the failure counts and the log lines stay with the daemon.
"""

from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, List, Optional, Tuple

from agent.daemon_jobs.runtime import Runtime
from agent.errors import DeliveryError
from agent.jsonrecord import JsonRecord
from agent.log import get_logger

if TYPE_CHECKING:  # pragma: no cover - the sending half runs in a delivery child
    from agent.report.events import Event
    from agent.report.sender import Sender

log = get_logger("delivery")

# Failures that say the endpoint or our credentials are misconfigured, not that it is briefly down.
_LOUD_CATEGORIES = frozenset({"tls", "auth", "endpoint"})


class Backoff:
    """Exponential backoff with full jitter: a delay drawn uniformly from 0 to min(cap, base * 2**failures)."""

    def __init__(self, base_seconds: float, cap_seconds: float, rng: Optional[random.Random] = None) -> None:
        self.base_seconds = base_seconds
        self.cap_seconds = cap_seconds
        self.failures = 0
        self._rng = rng or random.Random()

    def next_delay_seconds(self) -> float:
        """Count one more failure and return how long to wait before the next try."""
        ceiling = min(self.cap_seconds, self.base_seconds * (2.0 ** min(self.failures, 60)))
        self.failures += 1
        return self._rng.uniform(0.0, ceiling)

    def reset(self) -> None:
        self.failures = 0


@dataclass(frozen=True)
class DeliveryFailure(JsonRecord):
    """Why a drain stopped, as a record (agent.errors.DeliveryError's fields)."""

    url: str
    category: str
    reason: str
    status_code: Optional[int] = None

    @classmethod
    def of(cls, exc: DeliveryError) -> DeliveryFailure:
        return cls(url=exc.url, category=exc.category, reason=exc.reason, status_code=exc.status_code)

    def error(self) -> DeliveryError:
        return DeliveryError(self.url, self.category, self.reason, self.status_code)


@dataclass(frozen=True)
class Drained(JsonRecord):
    """How far one drain of the outbox got: when the receiver last took a batch, and the failure that ended it."""

    acknowledged_at_seconds: Optional[float] = None  # wall clock
    failure: Optional[DeliveryFailure] = None
    failed_batch_events: int = 0


def drain_outbox(runtime: Runtime, sender: Sender) -> Drained:
    """Send pending events batch by batch until the outbox is empty, a batch fails, or the daemon is stopping."""
    batch_size = runtime.job_settings().report.batch_size
    acknowledged_at: Optional[float] = None
    while not runtime.stopping.is_set():
        events = _current_identity(runtime, runtime.outbox.pending(batch_size))
        if not events:
            break
        try:
            _deliver(runtime, sender, events)
        except DeliveryError as exc:
            return Drained(acknowledged_at, DeliveryFailure.of(exc), len(events))
        acknowledged_at = time.time()
    return Drained(acknowledged_at)


class DeliveryJob:
    """Sends pending events when there are any; ``run`` returns seconds until it wants to retry, or None.

    ``drain`` sends them: by default in this process through ``runtime.sender``; the daemon hands in a job child's.
    :meth:`run_with` is one run with another drain (the heartbeat's lean child, which also probes the hub: children.py's
    LeanRound); runs never overlap.
    """

    def __init__(self, runtime: Runtime, clock: Callable[[], float] = time.monotonic,
                 rng: Optional[random.Random] = None, drain: Optional[Callable[[str], Drained]] = None) -> None:
        self.runtime = runtime
        settings = runtime.settings
        self.backoff = Backoff(settings.backoff_base_seconds, settings.backoff_cap_seconds, rng)
        self._clock = clock
        self._drain = drain or self._drain_here
        self._retry_at: Optional[float] = None
        self._warned_no_endpoint = False
        self._running = threading.Lock()

    @property
    def retry_in_seconds(self) -> Optional[float]:
        """How long the current backoff still lasts, or None when not backing off."""
        if self._retry_at is None:
            return None
        return max(0.0, self._retry_at - self._clock())

    def reset_backoff(self) -> None:
        """Forget past failures (after a reload): the next run tries at once."""
        self.backoff.reset()
        self._retry_at = None

    def run(self, reason: str = "interval") -> Optional[float]:
        with self._running:
            return self._run(reason, self._drain)

    def run_with(self, reason: str, drain: Callable[[str], Drained]) -> Tuple[bool, Optional[float]]:
        """One run with ``drain`` instead of the job's own, unless a run is in progress: (whether it ran, the seconds
        until it wants to retry or None)."""
        if not self._running.acquire(blocking=False):
            return False, None
        try:
            return True, self._run(reason, drain)
        finally:
            self._running.release()

    def _run(self, reason: str, drain: Callable[[str], Drained]) -> Optional[float]:
        rt = self.runtime
        settings = rt.settings
        if settings.endpoint_url is None:
            if not self._warned_no_endpoint:
                log.warning("report_endpoint_not_configured", outbox_depth=rt.outbox.depth(),
                            hint="set [report] endpoint_url; events stay queued in the outbox until then")
                self._warned_no_endpoint = True
            return None
        waiting = self.retry_in_seconds
        if waiting:
            return waiting
        self.backoff.base_seconds = settings.backoff_base_seconds
        self.backoff.cap_seconds = settings.backoff_cap_seconds
        if rt.outbox.depth() == 0:
            return None
        drained = drain(reason)
        if drained.acknowledged_at_seconds is not None:
            with rt.state.lock:
                rt.state.last_delivery_success_seconds = drained.acknowledged_at_seconds
        if drained.failure is not None:
            return self._failed(drained.failure.error(), drained.failed_batch_events)
        if self.backoff.failures:
            log.info("delivery_recovered", after_failures=self.backoff.failures)
        self.backoff.reset()
        self._retry_at = None
        return None

    def _drain_here(self, reason: str) -> Drained:
        sender = self.runtime.sender
        return Drained() if sender is None else drain_outbox(self.runtime, sender)

    def _failed(self, exc: DeliveryError, batch_events: int) -> float:
        delay = self.backoff.next_delay_seconds()
        self._retry_at = self._clock() + delay
        self.runtime.state.count_delivery_failure(exc.category)
        level = log.error if exc.category in _LOUD_CATEGORIES else log.warning
        level("delivery_failed", category=exc.category, error=str(exc), status_code=exc.status_code,
              batch_events=batch_events, failures=self.backoff.failures, retry_in_seconds=round(delay, 3),
              outbox_depth=self.runtime.outbox.depth())
        return delay


def _current_identity(runtime: Runtime, events: List[Event]) -> List[Event]:
    """The events with the host's current id (see the module docstring); a change is logged once per batch."""
    host_id = runtime.emitter.host_id
    stale = [e for e in events if e.host_id != host_id]
    if not stale:
        return events
    log.info("delivery_host_id_updated", events=len(stale), old_host_ids=sorted({e.host_id for e in stale}),
             host_id=host_id)
    return [e if e.host_id == host_id else e.model_copy(update={"host_id": host_id}) for e in events]


def _deliver(runtime: Runtime, sender: Sender, events: List[Event]) -> None:
    """Send events in order; split on 413, narrow 400/422 to single events. Raises retryable errors."""
    from agent.report.events import EventBatch

    try:
        result = sender.send(EventBatch(events=events))
    except DeliveryError as exc:
        if exc.category == "too_large" and len(events) > 1:
            half = len(events) // 2
            log.info("delivery_batch_split", batch_events=len(events))
            _deliver(runtime, sender, events[:half])
            _deliver(runtime, sender, events[half:])
            return
        if exc.category == "rejected" and len(events) > 1:
            for event in events:
                _deliver(runtime, sender, [event])
            return
        if exc.category in ("too_large", "rejected"):
            runtime.outbox.reject(events[0].event_id, str(exc))
            return
        raise
    sent = {e.event_id for e in events}
    acknowledged = [i for i in result.acknowledged if i in sent]
    if not acknowledged:
        raise DeliveryError(sender.url, "endpoint", "200 reply acknowledged none of the batch's events", 200)
    runtime.outbox.ack(acknowledged)
    log.debug("delivery_batch_sent", events=len(events), accepted=len(result.accepted),
              duplicates=len(result.duplicates), first_sequence=events[0].sequence,
              last_sequence=events[-1].sequence)
