"""How SQLite and PostgreSQL differ for the hub's store: connecting, placeholders, times, transactions, locks, JSON.

Everything else (the tables, every query) is written once, in the SQL both accept, with ``?`` placeholders that
``sql()`` turns into the driver's. A time goes in as ``to_db_time`` and comes back as ``from_db_time``: SQLite
keeps fixed-width UTC text (``text_time``), so text order is time order; PostgreSQL keeps TIMESTAMPTZ.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import sqlite3
from pathlib import Path
from typing import Any, ContextManager, Iterator, Protocol, Tuple, Type

from agent.errors import ConfigError
from agent.hub.rows import utc


def text_time(value: dt.datetime) -> str:
    """Fixed-width UTC text, so text order is time order: 2026-01-01T00:00:00.000000Z (a naive time is UTC)."""
    return utc(value).replace(tzinfo=None).isoformat(timespec="microseconds") + "Z"


class Dialect(Protocol):
    """One database engine as the store sees it."""

    name: str  # in logs and in StoreError: "sqlite", "postgresql"
    timestamp_type: str  # the column type of a time
    bytes_type: str  # the column type of raw bytes
    key_type: str  # a generated integer primary key, in creation order
    driver_errors: Tuple[Type[BaseException], ...]  # what the store maps to StoreError
    for_update: str  # appended to a SELECT that locks its rows until the transaction ends ("" where BEGIN IMMEDIATE
    # already holds every other writer off)

    def connect_reader(self) -> Any:
        """A connection for reads and small writes (autocommit where the driver has it)."""

    def connect_writer(self) -> Any:
        """The connection ingest writes through."""

    def sql(self, text: str) -> str:
        """``text`` with its ``?`` placeholders in the driver's style."""

    def to_db_time(self, value: dt.datetime) -> Any:
        """A time as a query parameter (a naive one is UTC)."""

    def from_db_time(self, value: Any) -> dt.datetime:
        """A time column's value as an aware UTC datetime."""

    def transaction(self, conn: Any) -> ContextManager[Any]:
        """A cursor in one transaction on ``conn``: committed when the block ends, rolled back when it raises."""

    def lock(self, cur: Any, key: int) -> None:
        """Hold off other processes taking the lock ``key`` until this transaction ends."""

    def json_field(self, column: str, field: str) -> str:
        """SQL for the text of top-level ``field`` in the JSON object that ``column`` holds."""


class SQLiteDialect:
    """One database file in WAL mode, opened with a busy timeout; transactions are BEGIN IMMEDIATE."""

    name = "sqlite"
    timestamp_type = "TEXT"
    bytes_type = "BLOB"
    key_type = "INTEGER PRIMARY KEY"
    for_update = ""
    driver_errors: Tuple[Type[BaseException], ...] = (sqlite3.Error, OSError)  # OSError: the directory cannot be made

    def __init__(self, path: str, synchronous: str = "full", busy_timeout_seconds: float = 10.0) -> None:
        if path in ("", ":memory:") or path.startswith("file:"):
            raise ConfigError("database_url", [f"sqlite database must be a file path, not {path!r}"])
        self.path = path
        self._synchronous = synchronous.upper()
        self._busy_timeout_seconds = busy_timeout_seconds

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, timeout=self._busy_timeout_seconds, isolation_level=None,
                               check_same_thread=False)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute(f"PRAGMA synchronous={self._synchronous}")
        return conn

    def connect_reader(self) -> sqlite3.Connection:
        return self._connect()

    def connect_writer(self) -> sqlite3.Connection:
        Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        return self._connect()

    def sql(self, text: str) -> str:
        return text

    def to_db_time(self, value: dt.datetime) -> str:
        return text_time(value)

    def from_db_time(self, value: Any) -> dt.datetime:
        return dt.datetime.fromisoformat(value[:-1]).replace(tzinfo=dt.timezone.utc)

    @contextlib.contextmanager
    def transaction(self, conn: sqlite3.Connection) -> Iterator[sqlite3.Cursor]:
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

    def lock(self, cur: Any, key: int) -> None:
        """Nothing to do: BEGIN IMMEDIATE already holds every other writer off until this transaction ends."""

    def json_field(self, column: str, field: str) -> str:
        return f"json_extract({column}, '$.{field}')"


class PostgresDialect:
    """PostgreSQL through psycopg 3: readers autocommit (``transaction`` opens an explicit block on them), the
    writer commits per transaction."""

    name = "postgresql"
    timestamp_type = "TIMESTAMPTZ"
    bytes_type = "BYTEA"
    key_type = "BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY"
    for_update = " FOR UPDATE"

    def __init__(self, url: str, connect_timeout_seconds: int = 10) -> None:
        try:
            import psycopg
        except ImportError as exc:  # the hub extra is not installed
            raise ConfigError("database_url", [f"PostgreSQL needs psycopg: pip install 'gpuguard[hub]' ({exc})"]) \
                from None
        self._psycopg = psycopg
        self.driver_errors: Tuple[Type[BaseException], ...] = (psycopg.Error,)
        self.url = url
        self._connect_timeout_seconds = connect_timeout_seconds

    def connect_reader(self) -> Any:
        return self._psycopg.connect(self.url, autocommit=True, connect_timeout=self._connect_timeout_seconds)

    def connect_writer(self) -> Any:
        return self._psycopg.connect(self.url, autocommit=False, connect_timeout=self._connect_timeout_seconds)

    def sql(self, text: str) -> str:
        return text.replace("?", "%s")

    def to_db_time(self, value: dt.datetime) -> dt.datetime:
        return utc(value)

    def from_db_time(self, value: Any) -> dt.datetime:
        return utc(value)

    @contextlib.contextmanager
    def transaction(self, conn: Any) -> Iterator[Any]:
        if conn.autocommit:
            # A reader connection: without an explicit block each statement would commit alone, and a
            # transaction-scoped lock (``lock``) would end with the statement that took it.
            with conn.transaction():
                yield conn.cursor()
            return
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

    def lock(self, cur: Any, key: int) -> None:
        # CREATE TABLE IF NOT EXISTS is not safe against a concurrent CREATE (both pass the check, one fails on
        # pg_type's unique index); the transaction-scoped lock makes the second hub wait and then find the tables.
        cur.execute("SELECT pg_advisory_xact_lock(%s)", (key,))

    def json_field(self, column: str, field: str) -> str:
        return f"({column}::jsonb ->> '{field}')"
