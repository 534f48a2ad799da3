"""The durable outbox: report events wait here, on disk, until the endpoint has acknowledged them.

One SQLite file (WAL journal, ``synchronous=FULL``) under the state directory, one connection shared behind a lock.

Guarantees
- ``enqueue`` commits the event before it returns; delivery is only ever tried on committed events, so a crash
  (SIGKILL, power loss) after ``enqueue`` returned never loses the event.
- Each event gets a ``sequence`` on insert: strictly increasing and never reused for the life of the file
  (``AUTOINCREMENT``), so the receiver can see order and gaps.
- ``pending`` hands events out oldest first; an event leaves the outbox only through ``ack`` (the receiver took
  it, or already had it) or ``reject`` (the receiver refused it as invalid; it is kept in the ``rejected`` table
  for inspection), or through the size bound below. Delivery is therefore at least once, in sequence order; the
  receiver makes it exactly once by deduplicating on ``event_id``.
- Enqueueing an ``event_id`` that is already queued, or was acknowledged among the last ``DELIVERED_IDS_KEPT``
  events, is a no-op returning the event with its first sequence: one sequence per fact, ever (the id is the
  idempotency key end to end).

Size bound (``max_events``)
When an insert leaves more than ``max_events`` events queued, the oldest droppable events are deleted until the
bound holds again: heartbeats first (each one is superseded by the next), then other kinds that are not in
``NEVER_DROPPED_KINDS`` (snapshot changes, health regressions, CPU fallbacks, failed checks), oldest first. Policy
violations, blocked transactions, rollbacks and override-window use are never dropped: if only those are left the
outbox grows
past the bound and logs ``outbox_over_bound``. Every drop is counted per kind (``dropped_counts``, exported as
``gpuguard_outbox_dropped_total``) and shows at the receiver as a gap in ``sequence``.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Callable, Dict, Iterable, List, Optional, Protocol, Tuple, Type, TypeVar

from agent.errors import InputFileError
from agent.files import move_aside, read_json_file, write_atomically
from agent.log import get_logger
from agent.report.outbox_ack import (
    DELIVERED_IDS_KEPT,
    HWM_SUFFIX,
    HighWater,
    ack_rows,
    count_of,
    high_water_of,
    high_water_text,
    last_sequence_of,
    next_high_water,
)
from agent.report.plain import NEVER_DROPPED_KINDS, PlainStateFileDamaged

if TYPE_CHECKING:  # pragma: no cover - pydantic's Event only where events are read back (a delivery child, the hub)
    from agent.report.events import Event

log = get_logger("outbox")

SCHEMA_VERSION = 1
# Drop classes, lowest dropped first.
DROP_FIRST, DROP_LATER, NEVER_DROP = 0, 1, 2
MAX_REJECTED_KEPT = 1000

_SCHEMA = """
CREATE TABLE IF NOT EXISTS events (
    sequence INTEGER PRIMARY KEY AUTOINCREMENT,
    event_id TEXT NOT NULL UNIQUE,
    kind TEXT NOT NULL,
    drop_class INTEGER NOT NULL,
    enqueued_at REAL NOT NULL,
    body TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS events_by_drop_class ON events (drop_class, sequence);
CREATE TABLE IF NOT EXISTS rejected (
    sequence INTEGER PRIMARY KEY,
    event_id TEXT NOT NULL,
    kind TEXT NOT NULL,
    rejected_at REAL NOT NULL,
    reason TEXT NOT NULL,
    body TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS dropped (
    kind TEXT PRIMARY KEY,
    count INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS delivered (
    sequence INTEGER PRIMARY KEY,
    event_id TEXT NOT NULL UNIQUE
);
"""


class OutboxEvent(Protocol):
    """What the outbox stores: the resident's ``PlainEvent`` (agent/report/plain.py) or the pydantic ``Event``."""

    @property
    def event_id(self) -> str: ...

    @property
    def kind(self) -> str: ...

    def with_sequence(self: E, sequence: int) -> E: ...

    def to_json_text(self) -> str: ...


E = TypeVar("E", bound=OutboxEvent)
# One row of the events table: sequence, event_id, kind, drop_class, enqueued_at, body.
EventRow = Tuple[object, ...]


def drop_class_of(kind: str) -> int:
    """Which drop class an event kind belongs to under the size bound."""
    if kind in NEVER_DROPPED_KINDS:
        return NEVER_DROP
    if kind == "heartbeat":
        return DROP_FIRST
    return DROP_LATER


class Outbox:
    """Events committed to disk, handed out in sequence order until acknowledged."""

    def __init__(self, path: str, max_events: int = 10000, clock: Callable[[], float] = time.time) -> None:
        self.path = path
        self.max_events = max_events
        self._clock = clock
        self._lock = threading.Lock()
        self._conn = self._open(path)
        # Damage found (and survived) since the last take_damage(): the daemon reports each as state_file_damaged.
        self._damage: List[PlainStateFileDamaged] = []
        self._hwm_failing = False
        self._reserved_through = 0
        self._check_high_water_mark()

    def _check_high_water_mark(self) -> None:
        """A file that holds fewer sequences than were assigned was replaced or emptied: say so, never reuse them."""
        mark = read_high_water_mark(self.path)
        self._reserved_through = mark.reserved_through
        last_sequence, queued = max(mark.last_sequence, mark.reserved_through), mark.queued
        found = self._last_sequence()
        if mark.last_sequence <= found:
            return
        depth = self._count()
        lost = max(0, queued - depth)
        problem = (f"the outbox was replaced or emptied: sequence {mark.last_sequence} was assigned and {queued} "
                   f"events were queued, the file holds sequence {found} and {depth} events")
        log.error("outbox_replaced_or_emptied", path=self.path, high_water_sequence=mark.last_sequence,
                  found_sequence=found, lost_events=lost)
        self._set_sequence_floor(last_sequence)
        self._damage.append(PlainStateFileDamaged(path=self.path, problem=problem, action=(
            f"carrying on; new events continue after sequence {last_sequence}, the receiver sees the lost ones "
            "as a gap"), lost_events=lost))

    def _set_sequence_floor(self, sequence: int) -> None:
        with self._transaction():
            if self._conn.execute("UPDATE sqlite_sequence SET seq = MAX(seq, ?) WHERE name = 'events'",
                                  (sequence,)).rowcount == 0:
                self._conn.execute("INSERT INTO sqlite_sequence (name, seq) VALUES ('events', ?)", (sequence,))
        self._write_high_water_mark()

    def _write_high_water_mark(self) -> None:
        """Record the last sequence and the depth beside the file (best effort: a full disk is logged once)."""
        try:
            mark = next_high_water(self._conn, self._reserved_through)
            self._reserved_through = mark.reserved_through
            write_high_water_mark(self.path, mark)
        except OSError as exc:
            if not self._hwm_failing:
                log.warning("outbox_high_water_mark_not_written", path=self.path + HWM_SUFFIX, error=str(exc))
            self._hwm_failing = True
            return
        if self._hwm_failing:
            log.info("outbox_high_water_mark_written_again", path=self.path + HWM_SUFFIX)
        self._hwm_failing = False

    def take_damage(self) -> List[PlainStateFileDamaged]:
        """The damage found since the last call, to be reported (each reported once)."""
        with self._lock:
            damage, self._damage = self._damage, []
        return damage

    def check(self) -> bool:
        """PRAGMA quick_check now; a damaged file is salvaged into a fresh one (see take_damage). True when sound."""
        with self._lock:
            try:
                self._conn.execute("PRAGMA shrink_memory")  # read the pages from the file, not from the cache
                rows = self._conn.execute("PRAGMA quick_check").fetchall()
                problem = None if rows == [("ok",)] else "; ".join(str(r[0]) for r in rows[:5])
            except sqlite3.DatabaseError as exc:
                problem = str(exc)
            if problem is None:
                return True
            self._conn.close()
            damage = rebuild(self.path, f"damaged ({problem})")
            self._conn = self._open(self.path)
            self._restore(damage)
        return False

    def _restore(self, salvage: "Salvage") -> None:
        """Put salvaged rows into the fresh file, keep sequences above everything assigned, record the damage."""
        with self._transaction():
            for row in salvage.rows:
                self._conn.execute("INSERT OR IGNORE INTO events (sequence, event_id, kind, drop_class, enqueued_at, "
                                   "body) VALUES (?, ?, ?, ?, ?, ?)", row)
        floor = max(salvage.last_sequence, salvage.mark.last_sequence, salvage.mark.reserved_through)
        self._set_sequence_floor(floor)
        self._damage.append(salvage.report(self.path))

    @staticmethod
    def _open(path: str) -> sqlite3.Connection:
        # os.path, not pathlib: the resident's only use of it, with urllib.parse and ipaddress 0.5 MiB (issue #45).
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        if not os.path.exists(path):
            # Created owner-only before SQLite touches it; SQLite gives its -wal/-shm files the same mode.
            os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o600))
        conn = None
        try:
            conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=30.0)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=FULL")
            conn.executescript(_SCHEMA)
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            if version == 0:
                conn.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
            elif version != SCHEMA_VERSION:
                raise InputFileError(path, f"outbox schema version {version}, this agent knows {SCHEMA_VERSION}")
            # A damaged page behind an intact header opens fine and fails later, in every job: look now.
            rows = conn.execute("PRAGMA quick_check").fetchall()
            if rows != [("ok",)]:
                raise InputFileError(path, "damaged (" + "; ".join(str(r[0]) for r in rows[:5]) + ")")
            return conn
        except sqlite3.DatabaseError as exc:
            if conn is not None:
                conn.close()
            raise InputFileError(path, f"not a usable outbox database ({exc})") from None

    @classmethod
    def open_or_recover(cls, path: str, max_events: int = 10000) -> "Outbox":
        """Open the outbox; a damaged file is moved aside (kept), its readable rows salvaged into a fresh one."""
        try:
            return cls(path, max_events)
        except InputFileError as exc:
            salvage = rebuild(path, exc.reason)
        box = cls(path, max_events)
        box._damage = []  # the high-water check saw the fresh file; the salvage report says it all
        with box._lock:
            box._restore(salvage)
        return box

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def enqueue(self, event: E) -> E:
        """Commit the event with the next sequence number and return it as stored (sequence set)."""
        kind = event.kind
        with self._lock:
            if self._last_sequence() + 1 > self._reserved_through:
                self._write_high_water_mark()  # reserves the next RESERVED_SEQUENCES before one is assigned
        with self._lock, self._transaction():
            row = self._conn.execute("SELECT sequence FROM events WHERE event_id = ? UNION ALL "
                                     "SELECT sequence FROM delivered WHERE event_id = ?",
                                     (event.event_id, event.event_id)).fetchone()
            if row is not None:
                return event.with_sequence(int(row[0]))
            cursor = self._conn.execute(
                "INSERT INTO events (event_id, kind, drop_class, enqueued_at, body) VALUES (?, ?, ?, ?, '')",
                (event.event_id, kind, drop_class_of(kind), self._clock()))
            stored = event.with_sequence(int(cursor.lastrowid or 0))
            self._conn.execute("UPDATE events SET body = ? WHERE sequence = ?",
                               (stored.to_json_text(), cursor.lastrowid))
            self._enforce_bound()
        with self._lock:
            self._write_high_water_mark()
        return stored

    def _enforce_bound(self) -> None:
        excess = self._count() - self.max_events
        for drop_class in (DROP_FIRST, DROP_LATER):
            if excess <= 0:
                return
            victims = self._conn.execute(
                "SELECT sequence, kind FROM events WHERE drop_class = ? ORDER BY sequence LIMIT ?",
                (drop_class, excess)).fetchall()
            for sequence, kind in victims:
                self._conn.execute("DELETE FROM events WHERE sequence = ?", (sequence,))
                self._conn.execute("INSERT INTO dropped (kind, count) VALUES (?, 1) "
                                   "ON CONFLICT(kind) DO UPDATE SET count = count + 1", (kind,))
            if victims:
                log.warning("outbox_dropped_events", drop_class=drop_class, count=len(victims),
                            first_sequence=victims[0][0], last_sequence=victims[-1][0], max_events=self.max_events)
            excess -= len(victims)
        if excess > 0:
            log.warning("outbox_over_bound", depth=self.max_events + excess, max_events=self.max_events,
                        reason="only never-dropped events (violations, blocks, rollbacks, overrides) are left")

    def pending(self, limit: int) -> List[Event]:
        """Up to ``limit`` queued events, lowest sequence first (validated by pydantic: a delivery child's read)."""
        from agent.report.events import Event

        with self._lock:
            rows = self._conn.execute("SELECT sequence, body FROM events ORDER BY sequence LIMIT ?",
                                      (limit,)).fetchall()
        events = []
        for sequence, body in rows:
            try:
                events.append(Event.model_validate_json(body))
            except ValueError as exc:
                # Written by another agent version or damaged: park it rather than block the queue forever.
                self._reject_row(sequence, f"unreadable in the outbox: {exc}")
        return events

    def ack(self, event_ids: Iterable[str]) -> int:
        """Forget events the receiver has (accepted now or earlier); returns how many were removed."""
        ids = list(event_ids)
        if not ids:
            return 0
        with self._lock, self._transaction():
            removed = ack_rows(self._conn, ids, DELIVERED_IDS_KEPT)
        with self._lock:
            self._write_high_water_mark()
        return removed

    def reject(self, event_id: str, reason: str) -> None:
        """Move an event the receiver refused as invalid out of the queue, into ``rejected``."""
        with self._lock:
            row = self._conn.execute("SELECT sequence FROM events WHERE event_id = ?", (event_id,)).fetchone()
        if row is not None:
            self._reject_row(row[0], reason)

    def _reject_row(self, sequence: int, reason: str) -> None:
        with self._lock, self._transaction():
            self._conn.execute(
                "INSERT OR REPLACE INTO rejected (sequence, event_id, kind, rejected_at, reason, body) "
                "SELECT sequence, event_id, kind, ?, ?, body FROM events WHERE sequence = ?",
                (self._clock(), reason[:2000], sequence))
            self._conn.execute("DELETE FROM events WHERE sequence = ?", (sequence,))
            self._conn.execute("DELETE FROM rejected WHERE sequence NOT IN "
                               "(SELECT sequence FROM rejected ORDER BY sequence DESC LIMIT ?)", (MAX_REJECTED_KEPT,))
        log.error("outbox_event_rejected", sequence=sequence, reason=reason[:500])

    def depth(self) -> int:
        """How many events wait for delivery."""
        with self._lock:
            return self._count()

    def _count(self) -> int:
        return count_of(self._conn)

    def oldest_age_seconds(self) -> Optional[float]:
        """How long the oldest waiting event has waited, or None when the outbox is empty."""
        with self._lock:
            row = self._conn.execute("SELECT MIN(enqueued_at) FROM events").fetchone()
        return None if row[0] is None else max(0.0, self._clock() - row[0])

    def dropped_counts(self) -> Dict[str, int]:
        """Events dropped by the size bound since the file was created, per kind."""
        with self._lock:
            return dict(self._conn.execute("SELECT kind, count FROM dropped ORDER BY kind").fetchall())

    def rejected_count(self) -> int:
        with self._lock:
            return int(self._conn.execute("SELECT COUNT(*) FROM rejected").fetchone()[0])

    def last_sequence(self) -> int:
        """The highest sequence ever assigned by this file (0 before the first event)."""
        with self._lock:
            return self._last_sequence()

    def _last_sequence(self) -> int:
        return last_sequence_of(self._conn)

    def _transaction(self) -> "_Transaction":
        return _Transaction(self._conn)


class _Transaction:
    """BEGIN IMMEDIATE ... COMMIT, rolled back on any exception."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn

    def __enter__(self) -> None:
        self._conn.execute("BEGIN IMMEDIATE")

    def __exit__(self, exc_type: Optional[Type[BaseException]], exc: Optional[BaseException],
                 tb: Optional[TracebackType]) -> None:
        self._conn.execute("COMMIT" if exc_type is None else "ROLLBACK")


# Sequences probed one by one past a damaged page (the newest ones: the outbox holds at most max_events).
MAX_PROBED_SEQUENCES = 100000


def read_high_water_mark(path: str) -> HighWater:
    """The high-water mark beside the outbox; zeros when there is none or it is unreadable (logged)."""
    try:
        data = read_json_file(path + HWM_SUFFIX)
    except InputFileError as exc:
        log.error("outbox_high_water_mark_unreadable", path=path + HWM_SUFFIX, error=exc.reason,
                  action="checking the outbox without it")
        return HighWater()
    return high_water_of(data)


def write_high_water_mark(path: str, mark: HighWater) -> None:
    write_atomically(path + HWM_SUFFIX, high_water_text(mark), mode=0o600)


@dataclass
class Salvage:
    """What could be read back from a damaged outbox file before it was moved aside."""

    problem: str
    moved_to: Optional[str]
    rows: List[EventRow]
    last_sequence: int
    mark: HighWater  # as it was before the damaged file was moved aside

    def report(self, path: str) -> PlainStateFileDamaged:
        lost = max(0, self.mark.queued - len(self.rows)) if self.mark.queued else None
        return PlainStateFileDamaged(path=path, problem=self.problem[:2000], moved_to=self.moved_to,
                                action="salvaged the readable events into a fresh outbox", salvaged_events=len(
                                    self.rows), lost_events=lost)


def salvage_rows(path: str) -> Tuple[List[EventRow], int]:
    """The readable event rows of a (damaged) outbox file and its last sequence; best effort, never raises."""
    columns = "sequence, event_id, kind, drop_class, enqueued_at, body"
    rows: Dict[int, EventRow] = {}
    last_sequence = 0
    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5.0)
    except sqlite3.Error:
        return [], 0
    try:
        try:
            found = conn.execute("SELECT seq FROM sqlite_sequence WHERE name = 'events'").fetchone()
            last_sequence = int(found[0]) if found else 0
        except (sqlite3.Error, TypeError, ValueError):
            pass
        try:
            for row in conn.execute(f"SELECT {columns} FROM events ORDER BY sequence"):
                rows[int(row[0])] = tuple(row)
        except sqlite3.Error:
            # A scan stops at the first bad page; a lookup by sequence only walks the pages of that row.
            top = max([last_sequence, *rows])
            for sequence in range(max(1, top - MAX_PROBED_SEQUENCES), top + 1):
                if sequence in rows:
                    continue
                try:
                    row = conn.execute(f"SELECT {columns} FROM events WHERE sequence = ?", (sequence,)).fetchone()
                except sqlite3.Error:
                    continue
                if row is not None:
                    rows[sequence] = tuple(row)
    except sqlite3.Error:
        pass
    finally:
        conn.close()
    return [rows[k] for k in sorted(rows)], last_sequence


def rebuild(path: str, problem: str) -> Salvage:
    """Salvage a damaged outbox file, then move it (and its -wal/-shm) aside; loud in the log."""
    rows, last_sequence = salvage_rows(path)
    mark = read_high_water_mark(path)
    moved_to = move_aside(path)
    for suffix in ("-wal", "-shm"):
        if moved_to is not None and os.path.exists(path + suffix):
            os.replace(path + suffix, moved_to + suffix)
        elif os.path.exists(path + suffix):
            os.unlink(path + suffix)
    salvage = Salvage(problem, moved_to, rows, last_sequence, mark)
    log.error("outbox_damaged", path=path, problem=problem, moved_to=moved_to, salvaged_events=len(rows),
              queued_before=mark.queued, action="salvaged the readable events into a fresh outbox")
    return salvage
