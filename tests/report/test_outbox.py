"""The durable outbox: ordering, acknowledgement, durability, idempotency and the size bound."""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path

import pytest

from agent.errors import InputFileError
from agent.report.events import Event, PolicyViolation
from agent.report.outbox import Outbox
from agent.report.outbox_ack import RESERVED_SEQUENCES
from tests.report.events import WHEN, event


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
    assert any(name.startswith("outbox.sqlite3.damaged-") for name in os.listdir(Path(path).parent))
    [damage] = box.take_damage()
    assert damage.kind == "state_file_damaged" and damage.salvaged_events == 0 and damage.moved_to is not None


def _queued(path: str, count: int) -> list:
    box = Outbox(path)
    stored = [box.enqueue(event()) for _ in range(count)]
    box.close()
    return stored


def test_an_emptied_outbox_is_reported_and_its_sequences_are_not_reused(path: str) -> None:
    """Truncated to 0 bytes (46 events queued): reported with the 46 lost; new events continue after the reserved."""
    _queued(path, 46)
    for suffix in ("-wal", "-shm"):
        if os.path.exists(path + suffix):
            os.unlink(path + suffix)
    os.truncate(path, 0)
    box = Outbox.open_or_recover(path)
    [damage] = box.take_damage()
    assert damage.lost_events == 46 and "replaced or emptied" in damage.problem
    assert box.enqueue(event()).sequence == RESERVED_SEQUENCES + 1, "above every sequence possibly assigned"
    assert box.take_damage() == []
    box.close()
    assert Outbox(path).take_damage() == [], "reported once: the high-water mark follows the file now"


def test_a_replaced_outbox_is_reported(path: str) -> None:
    """A different (older, smaller) file put in place of the outbox is caught by the high-water mark."""
    _queued(path, 3)
    older = path + ".old"
    os.rename(path, older)
    for suffix in ("-wal", "-shm"):
        if os.path.exists(path + suffix):
            os.unlink(path + suffix)
    box = Outbox(path)
    [damage] = box.take_damage()
    assert damage.lost_events == 3 and box.enqueue(event()).sequence == RESERVED_SEQUENCES + 1


def _big() -> Event:
    """An event of about 3 kB, so twenty of them fill several pages."""
    return Event(host_id="h1", hostname="host-1", occurred_at=WHEN,
                 payload=PolicyViolation(rule="r", message="x" * 3000))


def _damage_a_data_page(path: str) -> None:
    """Overwrite the last pages (event rows) with garbage, keeping the header and the schema page intact."""
    size = os.path.getsize(path)
    with open(path, "r+b") as handle:
        handle.seek(size - 4096)
        handle.write(b"\xde\xad\xbe\xef" * 1024)


def test_a_damaged_data_page_is_caught_at_open_and_readable_rows_salvaged(path: str) -> None:
    """quick_check at open finds the bad page; the rows on good pages are kept with their sequences."""
    box = Outbox(path)
    stored = [box.enqueue(_big()) for _ in range(20)]
    box._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    box.close()
    _damage_a_data_page(path)
    recovered = Outbox.open_or_recover(path)
    [damage] = recovered.take_damage()
    assert damage.moved_to and os.path.exists(damage.moved_to)
    kept = recovered.pending(100)
    assert 0 < len(kept) < 20 and damage.salvaged_events == len(kept) and damage.lost_events == 20 - len(kept)
    by_id = {e.event_id: e.sequence for e in stored}
    assert all(by_id[e.event_id] == e.sequence for e in kept), "salvaged events keep their sequence"
    assert recovered.enqueue(event()).sequence == RESERVED_SEQUENCES + 1


def test_check_finds_damage_while_running_and_salvages(path: str) -> None:
    """The periodic check rebuilds a file damaged under a running outbox."""
    box = Outbox(path)
    for _ in range(20):
        box.enqueue(_big())
    box._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    assert box.check()
    _damage_a_data_page(path)
    assert not box.check()
    [damage] = box.take_damage()
    assert 0 < damage.salvaged_events < 20 and box.depth() == damage.salvaged_events
    assert box.enqueue(event()).sequence == RESERVED_SEQUENCES + 1 and box.check()
