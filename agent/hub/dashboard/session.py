"""Dashboard sessions: a reader logs in with a reader token once, and gets an HttpOnly, SameSite=Strict cookie.

The cookie holds no token: ``v1.<expires unix>.<reader name, base64url>.<HMAC-SHA256>``, signed with a random key
kept in the hub's database (table ``dashboard_keys``), so every hub process over the same database accepts it and
a restart does not log anyone out. A session ends at its expiry or at logout (the cookie is dropped); deleting the
key row ends every session at once.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import threading
import time
from typing import Any, Callable, Optional

from agent.hub.store import SqlStore

COOKIE_NAME = "gg_session"
_VERSION = "v1"
_KEY_NAME = "session_hmac"
_TABLES = ("CREATE TABLE IF NOT EXISTS dashboard_keys (name TEXT PRIMARY KEY, secret TEXT NOT NULL)",)


class SessionSigner:
    """Makes and checks session cookies with the key shared through the database."""

    def __init__(self, store: SqlStore, lifetime_seconds: float, now: Callable[[], float] = time.time) -> None:
        self._store = store
        self._lifetime_seconds = lifetime_seconds
        self._now = now
        self._key: Optional[bytes] = None
        self._lock = threading.Lock()

    def _secret(self) -> bytes:
        with self._lock:
            if self._key is None:
                self._store.create_tables(_TABLES)
                proposed = secrets.token_hex(32)

                def work(cur: Any) -> str:
                    sql = self._store.dialect.sql
                    cur.execute(sql("INSERT INTO dashboard_keys (name, secret) VALUES (?, ?) "
                                    "ON CONFLICT (name) DO NOTHING"), (_KEY_NAME, proposed))
                    cur.execute(sql("SELECT secret FROM dashboard_keys WHERE name = ?"), (_KEY_NAME,))
                    return str(cur.fetchone()[0])

                self._key = bytes.fromhex(self._store.write("dashboard_session_key", work))
            return self._key

    def _mac(self, payload: str) -> str:
        return hmac.new(self._secret(), payload.encode(), hashlib.sha256).hexdigest()

    def issue(self, reader: str) -> str:
        """A cookie value for ``reader``, valid for the session lifetime."""
        name = base64.urlsafe_b64encode(reader.encode()).decode().rstrip("=")
        payload = f"{_VERSION}.{int(self._now() + self._lifetime_seconds)}.{name}"
        return f"{payload}.{self._mac(payload)}"

    def reader_of(self, cookie: Optional[str]) -> Optional[str]:
        """The reader a cookie was issued to, if its signature holds and it has not expired; else None."""
        if not cookie or len(cookie) > 1024:
            return None
        parts = cookie.split(".")
        if len(parts) != 4 or parts[0] != _VERSION or not parts[1].isdigit():
            return None
        payload = ".".join(parts[:3])
        if not hmac.compare_digest(self._mac(payload), parts[3]) or int(parts[1]) < self._now():
            return None
        try:
            return base64.urlsafe_b64decode(parts[2] + "=" * (-len(parts[2]) % 4)).decode()
        except ValueError:
            return None
