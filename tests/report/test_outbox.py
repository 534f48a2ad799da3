"""The durable outbox: ordering, acknowledgement, durability, idempotency and the size bound."""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path

import pytest

from agent.errors import InputFileError
from agent.report.outbox import Outbox
from tests.report.events import event


@pytest.fixture
def path(tmp_path: Path) -> str:
    return str(tmp_path / "state" / "outbox.sqlite3")


def test_sequences_are_assigned_on_insert_and_pending_is_in_order(path: str) -> None:
    """Each enqueue gets the next sequence; pending hands them out lowest first with the sequence set."""
    box = Outbox(path)
    stored = [box.enqueue(event()) for _ in range(5)]
    assert [e.sequence for e in stored] == [1, 2, 3, 4, 5]
    assert [e.event_id for e in box.pending(3)] == [e.event_id for e in stored[:3]]
    assert [e.sequence for e in box.pending(10)] == [1, 2, 3, 4, 5]
    assert box.depth() == 5


def test_events_survive_reopening_and_sequences_are_never_reused(path: str) -> None:
    """Committed events are there after a restart; acked sequences are not handed out again."""
    box = Outbox(path)
    first = [box.enqueue(event()) for _ in range(3)]
    box.ack([e.event_id for e in first])
    box.enqueue(event())
    box.close()
    reopened = Outbox(path)
    assert [e.sequence for e in reopened.pending(10)] == [4]
    assert reopened.enqueue(event()).sequence == 5
    assert reopened.last_sequence() == 5


def test_ack_removes_only_named_events_and_ignores_unknown_ids(path: str) -> None:
    """ack forgets what the receiver has; unknown ids (already acked) are harmless."""
    box = Outbox(path)
    a, b, c = (box.enqueue(event()) for _ in range(3))
    assert box.ack([b.event_id, "not-an-id-at-all"]) == 1
    assert [e.event_id for e in box.pending(10)] == [a.event_id, c.event_id]
    assert box.ack([]) == 0


def test_enqueueing_the_same_event_id_twice_keeps_one(path: str) -> None:
    """The event_id is the idempotency key: a second enqueue returns the stored event."""
    box = Outbox(path)
    original = box.enqueue(event(event_id="same-id-0001"))
    again = box.enqueue(event(event_id="same-id-0001"))
    assert again.sequence == original.sequence == 1
    assert box.depth() == 1


def test_an_acknowledged_event_id_enqueued_again_keeps_its_sequence(path: str) -> None:
    """A fact replayed after its delivery is a no-op with its first sequence (no gap, no duplicate), after reopening."""
    box = Outbox(path)
    original = box.enqueue(event(event_id="replayed-0001"))
    box.enqueue(event())
    box.ack([original.event_id])
    box.close()
    box = Outbox(path)
    assert box.enqueue(event(event_id="replayed-0001")).sequence == original.sequence == 1
    assert box.depth() == 1 and box.last_sequence() == 2


def test_the_remembered_delivered_ids_are_bounded(path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Only the newest DELIVERED_IDS_KEPT acknowledged ids are remembered."""
    monkeypatch.setattr("agent.report.outbox.DELIVERED_IDS_KEPT", 3)
    box = Outbox(path)
    stored = [box.enqueue(event()) for _ in range(5)]
    box.ack([e.event_id for e in stored])
    assert box.enqueue(stored[0]).sequence == 6, "forgotten: enqueued anew"
    assert box.enqueue(stored[4]).sequence == 5, "remembered"


def test_size_bound_drops_heartbeats_first_then_other_droppable_kinds(path: str) -> None:
    """Over the bound, the oldest heartbeats go first, then snapshot changes; violations stay."""
    box = Outbox(path, max_events=10)
    violation = box.enqueue(event("policy_violation"))
    changes = [box.enqueue(event("snapshot_changed")) for _ in range(3)]
    beats = [box.enqueue(event("heartbeat")) for _ in range(6)]
    assert box.depth() == 10
    box.enqueue(event("heartbeat"))
    remaining = [e.event_id for e in box.pending(100)]
    assert beats[0].event_id not in remaining and beats[1].event_id in remaining
    for _ in range(6):
        box.enqueue(event("rollback"))
    kinds = [e.kind for e in box.pending(100)]
    assert kinds.count("heartbeat") == 0
    assert kinds.count("snapshot_changed") == 3
    assert violation.event_id in {e.event_id for e in box.pending(100)}
    assert box.dropped_counts() == {"heartbeat": 7}
    assert box.depth() == 10
    assert changes[0].event_id in {e.event_id for e in box.pending(100)}


def test_never_dropped_kinds_outgrow_the_bound(path: str) -> None:
    """When only violations, blocks and rollbacks are left, the outbox grows past max_events."""
    box = Outbox(path, max_events=10)
    for kind in ["policy_violation", "transaction_blocked", "rollback"] * 4:
        box.enqueue(event(kind))
    box.enqueue(event("snapshot_changed"))
    assert box.depth() == 12
    assert [e.kind for e in box.pending(100)].count("snapshot_changed") == 0
    assert box.dropped_counts() == {"snapshot_changed": 1}


def test_reject_moves_an_event_out_of_the_queue(path: str) -> None:
    """A refused event stops blocking the queue and is kept in the rejected table."""
    box = Outbox(path)
    bad, good = box.enqueue(event()), box.enqueue(event())
    box.reject(bad.event_id, "HTTP 422 invalid")
    assert [e.event_id for e in box.pending(10)] == [good.event_id]
    assert box.rejected_count() == 1


def test_outbox_file_is_private(path: str) -> None:
    """The database is created readable by its owner only."""
    Outbox(path).enqueue(event())
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600


def test_concurrent_enqueues_get_unique_contiguous_sequences(path: str) -> None:
    """Jobs on several threads, and a second process-like connection, share one sequence."""
    box = Outbox(path)
    other = Outbox(path)  # as the apt/dnf guard process would open it

    def work(target: Outbox) -> None:
        for _ in range(25):
            target.enqueue(event())

    threads = [threading.Thread(target=work, args=(box if i % 2 else other,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [e.sequence for e in box.pending(1000)] == list(range(1, 101))


def test_corrupt_file_is_moved_aside_and_a_fresh_outbox_started(path: str) -> None:
    """A damaged database does not stop the agent; the file is kept for inspection."""
    Path(path).parent.mkdir(parents=True)
    Path(path).write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(InputFileError):
        Outbox(path)
    box = Outbox.open_or_recover(path)
    assert box.depth() == 0
    assert any(name.startswith("outbox.sqlite3.corrupt-") for name in os.listdir(Path(path).parent))
