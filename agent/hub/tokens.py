"""Bearer tokens for the hub: a host token per host (may post that host's events and fetch its policy bundle),
reader tokens (fleet API, dashboard, policy bundles and audit read-only) and admin tokens (everything a reader may,
and pushing and withdrawing policy bundles).

A token reads ``gg1.<selector>.<secret>``: the selector (random, 16 hex digits) finds the entry, the secret is
checked in constant time against the sha256 stored for it. Only hashes are written, to a JSON file kept 0600 and
replaced atomically; the token itself is shown once, when it is made.
"""

from __future__ import annotations

import datetime as dt
import fcntl
import hashlib
import hmac
import os
import secrets
import threading
import time
from pathlib import Path
from typing import Callable, Dict, List, Literal, Optional, Tuple

from pydantic import Field, ValidationError

from agent.errors import ConfigError, InputFileError, UsageError
from agent.files import FileMissing, decode_text, read_bytes_bounded, write_atomically
from agent.log import get_logger
from agent.models import FrozenModel
from agent.validation import validation_problems

Role = Literal["host", "reader", "admin"]
# Roles that may read the fleet API, /metrics, the dashboard, the bundles and the audit trail.
READ_ROLES = frozenset({"reader", "admin"})
TOKEN_PREFIX = "gg1"
_SELECTOR_HEX_DIGITS = 16
_SECRET_BYTES = 32
# Compared against when the selector is unknown, so a miss costs about what a hit costs.
_DUMMY_SHA256 = hashlib.sha256(b"gpuguard-no-such-token").hexdigest()

log = get_logger("hub.tokens")


class TokenEntry(FrozenModel):
    """One token as stored: never the token, only its selector and the sha256 of its secret."""

    selector: str = Field(pattern=r"^[0-9a-f]{16}$")
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    role: Role
    subject: str = Field(min_length=1, max_length=128)  # host_id for a host token, a name for a reader or admin
    created_at: dt.datetime


class TokensFile(FrozenModel):
    """The tokens file's content."""

    format: Literal[1] = 1
    tokens: List[TokenEntry] = []


class Principal(FrozenModel):
    """Who a request authenticated as."""

    role: Role
    subject: str

    @property
    def can_read(self) -> bool:
        """True for a reader or an admin token."""
        return self.role in READ_ROLES


def hash_secret(secret: str) -> str:
    """The stored form of a token's secret part."""
    return hashlib.sha256(secret.encode("utf-8")).hexdigest()


def split_token(token: str) -> Optional[Tuple[str, str]]:
    """(selector, secret) of a well-formed token, else None."""
    parts = token.split(".")
    if len(parts) != 3 or parts[0] != TOKEN_PREFIX or len(parts[1]) != _SELECTOR_HEX_DIGITS or not parts[2]:
        return None
    return parts[1], parts[2]


def bearer_token(authorization: Optional[str]) -> Optional[str]:
    """The token of an ``Authorization: Bearer <token>`` header, else None."""
    if not authorization:
        return None
    scheme, _, value = authorization.strip().partition(" ")
    if scheme.lower() != "bearer" or not value.strip():
        return None
    return value.strip()


def read_tokens_file(path: str) -> TokensFile:
    """The tokens file's entries; an absent file is empty, a corrupt one a ConfigError."""
    try:
        text = decode_text(path, read_bytes_bounded(path))  # never blocks on a FIFO in its place
    except FileMissing:
        return TokensFile()
    except InputFileError as exc:
        raise ConfigError(path, [exc.reason]) from None
    try:
        return TokensFile.model_validate_json(text)
    except ValidationError as exc:
        raise ConfigError(path, validation_problems(exc.errors())) from None


def _write_atomically_0600(path: Path, text: str) -> None:
    """write_atomically (mkstemp makes the file 0600 from the start; StateWriteError on a full disk, the old file
    kept), then the directory fsynced so that the rename survives a crash."""
    write_atomically(str(path), text, mode=0o600)
    dir_fd = os.open(str(path.parent), os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def add_token(path: str, role: Role, subject: str, rotate: bool = False,
              clock: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.timezone.utc)) -> str:
    """Make a new token for ``subject``, store only its hash, and return the token (the one time it is seen).

    A subject that already has a token of this role is refused unless ``rotate``, which replaces it (the old
    token stops working at the hub's next reload).
    """
    if not subject or len(subject) > 128:
        raise UsageError(f"{role} name must be 1 to 128 characters")
    target = Path(path)
    try:
        target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        lock_fd = os.open(str(target) + ".lock", os.O_RDWR | os.O_CREAT, 0o600)
    except OSError as exc:
        raise ConfigError(path, [exc.strerror or str(exc)]) from None
    try:
        fcntl.flock(lock_fd, fcntl.LOCK_EX)  # one add-host at a time: read-modify-write
        current = read_tokens_file(path)
        others = [t for t in current.tokens if not (t.role == role and t.subject == subject)]
        if len(others) != len(current.tokens) and not rotate:
            raise UsageError(f"{role} {subject!r} already has a token; pass --rotate to replace it")
        selector = secrets.token_hex(_SELECTOR_HEX_DIGITS // 2)
        secret = secrets.token_urlsafe(_SECRET_BYTES)
        entry = TokenEntry(selector=selector, sha256=hash_secret(secret), role=role, subject=subject,
                           created_at=clock())
        updated = TokensFile(tokens=[*others, entry])
        try:
            _write_atomically_0600(target, updated.model_dump_json(indent=2) + "\n")
        except OSError as exc:
            raise ConfigError(path, [exc.strerror or str(exc)]) from None
    finally:
        os.close(lock_fd)
    log.info("hub_token_added", role=role, subject=subject, selector=selector, rotated=rotate)
    return f"{TOKEN_PREFIX}.{selector}.{secret}"


class TokenRegistry:
    """Answers "who is this bearer?" from the tokens file, re-reading it when it changes on disk."""

    def __init__(self, path: Optional[str], reload_seconds: float = 2.0,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self._path = path
        self._reload_seconds = reload_seconds
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._by_selector: Dict[str, TokenEntry] = {}
        self._file_stamp: Optional[Tuple[int, int, int]] = None
        self._checked_at = float("-inf")
        if path is not None:
            self._load(force=True)
            self._checked_at = monotonic()

    @classmethod
    def of_entries(cls, entries: List[TokenEntry]) -> "TokenRegistry":
        """A registry over fixed entries (no file)."""
        registry = cls(None)
        registry._by_selector = {e.selector: e for e in entries}
        return registry

    def _stamp(self) -> Optional[Tuple[int, int, int]]:
        try:
            st = os.stat(self._path)  # type: ignore[arg-type]
        except FileNotFoundError:
            return None
        return st.st_ino, st.st_mtime_ns, st.st_size

    def _load(self, force: bool = False) -> None:
        stamp = self._stamp()
        if not force and stamp == self._file_stamp:
            return
        tokens = read_tokens_file(self._path)  # type: ignore[arg-type]
        self._by_selector = {e.selector: e for e in tokens.tokens}
        self._file_stamp = stamp
        log.info("hub_tokens_loaded", path=self._path, token_count=len(self._by_selector))

    def _maybe_reload(self) -> None:
        if self._path is None:
            return
        now = self._monotonic()
        if now - self._checked_at < self._reload_seconds:
            return
        with self._lock:
            if now - self._checked_at < self._reload_seconds:
                return
            self._checked_at = now
            try:
                self._load()
            except ConfigError as exc:
                # Keep serving with the tokens we had; a broken file must not lock every host out.
                log.error("hub_tokens_reload_failed", path=self._path, error=str(exc))

    def authenticate(self, authorization: Optional[str]) -> Optional[Principal]:
        """The principal of a valid ``Authorization: Bearer`` header, else None."""
        return self.authenticate_token(bearer_token(authorization))

    def authenticate_token(self, token: Optional[str]) -> Optional[Principal]:
        """The principal of a valid token, else None."""
        self._maybe_reload()
        parts = split_token(token) if token else None
        if parts is None:
            return None
        selector, secret = parts
        entry = self._by_selector.get(selector)
        expected = entry.sha256 if entry is not None else _DUMMY_SHA256
        if not hmac.compare_digest(hash_secret(secret), expected) or entry is None:
            return None
        return Principal(role=entry.role, subject=entry.subject)

    def __len__(self) -> int:
        self._maybe_reload()
        return len(self._by_selector)

