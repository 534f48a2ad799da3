"""Retention: the hub deletes old events in small batches, in the background, so storage stays bounded.

    heartbeat        kept ``retention_heartbeat_hours`` (default 6); older ones deleted
    every other kind kept ``retention_event_days`` (default 90); older ones deleted
    never deleted    each host's newest event of each kind, and the ``hosts`` table (the latest state of a host)

Old means received long enough ago by the hub's clock (``events.received_at``; issue 43), never by the time the
agent gave the event: an agent whose clock runs a year ahead cannot keep its events forever, nor one whose clock
runs behind get its fresh events deleted at once. A host's newest event of a kind is the one received last (within
one commit, the higher sequence), as ``hosts`` reads it.

A heartbeat carries nothing that is not also in the ``hosts`` row (pairing, compliance, last health status,
agent version) or in an event of its own when it changes (snapshot_changed, policy_violation, health_regression),
so old heartbeats are simply dropped rather than aggregated. 0 keeps a kind forever.

Each batch is one short transaction of at most ``retention_batch_rows`` deletes, with a pause between batches,
so ingest (the group-commit writer) waits at most one batch for the database. Of several hub processes over one
database (workers, machines), one runs each pass: the pass is claimed by a compare-and-set in ``hub_meta``.
"""

from __future__ import annotations

import datetime as dt
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Dict, Optional, Protocol

from agent.hub.periodic import Periodic
from agent.log import get_logger
from agent.report.events import PAYLOAD_KINDS

if TYPE_CHECKING:  # pragma: no cover
    from agent.hub.settings import HubSettings

log = get_logger("hub.retention")

# Between two batches the writer gets the database to itself for at least this long.
PAUSE_BETWEEN_BATCHES_SECONDS = 0.05
FIRST_PASS_AFTER_SECONDS = 60.0


@dataclass(frozen=True)
class RetentionPolicy:
    """How long each kind of event is kept; 0 keeps it forever."""

    heartbeat_hours: float = 6.0
    event_days: float = 90.0

    def cutoffs(self, now: dt.datetime) -> Dict[str, dt.datetime]:
        """Per kind, the receipt time (the hub's clock) before which its events go (kinds kept forever are absent).
        Pure."""
        out: Dict[str, dt.datetime] = {}
        for kind in PAYLOAD_KINDS:
            if kind == "heartbeat":
                if self.heartbeat_hours > 0:
                    out[kind] = now - dt.timedelta(hours=self.heartbeat_hours)
            elif self.event_days > 0:
                out[kind] = now - dt.timedelta(days=self.event_days)
        return out


class PrunableStore(Protocol):
    """What retention needs from the store (``agent.hub.store``)."""

    def claim_retention_pass(self, now: dt.datetime, min_interval_seconds: float) -> bool:
        """True when this process should run the pass now."""

    def prune_batch(self, kind: str, cutoff: dt.datetime, limit: int) -> int:
        """Delete up to ``limit`` events of ``kind`` received before ``cutoff`` (never a host's newest); how many
        went."""


def run_pass(store: PrunableStore, policy: RetentionPolicy, now: dt.datetime, batch_rows: int,
             stopping: Optional[threading.Event] = None,
             pause_seconds: float = PAUSE_BETWEEN_BATCHES_SECONDS) -> Dict[str, int]:
    """Delete what ``policy`` says is old at ``now``, batch by batch; per kind, how many events went.

    Stops between batches once ``stopping`` is set (the rest waits for the next pass)."""
    stop = stopping or threading.Event()
    deleted: Dict[str, int] = {}
    for kind, cutoff in policy.cutoffs(now).items():
        while not stop.is_set():
            count = store.prune_batch(kind, cutoff, batch_rows)
            if count:
                deleted[kind] = deleted.get(kind, 0) + count
            if count < batch_rows:
                break
            stop.wait(pause_seconds)
    return deleted


class RetentionWorker:
    """The retention pass as a periodic job of the hub (agent/hub/periodic.py): every ``interval_seconds``, when this
    process wins the claim."""

    def __init__(self, store: PrunableStore, policy: RetentionPolicy, interval_seconds: float, batch_rows: int,
                 clock: Callable[[], dt.datetime]) -> None:
        self._store = store
        self._policy = policy
        self._interval_seconds = interval_seconds
        self._batch_rows = batch_rows
        self._clock = clock
        self._stopping = threading.Event()
        self.pass_count = 0

    def schedule(self, periodic: Periodic) -> None:
        """Add the pass to ``periodic`` when anything is ever deleted; not at once: a hub that just started has
        ingest to catch up on (agents resending after an outage)."""
        if self._policy.cutoffs(self._clock()):
            periodic.add("retention", self.run_once, self._interval_seconds,
                         first_after_seconds=min(self._interval_seconds, FIRST_PASS_AFTER_SECONDS))

    def stop(self) -> None:
        """End a pass in flight between two batches (the hub is stopping)."""
        self._stopping.set()

    def run_once(self) -> Optional[Dict[str, int]]:
        """One pass if this process wins the claim; None when another process ran one within the interval."""
        now = self._clock()
        # A little under the interval, so this process's own next tick is never refused by its own last claim.
        if not self._store.claim_retention_pass(now, self._interval_seconds * 0.9):
            return None
        started = dt.datetime.now(dt.timezone.utc)
        deleted = run_pass(self._store, self._policy, now, self._batch_rows, self._stopping)
        self.pass_count += 1
        log.info("hub_retention_pass", deleted_events=sum(deleted.values()), deleted_by_kind=deleted,
                 duration_seconds=round((dt.datetime.now(dt.timezone.utc) - started).total_seconds(), 3))
        return deleted


def retention_worker(settings: "HubSettings", store: PrunableStore,
                     clock: Callable[[], dt.datetime]) -> RetentionWorker:
    """The worker the hub's settings describe."""
    return RetentionWorker(store, RetentionPolicy(settings.retention_heartbeat_hours, settings.retention_event_days),
                           settings.retention_interval_seconds, settings.retention_batch_rows, clock)
