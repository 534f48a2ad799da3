"""End to end: the real ``gpuguard run`` over damaged state files, hostile guard lines and SIGKILLs.

Each test counts: every sequence the agent ever assigned is stored once at the receiver (or still queued), except
the ones a damaged outbox lost, which are exactly the ones reported as lost.
"""

from __future__ import annotations

import glob
import json
import os
from pathlib import Path
from typing import List

import pytest

from agent.guard.hotpath.state import append_json_line
from agent.report.outbox import Outbox
from agent.statepaths import StatePaths
from tests.daemon.conftest import AgentProcess, agent_config, assert_delivered_once_in_order
from tests.report.receiver import Receiver

pytestmark = pytest.mark.slow

BLOCKED = {"occurred_at": "2026-03-01T12:00:00+00:00", "kind": "transaction_blocked", "tool": "apt",
           "rule": "amd.pairing", "message": "breaks the pinned AMD pairing", "packages": {"rocm-core": "a -> b"}}


def _damage_reports(receiver: Receiver) -> List[dict]:
    return [e["payload"] for e in receiver.stored.values() if e["payload"]["kind"] == "state_file_damaged"]


def _no_duplicates(receiver: Receiver) -> None:
    arrived = [event_id for event_id, _ in receiver.arrivals]
    assert len(arrived) == len(set(arrived)), "an event was sent twice"


@pytest.mark.parametrize("content", [b'{"schema_version": "\xff\xfe"}', b"[" * 100000 + b"]" * 100000],
                         ids=["not_utf8", "deep"])
def test_a_damaged_last_snapshot_is_moved_aside_and_reported(agent: AgentProcess, receiver: Receiver,
                                                             token_file: Path, content: bytes) -> None:
    """run starts (no crash loop), keeps the file for inspection, reports it once, and reports everything else."""
    agent.state_dir.mkdir(parents=True)
    snapshot = agent.state_dir / "last-snapshot.json"
    snapshot.write_bytes(content)
    agent.write_config(agent_config(agent.state_dir, receiver.url, token_file))
    agent.start()
    assert receiver.wait_for(lambda r: "state_file_damaged" in r.kinds_stored() and len(r.stored) >= 8)
    assert agent.terminate() == 0
    assert_delivered_once_in_order(receiver, agent.outbox())
    _no_duplicates(receiver)
    [report] = _damage_reports(receiver)
    assert report["path"] == str(snapshot) and report["moved_to"]
    assert Path(report["moved_to"]).read_bytes() == content
    assert "snapshot_changed" in receiver.kinds_stored(), "carried on from no previous snapshot"


def test_hostile_guard_lines_are_quarantined_and_every_other_line_arrives(agent: AgentProcess, receiver: Receiver,
                                                                         token_file: Path) -> None:
    """violations a number and a 100000-deep array do not stop forwarding: 20 good lines arrive, 2 are reported."""
    agent.write_config(agent_config(agent.state_dir, receiver.url, token_file, heartbeat_interval_seconds=600))
    events = agent.root / str(agent.state_dir).lstrip("/") / "guard-events.jsonl"
    agent.start()
    assert receiver.wait_for(lambda r: r.kinds_stored() == ["snapshot_changed"])
    hostile = [json.dumps({"kind": "override_used", "window": {"id": "w"}, "violations": 5}).encode(),
               b'{"kind": "rollback", "x": ' + b"[" * 100000 + b"]" * 100000 + b"}"]
    for n in range(20):
        append_json_line(str(events), {**BLOCKED, "occurred_at": f"2026-03-01T12:00:{n:02d}+00:00"})
        if n in (5, 12):
            with open(events, "ab") as handle:
                handle.write(hostile[0 if n == 5 else 1] + b"\n")
    assert receiver.wait_for(lambda r: r.kinds_stored().count("transaction_blocked") == 20, timeout_seconds=20)
    assert receiver.wait_for(lambda r: r.kinds_stored().count("state_file_damaged") == 2)
    assert agent.terminate() == 0
    assert_delivered_once_in_order(receiver, agent.outbox())
    _no_duplicates(receiver)
    assert sorted(r["problem"].split(":")[0] for r in _damage_reports(receiver)) == ["line 15", "line 7"]
    quarantine = agent.state_dir / "guard-events.quarantine.jsonl"
    assert quarantine.read_bytes() == hostile[0] + b"\n" + hostile[1] + b"\n"


def test_a_guard_line_replayed_after_sigkill_keeps_its_sequence(agent: AgentProcess, receiver: Receiver,
                                                                token_file: Path) -> None:
    """Delivered lines forwarded again after a SIGKILL (the position lost) take no new sequence: no gap, no dup."""
    agent.write_config(agent_config(agent.state_dir, receiver.url, token_file, heartbeat_interval_seconds=600))
    events = agent.root / str(agent.state_dir).lstrip("/") / "guard-events.jsonl"
    agent.start()
    for n in range(10):
        append_json_line(str(events), {**BLOCKED, "occurred_at": f"2026-03-01T12:00:{n:02d}+00:00"})
    assert receiver.wait_for(lambda r: r.kinds_stored().count("transaction_blocked") == 10)
    agent.kill()
    os.unlink(agent.state_dir / "guard-events.position.json")  # as if killed before the position was stored
    agent.start()
    agent.wait_for_log("guard_events_forwarded", events=10)  # read again...
    append_json_line(str(events), {**BLOCKED, "occurred_at": "2026-03-01T12:01:00+00:00"})
    assert receiver.wait_for(lambda r: r.kinds_stored().count("transaction_blocked") == 11)
    assert agent.terminate() == 0
    stored = assert_delivered_once_in_order(receiver, agent.outbox())  # ...but no gap: no new sequences
    assert stored == list(range(1, len(stored) + 1))
    first_sequence: dict = {}
    for event_id, sequence in receiver.arrivals:  # a batch resent after the SIGKILL comes with its sequences
        assert first_sequence.setdefault(event_id, sequence) == sequence, "one event, two sequences"


def _queue_events_with_the_endpoint_down(agent: AgentProcess, token_file: Path, count: int) -> Receiver:
    receiver = Receiver().start()
    receiver.stop()
    agent.write_config(agent_config(agent.state_dir, receiver.url, token_file, heartbeat_interval_seconds=0.05))
    agent.start()
    agent.wait_for_log("delivery_failed", category="unreachable")
    outbox_path = Path(StatePaths(str(agent.state_dir)).outbox)
    deadline_box = Outbox(str(outbox_path))
    try:
        while deadline_box.depth() < count:
            pass
    finally:
        deadline_box.close()
    agent.kill()
    return receiver


def test_an_emptied_outbox_is_reported_with_the_lost_count(agent: AgentProcess, token_file: Path) -> None:
    """46+ queued events, the file truncated to 0 bytes: the restart says how many were lost, no sequence reused."""
    receiver = _queue_events_with_the_endpoint_down(agent, token_file, 46)
    path = Path(StatePaths(str(agent.state_dir)).outbox)
    box = Outbox(str(path))
    queued, last = box.depth(), box.last_sequence()
    box.close()
    for suffix in ("-wal", "-shm"):
        if os.path.exists(str(path) + suffix):
            os.unlink(str(path) + suffix)
    os.truncate(path, 0)
    receiver.start()
    try:
        agent.start()
        assert receiver.wait_for(lambda r: "state_file_damaged" in r.kinds_stored() and len(r.stored) >= 5)
        assert agent.terminate() == 0
    finally:
        receiver.stop()
    [report] = _damage_reports(receiver)
    # From the high-water mark, written just after each commit: a SIGKILL between the two leaves it one behind.
    assert queued - 1 <= report["lost_events"] <= queued and queued >= 46
    stored = receiver.sequences_stored()
    assert min(stored) > last, "no sequence reused"
    box = agent.outbox()
    pending = [e.sequence for e in box.pending(100000)]
    assert set(stored) | set(pending) == set(range(min(stored), box.last_sequence() + 1)), "no gap after the damage"
    _no_duplicates(receiver)


def test_a_damaged_outbox_page_is_salvaged_at_start(agent: AgentProcess, token_file: Path) -> None:
    """A bad page behind an intact header: found at open, the readable events delivered, the rest counted lost."""
    receiver = _queue_events_with_the_endpoint_down(agent, token_file, 60)
    path = Path(StatePaths(str(agent.state_dir)).outbox)
    box = Outbox(str(path))
    box._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    queued, last = box.depth(), box.last_sequence()
    box.close()
    size = os.path.getsize(path)
    with open(path, "r+b") as handle:
        handle.seek(size - 4096)
        handle.write(b"\xde\xad\xbe\xef" * 1024)
    receiver.start()
    try:
        agent.start()
        assert receiver.wait_for(lambda r: "state_file_damaged" in r.kinds_stored())
        [report] = _damage_reports(receiver)
        assert 0 < report["salvaged_events"] < queued
        # lost_events comes from the high-water mark, written just after each commit: a SIGKILL between the two
        # leaves it one event behind.
        assert queued - report["salvaged_events"] - 1 <= report["lost_events"] <= queued - report["salvaged_events"]
        assert receiver.wait_for(lambda r: len(r.stored) >= report["salvaged_events"] + 5)
        assert agent.terminate() == 0
    finally:
        receiver.stop()
    assert glob.glob(str(path) + ".damaged-*"), "the damaged file is kept"
    stored = receiver.sequences_stored()
    box = agent.outbox()
    pending = [e.sequence for e in box.pending(100000)]
    everything = set(stored) | set(pending)
    assert len(stored) == len(set(stored)) and not set(stored) & set(pending)
    old = {s for s in everything if s <= last}
    assert len(old) == report["salvaged_events"], "every salvaged event delivered once, with its own sequence"
    new = sorted(s for s in everything if s > last)
    assert new == list(range(new[0], box.last_sequence() + 1)), "no gap after the damage"
    _no_duplicates(receiver)
