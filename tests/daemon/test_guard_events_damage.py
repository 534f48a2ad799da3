"""Guard-events forwarding on hostile lines and crashes: quarantine and move on, one sequence per line, ever."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import List

import pytest

from agent.daemon_jobs.guard_events import GuardEventForwarder, event_id_for_line
from agent.host import Host
from agent.report.events import Event
from tests.conftest import fixed_clock
from tests.daemon.test_guard import BLOCKED, WARNED, _raw
from tests.daemon.test_jobs import make_runtime

HOSTILE_LINES = {
    "violations_a_number": json.dumps({"kind": "override_used", "occurred_at": "2026-03-01T12:00:00+00:00",
                                       "window": {"id": "w", "reason": "r", "opened_by": "o",
                                                  "expires_at": "2026-03-02T12:00:00+00:00"},
                                       "violations": 5}).encode(),
    "deep_array": b'{"kind": "rollback", "x": ' + b"[" * 100000 + b"]" * 100000 + b"}",
    "not_utf8": b'{"kind": "\xff"}',
    "nan": b'{"kind": "rollback", "reason": NaN}',
    "not_an_object": b"[1, 2]",
    "packages_a_list": json.dumps({"kind": "transaction_blocked", "tool": "apt", "rule": "r", "message": "m",
                                   "packages": [1]}).encode(),
}


@pytest.fixture
def forwarding(tmp_path: Path):
    rt = make_runtime(tmp_path, Host(root=Path("/"), clock=fixed_clock))
    events = tmp_path / "guard" / "guard-events.jsonl"
    events.parent.mkdir(parents=True)
    yield rt, events, GuardEventForwarder(rt, str(events))
    rt.outbox.close()


def _pending(forwarder: GuardEventForwarder) -> List[Event]:
    return forwarder.runtime.outbox.pending(1000)


@pytest.mark.parametrize("name", sorted(HOSTILE_LINES))
def test_a_hostile_line_is_quarantined_and_forwarding_moves_on(forwarding, name: str) -> None:
    """The job does not fail: the line is kept in the quarantine file, reported once, and the next line arrives."""
    rt, events, forwarder = forwarding
    hostile = HOSTILE_LINES[name]
    with open(events, "ab") as handle:
        handle.write(_raw(BLOCKED) + b"\n" + hostile + b"\n" + _raw(WARNED) + b"\n")
    assert forwarder.run() == 2
    kinds = [e.kind for e in _pending(forwarder)]
    assert kinds == ["transaction_blocked", "state_file_damaged", "policy_violation"]
    damaged = _pending(forwarder)[1].payload
    assert damaged.path == str(events) and damaged.problem.startswith("line 2: ")
    assert Path(forwarder.quarantine_path).read_bytes() == hostile + b"\n"
    assert forwarder.load_position().line_number == 3
    os.unlink(forwarder.position_path)  # a replay reports nothing new
    forwarder.run()
    assert [e.kind for e in _pending(forwarder)] == kinds


def test_a_replay_after_delivery_keeps_one_sequence_per_line(forwarding) -> None:
    """Lines delivered (acknowledged) and then forwarded again after a lost position take no new sequence."""
    rt, events, forwarder = forwarding
    with open(events, "ab") as handle:
        handle.write(_raw(BLOCKED) + b"\n" + _raw(WARNED) + b"\n")
    forwarder.run()
    first = _pending(forwarder)
    assert [e.sequence for e in first] == [1, 2]
    rt.outbox.ack([e.event_id for e in first])
    os.unlink(forwarder.position_path)
    assert forwarder.run() == 2  # committed again as far as the forwarder knows: the outbox made them no-ops
    assert _pending(forwarder) == [] and rt.outbox.last_sequence() == 2
    stored = rt.emitter.emit(first[0].payload, event_id=event_id_for_line(_raw(BLOCKED)))
    assert stored.sequence == 1


def test_a_failed_commit_stores_the_position_of_the_lines_before_it(forwarding, monkeypatch) -> None:
    """When the outbox refuses a commit (disk full), the lines already committed are not read again."""
    rt, events, forwarder = forwarding
    with open(events, "ab") as handle:
        handle.write(_raw(BLOCKED) + b"\n" + _raw(WARNED) + b"\n")
    real_emit = rt.emitter.emit
    calls = []

    def emit(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise OSError(28, "No space left on device")
        return real_emit(*args, **kwargs)

    monkeypatch.setattr(rt.emitter, "emit", emit)
    with pytest.raises(OSError):
        forwarder.run()
    assert forwarder.load_position().line_number == 1
    assert forwarder.run() == 1
    assert [e.kind for e in _pending(forwarder)] == ["transaction_blocked", "policy_violation"]


def _bounded(seconds: int) -> None:
    """Fail the test with SIGALRM instead of hanging CI when a read blocks (a regression)."""
    import signal

    def expired(signum: int, frame: object) -> None:
        raise AssertionError("blocked on a FIFO")  # not an OSError: the readers catch those

    signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)


def test_a_fifo_in_place_of_the_position_or_events_file_never_blocks(forwarding) -> None:
    """A FIFO at guard-events.position.json is an unreadable position (start over, logged), and one at
    guard-events.jsonl forwards nothing: neither waits for a writer."""
    import signal

    rt, events, forwarder = forwarding
    events.write_bytes(_raw(BLOCKED) + b"\n")
    os.mkfifo(forwarder.position_path)
    _bounded(10)
    try:
        assert forwarder.load_position().offset_bytes == 0
        os.unlink(forwarder.position_path)
        events.unlink()
        os.mkfifo(events)
        assert forwarder.run() == 0
    finally:
        signal.alarm(0)


def test_a_fifo_in_place_of_the_quarantine_file_never_blocks(forwarding) -> None:
    """A FIFO at guard-events.quarantine.jsonl makes the run fail with the file named, without waiting for a reader,
    and the position stays before the hostile line."""
    import signal

    from agent.errors import StateWriteError

    rt, events, forwarder = forwarding
    events.write_bytes(_raw(BLOCKED) + b"\n" + HOSTILE_LINES["nan"] + b"\n")
    os.mkfifo(forwarder.quarantine_path)
    _bounded(10)
    try:
        with pytest.raises(StateWriteError) as raised:
            forwarder.run()
    finally:
        signal.alarm(0)
    assert raised.value.path == forwarder.quarantine_path  # no reader: ENXIO at once, not a wait
    assert forwarder.load_position().line_number <= 1
