"""The delivery job: drain the outbox to the endpoint in sequence order, backing off while it is down.

A batch leaves the outbox only when the receiver acknowledged it (accepted or duplicate). Retryable failures
(unreachable, timeout, TLS, 5xx/429, auth, unexpected replies) keep every event and back off with full jitter;
a 413 splits the batch; a 400/422 is narrowed down to the one event the receiver refuses, which is moved to the
outbox's ``rejected`` table so it cannot block the queue.

Events queued before ``agent.host_id`` changed are sent under the current id: they are this host's events, and the
hub, which authenticates each host's token against the events' host id, refused the old id with 403 forever.
"""

from __future__ import annotations

import random
import time
from typing import Callable, List, Optional

from agent.daemon_jobs.runtime import Runtime
from agent.errors import DeliveryError
from agent.log import get_logger
from agent.report.events import Event, EventBatch
from agent.report.sender import Backoff, Sender

log = get_logger("delivery")

# Failures that say the endpoint or our credentials are misconfigured, not that it is briefly down.
_LOUD_CATEGORIES = frozenset({"tls", "auth", "endpoint"})


class DeliveryJob:
    """Sends pending events batch by batch; ``run`` returns seconds until it wants to retry, or None."""

    def __init__(self, runtime: Runtime, clock: Callable[[], float] = time.monotonic,
                 rng: Optional[random.Random] = None) -> None:
        self.runtime = runtime
        report = runtime.settings.report
        self.backoff = Backoff(report.backoff_base_seconds, report.backoff_cap_seconds, rng)
        self._clock = clock
        self._retry_at: Optional[float] = None
        self._warned_no_endpoint = False

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
        rt = self.runtime
        sender = rt.sender
        if sender is None:
            if not self._warned_no_endpoint:
                log.warning("report_endpoint_not_configured", outbox_depth=rt.outbox.depth(),
                            hint="set [report] endpoint_url; events stay queued in the outbox until then")
                self._warned_no_endpoint = True
            return None
        waiting = self.retry_in_seconds
        if waiting:
            return waiting
        report = rt.settings.report
        self.backoff.base_seconds, self.backoff.cap_seconds = report.backoff_base_seconds, report.backoff_cap_seconds
        while not rt.stopping.is_set():
            events = self._current_identity(rt.outbox.pending(report.batch_size))
            if not events:
                break
            try:
                self._deliver(sender, events)
            except DeliveryError as exc:
                return self._failed(exc, len(events))
            if self.backoff.failures:
                log.info("delivery_recovered", after_failures=self.backoff.failures)
            self.backoff.reset()
            self._retry_at = None
        return None

    def _current_identity(self, events: List[Event]) -> List[Event]:
        """The events with the host's current id (see the module docstring); a change is logged once per batch."""
        host_id = self.runtime.emitter.host_id
        stale = [e for e in events if e.host_id != host_id]
        if not stale:
            return events
        log.info("delivery_host_id_updated", events=len(stale), old_host_ids=sorted({e.host_id for e in stale}),
                 host_id=host_id)
        return [e if e.host_id == host_id else e.model_copy(update={"host_id": host_id}) for e in events]

    def _failed(self, exc: DeliveryError, batch_events: int) -> float:
        delay = self.backoff.next_delay_seconds()
        self._retry_at = self._clock() + delay
        self.runtime.state.count_delivery_failure(exc.category)
        level = log.error if exc.category in _LOUD_CATEGORIES else log.warning
        level("delivery_failed", category=exc.category, error=str(exc), status_code=exc.status_code,
              batch_events=batch_events, failures=self.backoff.failures, retry_in_seconds=round(delay, 3),
              outbox_depth=self.runtime.outbox.depth())
        return delay

    def _deliver(self, sender: Sender, events: List[Event]) -> None:
        """Send events in order; split on 413, narrow 400/422 to single events. Raises retryable errors."""
        try:
            result = sender.send(EventBatch(events=events))
        except DeliveryError as exc:
            if exc.category == "too_large" and len(events) > 1:
                half = len(events) // 2
                log.info("delivery_batch_split", batch_events=len(events))
                self._deliver(sender, events[:half])
                self._deliver(sender, events[half:])
                return
            if exc.category == "rejected" and len(events) > 1:
                for event in events:
                    self._deliver(sender, [event])
                return
            if exc.category in ("too_large", "rejected"):
                self.runtime.outbox.reject(events[0].event_id, str(exc))
                return
            raise
        sent = {e.event_id for e in events}
        acknowledged = [i for i in result.acknowledged if i in sent]
        if not acknowledged:
            raise DeliveryError(sender.url, "endpoint", "200 reply acknowledged none of the batch's events", 200)
        self.runtime.outbox.ack(acknowledged)
        with self.runtime.state.lock:
            self.runtime.state.last_delivery_success_seconds = time.time()
        log.debug("delivery_batch_sent", events=len(events), accepted=len(result.accepted),
                  duplicates=len(result.duplicates), first_sequence=events[0].sequence,
                  last_sequence=events[-1].sequence)
