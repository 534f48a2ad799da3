"""The store's database connections: a few idle ones for readers, and the one that ingest writes through.

A connection that raised is closed, never handed out again: the next use opens a fresh one.
"""

from __future__ import annotations

import contextlib
import queue
import threading
from typing import Any, Callable, Iterator, Optional


def close_quietly(conn: Any) -> None:
    """Close ``conn``, ignoring a failure (a broken connection may fail to close too)."""
    try:
        conn.close()
    except Exception:  # noqa: BLE001 - closing a broken connection may fail again; nothing left to do
        pass


class ReaderPool:
    """Up to ``max_idle`` idle connections, reused last-in first-out; more are opened when all are busy."""

    def __init__(self, connect: Callable[[], Any], max_idle: int = 4) -> None:
        self._connect = connect
        self._idle: "queue.LifoQueue[Any]" = queue.LifoQueue(maxsize=max_idle)

    @contextlib.contextmanager
    def connection(self) -> Iterator[Any]:
        """An idle connection or a new one, returned to the pool after the block unless the block raised."""
        try:
            conn = self._idle.get_nowait()
        except queue.Empty:
            conn = self._connect()
        try:
            yield conn
        except BaseException:
            close_quietly(conn)
            raise
        try:
            self._idle.put_nowait(conn)
        except queue.Full:
            close_quietly(conn)

    def close(self) -> None:
        """Close every idle connection."""
        while True:
            try:
                close_quietly(self._idle.get_nowait())
            except queue.Empty:
                return


class WriterConnection:
    """The one connection ingest writes through: opened on first use, dropped after a failure so that the next
    group commit reopens it."""

    def __init__(self, connect: Callable[[], Any]) -> None:
        self._connect = connect
        self._conn: Optional[Any] = None
        self._lock = threading.Lock()

    def get(self) -> Any:
        with self._lock:
            if self._conn is None:
                self._conn = self._connect()
            return self._conn

    def drop(self) -> None:
        """Close the connection (if open); the next ``get`` opens a new one."""
        with self._lock:
            if self._conn is not None:
                close_quietly(self._conn)
                self._conn = None
