"""Where the hub keeps events: the Store protocol the hub codes against, and the one SQL store behind it, over
SQLite by default or PostgreSQL when configured (``make_store``).

    rows.py         what the store answers (BatchResult, HostRow, DriftRow, StoredEvent) and EventQuery
    schema.py       the tables, their version, and how rows go in and come out
    host_updates.py the newest facts per host in a set of events (pure), folded into ``hosts`` at each commit
    dialects.py     how SQLite and PostgreSQL differ (connect, placeholders, times, transactions, locks, JSON)
    connections.py  the reader pool and the writer's connection

``ingest`` writes any number of batches in one transaction (the group commit in ``writer.py`` calls it from one
thread) and tells, batch by batch, which events were new and which were already stored. Driver errors (sqlite3,
psycopg) become StoreError here, once. The dashboard, ``/metrics`` and the alert queue run their own SQL through
``query``, ``write`` and ``create_tables``, with the same error mapping.
"""

from __future__ import annotations

import contextlib
import datetime as dt
from typing import Any, Callable, Dict, Iterator, List, Optional, Protocol, Sequence, Tuple, TypeVar

from agent.errors import ConfigError, StoreError
from agent.hub import schema, workload_stacks
from agent.hub.connections import ReaderPool, WriterConnection
from agent.hub.dialects import Dialect, PostgresDialect, SQLiteDialect, text_time
from agent.hub.host_updates import summarize_hosts
from agent.hub.rows import DRIFT_KINDS, BatchResult, DriftRow, EventQuery, HostRow, StoredEvent, utc
from agent.log import get_logger
from agent.report.events import Event

log = get_logger("hub.store")

_Result = TypeVar("_Result")


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

    def hosts(self) -> List[HostRow]:
        """Every host, by host_id."""

    def drift(self, since: dt.datetime, kinds: Sequence[str] = DRIFT_KINDS) -> List[DriftRow]:
        """Per host and kind, the drift events the hub received at or after ``since`` (its clock)."""

    def events(self, query: EventQuery) -> List[StoredEvent]:
        """Stored events matching the query, in the order the hub received them."""

    def claim_retention_pass(self, now: dt.datetime, min_interval_seconds: float) -> bool:
        """True when this process should run a retention pass now (see ``agent.hub.retention``)."""

    def prune_batch(self, kind: str, cutoff: dt.datetime, limit: int) -> int:
        """Delete up to ``limit`` events of ``kind`` received before ``cutoff``, never a host's newest of that kind."""


class SqlStore:
    """The Store over one SQL database: one writer connection, pooled readers; ``dialect`` says which engine."""

    def __init__(self, dialect: Dialect) -> None:
        self.dialect = dialect
        self._pool = ReaderPool(dialect.connect_reader)
        self._writer = WriterConnection(dialect.connect_writer)
        self._opened = False

    @contextlib.contextmanager
    def _mapped(self, operation: str) -> Iterator[None]:
        try:
            yield
        except self.dialect.driver_errors as exc:
            log.error("hub_store_failed", store=self.dialect.name, operation=operation, error=str(exc).strip())
            raise StoreError(operation, str(exc).strip() or type(exc).__name__) from exc

    # --- lifecycle -----------------------------------------------------------------------------------------
    def open(self) -> None:
        if self._opened:
            return
        with self._mapped("open"):
            with self.dialect.transaction(self._writer.get()) as cur:
                found = schema.create(self.dialect, cur)
        if found != str(schema.SCHEMA_VERSION):
            raise StoreError("open", f"database schema version {found}, this hub knows {schema.SCHEMA_VERSION}")
        self._opened = True
        log.info("hub_store_opened", store=self.dialect.name)

    def close(self) -> None:
        self._pool.close()
        self._writer.drop()
        self._opened = False

    def ping(self) -> None:
        with self._mapped("ping"), self._pool.connection() as conn:
            cur = conn.cursor()
            cur.execute("SELECT 1")
            cur.fetchone()

    # --- SQL for the hub's other tables and queries (dashboard, /metrics, alert queue) ---------------------
    def query(self, operation: str, sql: str, params: Sequence[Any] = ()) -> List[Tuple[Any, ...]]:
        """The rows of one read (``?`` placeholders) on a pooled connection; StoreError names ``operation``."""
        with self._mapped(operation), self._pool.connection() as conn:
            cur = conn.cursor()
            cur.execute(self.dialect.sql(sql), tuple(params))
            rows: List[Tuple[Any, ...]] = cur.fetchall()
            cur.close()
            return rows

    def write(self, operation: str, work: Callable[[Any], _Result]) -> _Result:
        """``work(cursor)`` in one transaction on a pooled connection; StoreError names ``operation``."""
        with self._mapped(operation), self._pool.connection() as conn:
            with self.dialect.transaction(conn) as cur:
                return work(cur)

    def create_tables(self, statements: Sequence[str]) -> None:
        """CREATE TABLE/INDEX IF NOT EXISTS statements, safe when several hub processes start at once."""
        def work(cur: Any) -> None:
            self.dialect.lock(cur, schema.EXTRA_TABLES_LOCK_KEY)
            for statement in statements:
                cur.execute(statement)

        self.write("open", work)

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
        to_db_time, sql = self.dialect.to_db_time, self.dialect.sql
        received = to_db_time(received_at)
        inserted: set = set()
        try:
            with self._mapped("ingest"):
                with self.dialect.transaction(self._writer.get()) as cur:
                    for start in range(0, len(unique), schema.ROWS_PER_INSERT):
                        chunk = unique[start:start + schema.ROWS_PER_INSERT]
                        cur.execute(sql(schema.insert_events_sql(len(chunk))),
                                    schema.event_params(chunk, received, to_db_time))
                        inserted.update((row[0], row[1]) for row in cur.fetchall())
                    for update in summarize_hosts(unique, inserted):
                        cur.execute(sql(schema.UPSERT_HOST), schema.host_params(update, received_at, to_db_time))
                    for run in workload_stacks.stack_runs(unique):
                        cur.execute(sql(workload_stacks.UPSERT), workload_stacks.params(run))
        except StoreError:
            self._writer.drop()  # a broken connection is reopened on the next group
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
        sql = self.dialect.sql

        def work(cur: Any) -> bool:
            cur.execute(sql(schema.INSERT_META),
                        (schema.RETENTION_KEY, text_time(dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc))))
            cur.execute(sql("UPDATE hub_meta SET value = ? WHERE key = ? AND value <= ?"),
                        (text_time(now), schema.RETENTION_KEY,
                         text_time(now - dt.timedelta(seconds=min_interval_seconds))))
            return bool(cur.rowcount == 1)

        return self.write("retention", work)

    def prune_batch(self, kind: str, cutoff: dt.datetime, limit: int) -> int:
        """Delete up to ``limit`` events of ``kind`` the hub received before ``cutoff`` (its clock: an agent's clock,
        ahead or behind, neither keeps its events forever nor gets fresh ones deleted), never a host's newest event of
        that kind (received last; within one commit, the higher sequence); the number deleted (fewer than
        ``limit``: nothing more to do for this kind)."""
        sql = self.dialect.sql(
            "DELETE FROM events WHERE (host_id, event_id) IN ("
            "SELECT e.host_id, e.event_id FROM events e WHERE e.kind = ? AND e.received_at < ? AND EXISTS ("
            "SELECT 1 FROM events n WHERE n.host_id = e.host_id AND n.kind = e.kind AND (n.received_at > e.received_at"
            " OR (n.received_at = e.received_at AND n.sequence > e.sequence)))"
            " ORDER BY e.received_at LIMIT ?)")

        def work(cur: Any) -> int:
            cur.execute(sql, (kind, self.dialect.to_db_time(cutoff), limit))
            return int(cur.rowcount)

        return self.write("retention", work)

    # --- reads ---------------------------------------------------------------------------------------------
    def hosts(self) -> List[HostRow]:
        rows = self.query("hosts", f"SELECT {schema.HOST_COLUMNS} FROM hosts ORDER BY host_id")
        return [schema.host_from_row(row, self.dialect.from_db_time) for row in rows]

    def host(self, host_id: str) -> Optional[HostRow]:
        """One host's state; None for a host the hub has not heard from."""
        rows = self.query("hosts", f"SELECT {schema.HOST_COLUMNS} FROM hosts WHERE host_id = ?", [host_id])
        return schema.host_from_row(rows[0], self.dialect.from_db_time) if rows else None

    def drift(self, since: dt.datetime, kinds: Sequence[str] = DRIFT_KINDS) -> List[DriftRow]:
        if not kinds:
            return []
        marks = ", ".join("?" * len(kinds))
        rows = self.query(
            "drift",
            "SELECT e.host_id, COALESCE(h.hostname, MIN(e.hostname)), e.kind, COUNT(*), MIN(e.received_at), "
            "MAX(e.received_at), MIN(e.occurred_at), MAX(e.occurred_at), h.clock_skew_seconds "
            "FROM events e LEFT JOIN hosts h ON h.host_id = e.host_id "
            f"WHERE e.received_at >= ? AND e.kind IN ({marks}) "
            "GROUP BY e.host_id, h.hostname, h.clock_skew_seconds, e.kind ORDER BY e.host_id, e.kind",
            [self.dialect.to_db_time(since), *kinds])
        from_db_time = self.dialect.from_db_time
        return [DriftRow(host_id=r[0], hostname=r[1], kind=r[2], event_count=r[3],
                         first_received_at=from_db_time(r[4]), last_received_at=from_db_time(r[5]),
                         first_occurred_at=from_db_time(r[6]), last_occurred_at=from_db_time(r[7]),
                         clock_skew_seconds=r[8]) for r in rows]

    def events(self, query: EventQuery) -> List[StoredEvent]:
        where, params = [], []
        if query.host_id is not None:
            where.append("host_id = ?")
            params.append(query.host_id)
        if query.kind is not None:
            where.append("kind = ?")
            params.append(query.kind)
        if query.since is not None:
            where.append("received_at >= ?")
            params.append(self.dialect.to_db_time(query.since))
        order = "DESC" if query.newest_first else "ASC"
        sql = (f"SELECT body, received_at FROM events {'WHERE ' + ' AND '.join(where) if where else ''} "
               f"ORDER BY received_at {order}, host_id {order}, sequence {order}, event_id {order} LIMIT ?")
        rows = self.query("events", sql, [*params, query.limit])
        return [StoredEvent(body=r[0], received_at=self.dialect.from_db_time(r[1])) for r in rows]


class SQLiteStore(SqlStore):
    """One database file in WAL mode: one writer connection, readers alongside."""

    def __init__(self, path: str, synchronous: str = "full", busy_timeout_seconds: float = 10.0) -> None:
        super().__init__(SQLiteDialect(path, synchronous, busy_timeout_seconds))


class PostgresStore(SqlStore):
    """PostgreSQL through psycopg 3: one writer connection, a few pooled reader connections."""

    def __init__(self, url: str, connect_timeout_seconds: int = 10) -> None:
        super().__init__(PostgresDialect(url, connect_timeout_seconds))


def redact_url(url: str) -> str:
    """The database URL without its password, for logs."""
    scheme, sep, rest = url.partition("://")
    if not sep or "@" not in rest:
        return url
    credentials, _, location = rest.rpartition("@")
    user = credentials.split(":", 1)[0]
    return f"{scheme}://{user}:***@{location}" if ":" in credentials else f"{scheme}://{user}@{location}"


def make_store(database_url: str, sqlite_synchronous: str = "full") -> SqlStore:
    """The store a URL names: ``sqlite:////abs/path.db``, ``sqlite:///rel.db`` or ``postgresql://...``."""
    if database_url.startswith("sqlite:///"):
        return SQLiteStore(database_url[len("sqlite:///"):], synchronous=sqlite_synchronous)
    if database_url.startswith(("postgresql://", "postgres://")):
        return PostgresStore(database_url)
    raise ConfigError("database_url", [f"unknown scheme in {redact_url(database_url)!r}; "
                                       "use sqlite:///PATH or postgresql://..."])
