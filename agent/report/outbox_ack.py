"""The outbox's acknowledgement and its high-water mark, standard library only: shared by the Outbox
(agent/report/outbox.py) and the lean delivery child (agent/daemon_jobs/lean_delivery.py), which marks what the
receiver acknowledged without loading pydantic or structlog (issue #45)."""

from __future__ import annotations

import json
import sqlite3

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs milliseconds of the lean child's start (issue #45)
    from typing import Iterable

# Acknowledged event ids remembered, newest first: a fact enqueued again after its delivery (a guard line replayed
# after a SIGKILL) keeps the sequence it was delivered with instead of taking a new one (a gap at the receiver).
DELIVERED_IDS_KEPT = 20000
HWM_SUFFIX = ".hwm"
# Sequences reserved ahead in the high-water mark: after damage, numbering resumes above them, so a sequence
# assigned just before a SIGKILL (its mark not yet written) is never given to another event.
RESERVED_SEQUENCES = 100
HWM_FORMAT = 1


class HighWater:
    """Recorded beside the outbox: the last sequence and depth after a commit (written just after it, so a SIGKILL
    can leave them one event behind), and sequences reserved before they are assigned (never reused after damage).

    Immutable, compared by value. Not a dataclass: dataclasses brings inspect, milliseconds of the lean delivery
    child's start (agent/daemon_jobs/lean_delivery.py, issue #45)."""

    __slots__ = ("last_sequence", "queued", "reserved_through")
    last_sequence: int
    queued: int
    reserved_through: int

    def __init__(self, last_sequence: int = 0, queued: int = 0, reserved_through: int = 0) -> None:
        object.__setattr__(self, "last_sequence", last_sequence)
        object.__setattr__(self, "queued", queued)
        object.__setattr__(self, "reserved_through", reserved_through)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"HighWater is immutable: {name}")

    def _values(self) -> tuple:
        return (self.last_sequence, self.queued, self.reserved_through)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, HighWater) and self._values() == other._values()

    def __hash__(self) -> int:
        return hash(self._values())

    def __repr__(self) -> str:
        return "HighWater(last_sequence={}, queued={}, reserved_through={})".format(*self._values())


def high_water_of(data: object) -> HighWater:
    """The mark from the file's JSON; zeros for another format or a field that is not a whole number; pure."""
    if not isinstance(data, dict) or data.get("format") != HWM_FORMAT:
        return HighWater()
    values = [data.get(k, 0) for k in ("last_sequence", "queued", "reserved_through")]
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        return HighWater()
    return HighWater(*(max(0, v) for v in values))


def high_water_text(mark: HighWater) -> str:
    """The mark as its file holds it."""
    return json.dumps({"format": HWM_FORMAT, "last_sequence": mark.last_sequence, "queued": mark.queued,
                       "reserved_through": mark.reserved_through}, sort_keys=True) + "\n"


def next_high_water(conn: sqlite3.Connection, reserved_through: int) -> HighWater:
    """The mark to write now: the file's last sequence and depth, more sequences reserved once they are used up."""
    last_sequence = last_sequence_of(conn)
    if last_sequence >= reserved_through:
        reserved_through = last_sequence + RESERVED_SEQUENCES
    return HighWater(last_sequence, count_of(conn), reserved_through)


def ack_rows(conn: sqlite3.Connection, event_ids: Iterable[str], kept: int = DELIVERED_IDS_KEPT) -> int:
    """Within the caller's transaction: move acknowledged events to ``delivered`` (the newest ``kept`` ids stay
    remembered); returns how many left the queue."""
    removed = 0
    for event_id in event_ids:
        conn.execute("INSERT OR IGNORE INTO delivered (sequence, event_id) "
                     "SELECT sequence, event_id FROM events WHERE event_id = ?", (event_id,))
        removed += conn.execute("DELETE FROM events WHERE event_id = ?", (event_id,)).rowcount
    conn.execute("DELETE FROM delivered WHERE sequence <= (SELECT sequence FROM delivered "
                 "ORDER BY sequence DESC LIMIT 1 OFFSET ?)", (kept,))
    return removed


def count_of(conn: sqlite3.Connection) -> int:
    """How many events wait for delivery."""
    return int(conn.execute("SELECT COUNT(*) FROM events").fetchone()[0])


def last_sequence_of(conn: sqlite3.Connection) -> int:
    """The highest sequence ever assigned by this file (0 before the first event)."""
    row = conn.execute("SELECT seq FROM sqlite_sequence WHERE name = 'events'").fetchone()
    return int(row[0]) if row else 0
