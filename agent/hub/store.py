"""Where the hub keeps events: a small Store protocol, SQLite by default, PostgreSQL when configured.

Both back ends hold the same two tables:

    events  one row per (host_id, event_id), the idempotency key; the event as canonical JSON in ``body``
    hosts   one row per host: last seen, and the latest pairing and heartbeat by ``occurred_at``

``ingest`` writes any number of batches in one transaction (the group commit in ``writer.py`` calls it from one
thread) and tells, batch by batch, which events were new and which were already stored. The latest-state columns
of ``hosts`` move only forward in ``occurred_at``, so batches arriving out of order or twice change nothing.
Driver errors (sqlite3, psycopg) become StoreError here, once.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import queue
import sqlite3
import threading
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, NamedTuple, Optional, Protocol, Sequence, Tuple, Type

from agent.errors import ConfigError, StoreError  # noqa: F401 - StoreError is part of the store API
from agent.log import get_logger
from agent.models import FrozenModel
from agent.report.events import Event
from agent.snapshot.pairing import Pairing

log = get_logger("hub.store")

SCHEMA_VERSION = 1
# Kinds that count as drift in the fleet API: the stack moved, a check regressed, or policy had to act.
DRIFT_KINDS = ("snapshot_changed", "health_regression", "cpu_fallback", "policy_violation", "rollback")
_ROWS_PER_INSERT = 200  # 9 parameters a row: well under SQLite's 32,766 bound variables
_RETENTION_KEY = "retention_pass_started_at"  # hub_meta: when the last retention pass began (fixed-width UTC text)
# PostgreSQL advisory lock held while a hub creates or checks the schema: hubs starting together take turns.
_SCHEMA_LOCK_KEY = 0x67707567_0001


class BatchResult(FrozenModel):
    """Per batch: event_ids stored now, and event_ids that were already stored (or repeated in the batch)."""

    accepted: List[str]
    duplicates: List[str]


class HostState(FrozenModel):
    """What the hub knows of one host."""

    host_id: str
    hostname: str
    first_seen_at: dt.datetime
    last_seen_at: dt.datetime
    last_event_at: dt.datetime
    last_sequence: int
    pairing: Optional[Pairing] = None
    pairing_at: Optional[dt.datetime] = None
    content_hash: Optional[str] = None
    compliant: Optional[bool] = None
    agent_version: Optional[str] = None
    last_health_status: Optional[str] = None
    heartbeat_at: Optional[dt.datetime] = None


class DriftRow(FrozenModel):
    """Events of one drift kind on one host since a time."""

    host_id: str
    hostname: str
    kind: str
    event_count: int
    first_at: dt.datetime
    last_at: dt.datetime


class EventQuery(FrozenModel):
    """Filters of GET /v1/events."""

    host_id: Optional[str] = None
    kind: Optional[str] = None
    since: Optional[dt.datetime] = None
    limit: int = 100
    newest_first: bool = True


class StoredEvent(FrozenModel):
    """An event as stored: its canonical JSON and when the hub received it."""

    body: str
    received_at: dt.datetime


class Store(Protocol):
    """What the hub needs from a database. ``ingest`` is called from one thread at a time; the rest from any."""

    def open(self) -> None:
        """Connect and create the tables if needed; idempotent."""

    def close(self) -> None:
        """Close every connection."""

    def ping(self) -> None:
        """Raise StoreError unless the database answers."""

    def ingest(self, batches: Sequence[Sequence[Event]], received_at: dt.datetime) -> List[BatchResult]:
        """Store the batches in one transaction; one result per batch, in order."""

    def hosts(self) -> List[HostState]:
        """Every host, by host_id."""

    def drift(self, since: dt.datetime, kinds: Sequence[str] = DRIFT_KINDS) -> List[DriftRow]:
        """Per host and kind, the drift events that occurred at or after ``since``."""

    def events(self, query: EventQuery) -> List[StoredEvent]:
        """Stored events matching the query, by occurred_at."""

    def claim_retention_pass(self, now: dt.datetime, min_interval_seconds: float) -> bool:
        """True when this process should run a retention pass now (see ``agent.hub.retention``)."""

    def prune_batch(self, kind: str, cutoff: dt.datetime, limit: int) -> int:
        """Delete up to ``limit`` events of ``kind`` older than ``cutoff``, never a host's newest of that kind."""


def utc(value: dt.datetime) -> dt.datetime:
    """An aware UTC datetime; a naive one is taken as UTC."""
    if value.tzinfo is None:
        return value.replace(tzinfo=dt.timezone.utc)
    return value.astimezone(dt.timezone.utc)


class _HostUpdate(NamedTuple):
    """The newest facts about one host found in a set of events (pure; see summarize_hosts). A NamedTuple, not a
    model: it never leaves the writer thread, and it is built once per host per commit on the hot path."""

    host_id: str
    hostname: str
    last_event_at: dt.datetime
    last_sequence: int
    pairing_json: Optional[str] = None
    content_hash: Optional[str] = None
    pairing_at: Optional[dt.datetime] = None
    compliant: Optional[bool] = None
    agent_version: Optional[str] = None
    last_health_status: Optional[str] = None
    heartbeat_at: Optional[dt.datetime] = None


def _order_key(event: Event) -> Tuple[dt.datetime, int]:
    return utc(event.occurred_at), event.sequence


def summarize_hosts(events: Sequence[Event]) -> List[_HostUpdate]:
    """Per host, the newest identity, pairing and heartbeat among ``events``."""
    by_host: Dict[str, List[Event]] = {}
    for event in events:
        by_host.setdefault(event.host_id, []).append(event)
    updates = []
    for host_id in sorted(by_host):
        ordered = sorted(by_host[host_id], key=_order_key)
        newest = ordered[-1]
        fields: Dict[str, Any] = {"host_id": host_id, "hostname": newest.hostname,
                                  "last_event_at": utc(newest.occurred_at), "last_sequence": newest.sequence}
        for event in reversed(ordered):
            payload = event.payload
            content_hash: Optional[str]
            if payload.kind == "snapshot_changed":
                pairing, content_hash = payload.pairing, payload.new_hash
            elif payload.kind == "heartbeat" and payload.pairing is not None:
                pairing, content_hash = payload.pairing, payload.content_hash
            else:
                continue
            fields.update(pairing_json=pairing.model_dump_json(), pairing_at=utc(event.occurred_at),
                          content_hash=content_hash)
            break
        for event in reversed(ordered):
            payload = event.payload
            if payload.kind == "heartbeat":
                fields.update(compliant=payload.compliant, agent_version=payload.agent_version,
                              last_health_status=payload.last_health_status, heartbeat_at=utc(event.occurred_at))
                break
        updates.append(_HostUpdate(**fields))
    return updates


_NEWER_EVENT = "excluded.last_event_at >= hosts.last_event_at"
_NEWER_PAIRING = ("excluded.pairing_at IS NOT NULL AND "
                  "(hosts.pairing_at IS NULL OR excluded.pairing_at >= hosts.pairing_at)")
_NEWER_HEARTBEAT = ("excluded.heartbeat_at IS NOT NULL AND "
                    "(hosts.heartbeat_at IS NULL OR excluded.heartbeat_at >= hosts.heartbeat_at)")


def _pick(column: str, condition: str) -> str:
    return f"{column} = CASE WHEN {condition} THEN excluded.{column} ELSE hosts.{column} END"


_UPSERT_HOST = f"""
INSERT INTO hosts (host_id, hostname, first_seen_at, last_seen_at, last_event_at, last_sequence,
                   pairing, content_hash, pairing_at, compliant, agent_version, last_health_status, heartbeat_at)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
ON CONFLICT (host_id) DO UPDATE SET
    {_pick("hostname", _NEWER_EVENT)},
    {_pick("last_sequence", _NEWER_EVENT)},
    {_pick("last_event_at", _NEWER_EVENT)},
    {_pick("last_seen_at", "excluded.last_seen_at >= hosts.last_seen_at")},
    {_pick("pairing", _NEWER_PAIRING)},
    {_pick("content_hash", _NEWER_PAIRING)},
    {_pick("pairing_at", _NEWER_PAIRING)},
    {_pick("compliant", _NEWER_HEARTBEAT)},
    {_pick("agent_version", _NEWER_HEARTBEAT)},
    {_pick("last_health_status", _NEWER_HEARTBEAT)},
    {_pick("heartbeat_at", _NEWER_HEARTBEAT)}
"""

_HOST_COLUMNS = ("host_id, hostname, first_seen_at, last_seen_at, last_event_at, last_sequence, pairing, "
                 "pairing_at, content_hash, compliant, agent_version, last_health_status, heartbeat_at")


def _schema(timestamp_type: str) -> List[str]:
    return [
        "CREATE TABLE IF NOT EXISTS hub_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
        f"""CREATE TABLE IF NOT EXISTS events (
            host_id TEXT NOT NULL,
            event_id TEXT NOT NULL,
            sequence BIGINT NOT NULL,
            kind TEXT NOT NULL,
            severity TEXT NOT NULL,
            hostname TEXT NOT NULL,
            occurred_at {timestamp_type} NOT NULL,
            received_at {timestamp_type} NOT NULL,
            body TEXT NOT NULL,
            PRIMARY KEY (host_id, event_id))""",
        "CREATE INDEX IF NOT EXISTS events_host_occurred ON events (host_id, occurred_at)",
        "CREATE INDEX IF NOT EXISTS events_kind_occurred ON events (kind, occurred_at)",
        "CREATE INDEX IF NOT EXISTS events_occurred ON events (occurred_at)",
        f"""CREATE TABLE IF NOT EXISTS hosts (
            host_id TEXT PRIMARY KEY,
            hostname TEXT NOT NULL,
            first_seen_at {timestamp_type} NOT NULL,
            last_seen_at {timestamp_type} NOT NULL,
            last_event_at {timestamp_type} NOT NULL,
            last_sequence BIGINT NOT NULL,
            pairing TEXT,
            content_hash TEXT,
            pairing_at {timestamp_type},
            compliant BOOLEAN,
            agent_version TEXT,
            last_health_status TEXT,
            heartbeat_at {timestamp_type})""",
    ]


class _Pool:
    """A few idle connections for readers; a connection that raised is closed, not reused."""

    def __init__(self, connect: Callable[[], Any], max_idle: int = 4) -> None:
        self._connect = connect
        self._idle: "queue.LifoQueue[Any]" = queue.LifoQueue(maxsize=max_idle)

    @contextlib.contextmanager
    def connection(self) -> Iterator[Any]:
        try:
            conn = self._idle.get_nowait()
        except queue.Empty:
            conn = self._connect()
        try:
            yield conn
        except BaseException:
            _close_quietly(conn)
            raise
        try:
            self._idle.put_nowait(conn)
        except queue.Full:
            _close_quietly(conn)

    def close(self) -> None:
        while True:
            try:
                _close_quietly(self._idle.get_nowait())
            except queue.Empty:
                return


def _close_quietly(conn: Any) -> None:
    try:
        conn.close()
    except Exception:  # noqa: BLE001 - closing a broken connection may fail again; nothing left to do
        pass


class _SqlStore:
    """The SQL both back ends share; subclasses say how to connect and how times and placeholders look."""

    name = "sql"
    timestamp_type = "TEXT"
    _driver_errors: Tuple[Type[BaseException], ...] = ()

    def __init__(self) -> None:
        self._pool = _Pool(self._connect_reader)
        self._writer: Optional[Any] = None
        self._writer_lock = threading.Lock()
        self._opened = False

    # --- dialect hooks -------------------------------------------------------------------------------------
    def _connect_reader(self) -> Any:
        raise NotImplementedError

    def _connect_writer(self) -> Any:
        raise NotImplementedError

    def _sql(self, text: str) -> str:
        return text

    def _to_db_time(self, value: dt.datetime) -> Any:
        return value

    def _from_db_time(self, value: Any) -> dt.datetime:
        return utc(value)

    @contextlib.contextmanager
    def _transaction(self, conn: Any) -> Iterator[Any]:
        raise NotImplementedError
        yield  # pragma: no cover

    def _lock_schema(self, cur: Any) -> None:
        """Hold off other processes creating the schema until this transaction ends (SQLite: BEGIN IMMEDIATE
        already does)."""

    # --- error mapping -------------------------------------------------------------------------------------
    @contextlib.contextmanager
    def _mapped(self, operation: str) -> Iterator[None]:
        try:
            yield
        except self._driver_errors as exc:
            log.error("hub_store_failed", store=self.name, operation=operation, error=str(exc).strip())
            raise StoreError(operation, str(exc).strip() or type(exc).__name__) from exc

    # --- lifecycle -----------------------------------------------------------------------------------------
    def open(self) -> None:
        if self._opened:
            return
        with self._mapped("open"):
            conn = self._writer_connection()
            with self._transaction(conn) as cur:
                self._lock_schema(cur)
                for statement in _schema(self.timestamp_type):
                    cur.execute(statement)
                cur.execute(self._sql("INSERT INTO hub_meta (key, value) VALUES (?, ?) "
                                      "ON CONFLICT (key) DO NOTHING"), ("schema_version", str(SCHEMA_VERSION)))
                cur.execute(self._sql("SELECT value FROM hub_meta WHERE key = ?"), ("schema_version",))
                found = cur.fetchone()[0]
        if found != str(SCHEMA_VERSION):
            raise StoreError("open", f"database schema version {found}, this hub knows {SCHEMA_VERSION}")
        self._opened = True
        log.info("hub_store_opened", store=self.name)

    def close(self) -> None:
        self._pool.close()
        with self._writer_lock:
            if self._writer is not None:
                _close_quietly(self._writer)
                self._writer = None
        self._opened = False

    def _writer_connection(self) -> Any:
        with self._writer_lock:
            if self._writer is None:
                self._writer = self._connect_writer()
            return self._writer

    def _drop_writer(self) -> None:
        with self._writer_lock:
            if self._writer is not None:
                _close_quietly(self._writer)
                self._writer = None

    def ping(self) -> None:
        with self._mapped("ping"), self._pool.connection() as conn:
            cur = conn.cursor()
            cur.execute("SELECT 1")
            cur.fetchone()

    # --- writes --------------------------------------------------------------------------------------------
    def ingest(self, batches: Sequence[Sequence[Event]], received_at: dt.datetime) -> List[BatchResult]:
        owner: Dict[Tuple[str, str], int] = {}
        unique: List[Event] = []
        for index, batch in enumerate(batches):
            for event in batch:
                key = (event.host_id, event.event_id)
                if key not in owner:
                    owner[key] = index
                    unique.append(event)
        received = self._to_db_time(utc(received_at))
        inserted: set = set()
        try:
            with self._mapped("ingest"):
                conn = self._writer_connection()
                with self._transaction(conn) as cur:
                    for start in range(0, len(unique), _ROWS_PER_INSERT):
                        chunk = unique[start:start + _ROWS_PER_INSERT]
                        cur.execute(self._insert_events_sql(len(chunk)), self._event_params(chunk, received))
                        inserted.update((row[0], row[1]) for row in cur.fetchall())
                    for update in summarize_hosts(unique):
                        cur.execute(self._sql(_UPSERT_HOST), self._host_params(update, received))
        except StoreError:
            self._drop_writer()  # a broken connection is reopened on the next group
            raise
        results = []
        for index, batch in enumerate(batches):
            accepted: List[str] = []
            duplicates: List[str] = []
            answered: set = set()
            for event in batch:
                key = (event.host_id, event.event_id)
                if key in inserted and owner[key] == index and key not in answered:
                    accepted.append(event.event_id)
                else:
                    duplicates.append(event.event_id)
                answered.add(key)
            results.append(BatchResult(accepted=accepted, duplicates=duplicates))
        return results

    # --- retention -----------------------------------------------------------------------------------------
    def claim_retention_pass(self, now: dt.datetime, min_interval_seconds: float) -> bool:
        """True when this process should run a retention pass now: an atomic compare-and-set on the last pass's
        start time in ``hub_meta``, so of several hub processes (workers, machines) over one database only one
        runs a pass per interval."""
        now = utc(now)
        stamp = _sqlite_time(now)
        due_before = _sqlite_time(now - dt.timedelta(seconds=min_interval_seconds))
        with self._mapped("retention"), self._pool.connection() as conn:
            with self._transaction(conn) as cur:
                cur.execute(self._sql("INSERT INTO hub_meta (key, value) VALUES (?, ?) ON CONFLICT (key) DO NOTHING"),
                            (_RETENTION_KEY, _sqlite_time(dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc))))
                cur.execute(self._sql("UPDATE hub_meta SET value = ? WHERE key = ? AND value <= ?"),
                            (stamp, _RETENTION_KEY, due_before))
                return bool(cur.rowcount == 1)

    def prune_batch(self, kind: str, cutoff: dt.datetime, limit: int) -> int:
        """Delete up to ``limit`` events of ``kind`` that occurred before ``cutoff``, never a host's newest event of
        that kind; the number deleted (fewer than ``limit``: nothing more to do for this kind)."""
        sql = self._sql(
            "DELETE FROM events WHERE (host_id, event_id) IN ("
            "SELECT e.host_id, e.event_id FROM events e WHERE e.kind = ? AND e.occurred_at < ? AND EXISTS ("
            "SELECT 1 FROM events n WHERE n.host_id = e.host_id AND n.occurred_at > e.occurred_at AND n.kind = e.kind)"
            " ORDER BY e.occurred_at LIMIT ?)")
        with self._mapped("retention"), self._pool.connection() as conn:
            with self._transaction(conn) as cur:
                cur.execute(sql, (kind, self._to_db_time(utc(cutoff)), limit))
                return int(cur.rowcount)

    def _insert_events_sql(self, rows: int) -> str:
        values = ", ".join(["(?, ?, ?, ?, ?, ?, ?, ?, ?)"] * rows)
        return self._sql("INSERT INTO events (host_id, event_id, sequence, kind, severity, hostname, occurred_at, "
                         f"received_at, body) VALUES {values} "
                         "ON CONFLICT (host_id, event_id) DO NOTHING RETURNING host_id, event_id")

    def _event_params(self, events: Sequence[Event], received: Any) -> List[Any]:
        params: List[Any] = []
        for e in events:
            params += [e.host_id, e.event_id, e.sequence, e.payload.kind, e.severity, e.hostname,
                       self._to_db_time(utc(e.occurred_at)), received, e.model_dump_json()]
        return params

    def _host_params(self, u: _HostUpdate, received: Any) -> List[Any]:
        def t(value: Optional[dt.datetime]) -> Any:
            return None if value is None else self._to_db_time(value)

        return [u.host_id, u.hostname, received, received, t(u.last_event_at), u.last_sequence, u.pairing_json,
                u.content_hash, t(u.pairing_at), u.compliant, u.agent_version, u.last_health_status,
                t(u.heartbeat_at)]

    # --- reads ---------------------------------------------------------------------------------------------
    def _query(self, operation: str, sql: str, params: Sequence[Any] = ()) -> List[Tuple[Any, ...]]:
        with self._mapped(operation), self._pool.connection() as conn:
            cur = conn.cursor()
            cur.execute(self._sql(sql), tuple(params))
            rows = cur.fetchall()
            cur.close()
            return rows

    def hosts(self) -> List[HostState]:
        rows = self._query("hosts", f"SELECT {_HOST_COLUMNS} FROM hosts ORDER BY host_id")
        out = []
        for (host_id, hostname, first_seen, last_seen, last_event, last_sequence, pairing, pairing_at,
             content_hash, compliant, agent_version, last_health_status, heartbeat_at) in rows:
            out.append(HostState(
                host_id=host_id, hostname=hostname, first_seen_at=self._from_db_time(first_seen),
                last_seen_at=self._from_db_time(last_seen), last_event_at=self._from_db_time(last_event),
                last_sequence=last_sequence,
                pairing=Pairing.model_validate_json(pairing) if pairing is not None else None,
                pairing_at=self._from_db_time(pairing_at) if pairing_at is not None else None,
                content_hash=content_hash, compliant=None if compliant is None else bool(compliant),
                agent_version=agent_version, last_health_status=last_health_status,
                heartbeat_at=self._from_db_time(heartbeat_at) if heartbeat_at is not None else None))
        return out

    def drift(self, since: dt.datetime, kinds: Sequence[str] = DRIFT_KINDS) -> List[DriftRow]:
        if not kinds:
            return []
        marks = ", ".join("?" * len(kinds))
        rows = self._query(
            "drift",
            "SELECT e.host_id, COALESCE(h.hostname, MIN(e.hostname)), e.kind, COUNT(*), MIN(e.occurred_at), "
            "MAX(e.occurred_at) FROM events e LEFT JOIN hosts h ON h.host_id = e.host_id "
            f"WHERE e.occurred_at >= ? AND e.kind IN ({marks}) "
            "GROUP BY e.host_id, h.hostname, e.kind ORDER BY e.host_id, e.kind",
            [self._to_db_time(utc(since)), *kinds])
        return [DriftRow(host_id=r[0], hostname=r[1], kind=r[2], event_count=r[3],
                         first_at=self._from_db_time(r[4]), last_at=self._from_db_time(r[5])) for r in rows]

    def events(self, query: EventQuery) -> List[StoredEvent]:
        where, params = [], []
        if query.host_id is not None:
            where.append("host_id = ?")
            params.append(query.host_id)
        if query.kind is not None:
            where.append("kind = ?")
            params.append(query.kind)
        if query.since is not None:
            where.append("occurred_at >= ?")
            params.append(self._to_db_time(utc(query.since)))
        order = "DESC" if query.newest_first else "ASC"
        sql = (f"SELECT body, received_at FROM events {'WHERE ' + ' AND '.join(where) if where else ''} "
               f"ORDER BY occurred_at {order}, host_id {order}, sequence {order}, event_id {order} LIMIT ?")
        rows = self._query("events", sql, [*params, query.limit])
        return [StoredEvent(body=r[0], received_at=self._from_db_time(r[1])) for r in rows]


def _sqlite_time(value: dt.datetime) -> str:
    # Fixed width, so text order is time order: 2026-01-01T00:00:00.000000Z
    return value.astimezone(dt.timezone.utc).replace(tzinfo=None).isoformat(timespec="microseconds") + "Z"


class SQLiteStore(_SqlStore):
    """One database file in WAL mode: one writer connection, readers alongside."""

    name = "sqlite"
    timestamp_type = "TEXT"
    _driver_errors = (sqlite3.Error, OSError)  # OSError: the database directory cannot be made

    def __init__(self, path: str, synchronous: str = "full", busy_timeout_seconds: float = 10.0) -> None:
        if path in ("", ":memory:") or path.startswith("file:"):
            raise ConfigError("database_url", [f"sqlite database must be a file path, not {path!r}"])
        self.path = path
        self._synchronous = synchronous.upper()
        self._busy_timeout_seconds = busy_timeout_seconds
        super().__init__()

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, timeout=self._busy_timeout_seconds, isolation_level=None,
                               check_same_thread=False)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute(f"PRAGMA synchronous={self._synchronous}")
        return conn

    def _connect_reader(self) -> sqlite3.Connection:
        return self._connect()

    def _connect_writer(self) -> sqlite3.Connection:
        Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        return self._connect()

    def _to_db_time(self, value: dt.datetime) -> str:
        return _sqlite_time(value)

    def _from_db_time(self, value: Any) -> dt.datetime:
        return dt.datetime.fromisoformat(value[:-1]).replace(tzinfo=dt.timezone.utc)

    @contextlib.contextmanager
    def _transaction(self, conn: sqlite3.Connection) -> Iterator[sqlite3.Cursor]:
        cur = conn.cursor()
        cur.execute("BEGIN IMMEDIATE")
        try:
            yield cur
        except BaseException:
            try:
                conn.rollback()
            except sqlite3.Error:
                pass
            raise
        cur.execute("COMMIT")


class PostgresStore(_SqlStore):
    """PostgreSQL through psycopg 3: one writer connection, a few pooled reader connections."""

    name = "postgresql"
    timestamp_type = "TIMESTAMPTZ"

    def __init__(self, url: str, connect_timeout_seconds: int = 10) -> None:
        try:
            import psycopg
        except ImportError as exc:  # the hub extra is not installed
            raise ConfigError("database_url", [f"PostgreSQL needs psycopg: pip install 'gpuguard[hub]' ({exc})"]) \
                from None
        self._psycopg = psycopg
        self._driver_errors = (psycopg.Error,)
        self.url = url
        self._connect_timeout_seconds = connect_timeout_seconds
        super().__init__()

    def _connect_reader(self) -> Any:
        return self._psycopg.connect(self.url, autocommit=True, connect_timeout=self._connect_timeout_seconds)

    def _connect_writer(self) -> Any:
        return self._psycopg.connect(self.url, autocommit=False, connect_timeout=self._connect_timeout_seconds)

    def _sql(self, text: str) -> str:
        return text.replace("?", "%s")

    def _lock_schema(self, cur: Any) -> None:
        # CREATE TABLE IF NOT EXISTS is not safe against a concurrent CREATE (both pass the check, one fails on
        # pg_type's unique index); the transaction-scoped lock makes the second hub wait and then find the tables.
        cur.execute("SELECT pg_advisory_xact_lock(%s)", (_SCHEMA_LOCK_KEY,))

    @contextlib.contextmanager
    def _transaction(self, conn: Any) -> Iterator[Any]:
        cur = conn.cursor()
        try:
            yield cur
        except BaseException:
            try:
                conn.rollback()
            except self._psycopg.Error:
                pass
            raise
        conn.commit()


def redact_url(url: str) -> str:
    """The database URL without its password, for logs."""
    scheme, sep, rest = url.partition("://")
    if not sep or "@" not in rest:
        return url
    credentials, _, location = rest.rpartition("@")
    user = credentials.split(":", 1)[0]
    return f"{scheme}://{user}:***@{location}" if ":" in credentials else f"{scheme}://{user}@{location}"


def make_store(database_url: str, sqlite_synchronous: str = "full") -> Store:
    """The store a URL names: ``sqlite:////abs/path.db``, ``sqlite:///rel.db`` or ``postgresql://...``."""
    if database_url.startswith("sqlite:///"):
        return SQLiteStore(database_url[len("sqlite:///"):], synchronous=sqlite_synchronous)
    if database_url.startswith(("postgresql://", "postgres://")):
        return PostgresStore(database_url)
    raise ConfigError("database_url", [f"unknown scheme in {redact_url(database_url)!r}; "
                                       "use sqlite:///PATH or postgresql://..."])
