"""Group commit: concurrent batches share commits, each gets its own answer, stop stores what is queued."""

from __future__ import annotations

import datetime as dt
import threading
from typing import List, Sequence

import pytest

from agent.errors import StoreError, WriterBusy
from agent.hub.rows import BatchResult
from agent.hub.writer import GroupCommitWriter
from agent.report.events import Event
from tests.hub.factories import event


class RecordingStore:
    """Accepts everything; records the batches of each commit; the first commit can be held at a gate."""

    def __init__(self, hold_first: bool = False) -> None:
        self.commits: List[List[List[str]]] = []
        self.gate = threading.Event()
        self.entered = threading.Event()
        if not hold_first:
            self.gate.set()
        self.fail_with: Exception = None  # type: ignore[assignment]

    def ingest(self, batches: Sequence[Sequence[Event]], received_at: dt.datetime) -> List[BatchResult]:
        self.entered.set()
        assert self.gate.wait(10)
        if self.fail_with is not None:
            raise self.fail_with
        self.commits.append([[e.event_id for e in b] for b in batches])
        return [BatchResult(accepted=[e.event_id for e in b], duplicates=[]) for b in batches]


def test_batches_queued_during_a_commit_share_the_next_one() -> None:
    """Batches submitted while a commit runs are all written in the next single commit, each answered on its own."""
    store = RecordingStore(hold_first=True)
    writer = GroupCommitWriter(store)  # type: ignore[arg-type]
    writer.start()
    first = writer.submit([event()])
    assert store.entered.wait(10)
    waiting = [writer.submit([event()]) for _ in range(5)]
    store.gate.set()
    results = [f.result(10) for f in [first, *waiting]]
    writer.stop()
    assert [len(c) for c in store.commits] == [1, 5]
    assert all(len(r.accepted) == 1 for r in results)
    assert (writer.commit_count, writer.batch_count) == (2, 6)


def test_a_commit_holds_at_most_max_events() -> None:
    """A commit takes batches up to max_events_per_commit events and leaves the rest for the next one."""
    store = RecordingStore(hold_first=True)
    writer = GroupCommitWriter(store, max_events_per_commit=4)  # type: ignore[arg-type]
    writer.start()
    futures = [writer.submit([event()])]
    assert store.entered.wait(10)
    futures += [writer.submit([event(), event()]) for _ in range(4)]
    store.gate.set()
    for future in futures:
        future.result(10)
    writer.stop()
    assert [sum(len(b) for b in c) for c in store.commits] == [1, 4, 4]


def test_a_store_failure_reaches_every_batch_of_the_commit() -> None:
    """A store error in a commit is raised to the submitter of each batch in it."""
    store = RecordingStore()
    store.fail_with = StoreError("ingest", "disk full")
    writer = GroupCommitWriter(store)  # type: ignore[arg-type]
    writer.start()
    future = writer.submit([event()])
    with pytest.raises(StoreError, match="disk full"):
        future.result(10)
    writer.stop()


def test_stop_stores_what_is_queued_then_refuses() -> None:
    """stop() writes every batch already queued, and later submits are refused with WriterBusy."""
    store = RecordingStore(hold_first=True)
    writer = GroupCommitWriter(store)  # type: ignore[arg-type]
    writer.start()
    futures = [writer.submit([event()])]
    assert store.entered.wait(10)
    futures += [writer.submit([event()]) for _ in range(3)]
    stopper = threading.Thread(target=writer.stop)
    stopper.start()
    store.gate.set()
    stopper.join(10)
    assert all(f.result(0).accepted for f in futures)
    with pytest.raises(WriterBusy):
        writer.submit([event()])


def test_submit_before_start_is_refused() -> None:
    """A submit before the writer starts is refused with WriterBusy."""
    with pytest.raises(WriterBusy):
        GroupCommitWriter(RecordingStore()).submit([event()])  # type: ignore[arg-type]


def test_a_cancelled_batch_is_not_written() -> None:
    """A batch whose future was cancelled while it waited is not written."""
    store = RecordingStore(hold_first=True)
    writer = GroupCommitWriter(store)  # type: ignore[arg-type]
    writer.start()
    first = writer.submit([event()])
    assert store.entered.wait(10)
    cancelled = writer.submit([event(event_id="cancelled-0001")])
    assert cancelled.cancel()
    store.gate.set()
    first.result(10)
    writer.stop()
    assert "cancelled-0001" not in [i for c in store.commits for b in c for i in b]
