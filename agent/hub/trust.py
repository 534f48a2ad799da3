"""What the hub serves of the trust chain: the roots it was given, one version per request, and the freshness
statement it signs with its online key (agent/bundle/freshness.py).

Roots are files the operators put in ``[hub] root_dir`` (``N.root.json`` with ``N.root.json.sig``); the hub only
serves them (hosts verify them). The statement is made from the bundles offered to everyone (newest first) and the
withdrawn serials, signed with ``gpg --homedir [hub] freshness_gnupg_home --local-user [hub] freshness_key``; it is
signed again when what it says changes or a quarter of its lifetime (``[hub] freshness_hours``) has passed, so a
fleet's fetches cost one gpg run per change, not one per host.
"""

from __future__ import annotations

import datetime as dt
import tempfile
import threading
from pathlib import Path
from typing import Callable, Optional, Sequence, Tuple

from agent.bundle.format import BundleScope
from agent.bundle.freshness import FreshnessStatement, make_statement, render_statement
from agent.bundle.roles import MAX_ROOT_BYTES, MAX_SIGNATURES_BYTES
from agent.errors import CommandError, InputFileError
from agent.files import FileMissing, read_bytes_bounded, write_bytes_atomically
from agent.host import Host
from agent.hub.responses import HubHTTPError
from agent.log import get_logger

log = get_logger("hub.trust")
GPG_TIMEOUT_SECONDS = 60.0


def root_files(root_dir: Optional[str], version: int) -> Optional[Tuple[bytes, bytes]]:
    """Root ``version`` and its signatures from ``root_dir``; None when there is no such version."""
    if root_dir is None:
        return None
    path = Path(root_dir) / f"{version}.root.json"
    try:
        return (read_bytes_bounded(str(path), MAX_ROOT_BYTES),
                read_bytes_bounded(str(path) + ".sig", MAX_SIGNATURES_BYTES))
    except FileMissing:
        return None
    except InputFileError as exc:
        log.error("hub_root_unreadable", path=str(path), error=str(exc))
        raise HubHTTPError(503, "root_unreadable", f"root version {version} cannot be read") from None


class FreshnessSigner:
    """Signs freshness statements with the hub's online key, keeping the last one while it still holds."""

    def __init__(self, gnupg_home: Optional[str], key: Optional[str], hours: float,
                 clock: Callable[[], dt.datetime], host: Optional[Host] = None) -> None:
        self.host = host or Host()
        self.gnupg_home = gnupg_home
        self.key = key
        self.hours = hours
        self.clock = clock
        self._lock = threading.Lock()
        self._last: Optional[Tuple[FreshnessStatement, bytes, bytes]] = None

    @property
    def enabled(self) -> bool:
        return self.gnupg_home is not None and self.key is not None

    def statement(self, newest: Sequence[Tuple[int, BundleScope]], withdrawn: Sequence[int]) -> Tuple[bytes, bytes]:
        """The statement's bytes and signature for what is offered and withdrawn now."""
        now = self.clock()
        fresh = make_statement(newest, withdrawn, now, self.hours)
        with self._lock:
            if self._last is not None:
                last, data, signature = self._last
                young = now < last.issued + dt.timedelta(hours=self.hours / 4)
                if young and (last.newest, last.withdrawn) == (fresh.newest, fresh.withdrawn):
                    return data, signature
            data = render_statement(fresh)
            signature = self._sign(data)
            self._last = (fresh, data, signature)
            log.info("hub_freshness_signed", issued_at=fresh.issued_at, expires=fresh.expires,
                     withdrawn=len(fresh.withdrawn), scopes=len(fresh.newest))
            return data, signature

    def _sign(self, data: bytes) -> bytes:
        assert self.gnupg_home is not None and self.key is not None
        with tempfile.TemporaryDirectory(prefix="gpuguard-hub-freshness-") as work:
            source, target = Path(work) / "freshness.json", Path(work) / "freshness.json.sig"
            write_bytes_atomically(str(source), data)
            try:
                done = self.host.run(["gpg", "--homedir", self.gnupg_home, "--batch", "--yes", "--local-user",
                                      self.key, "--detach-sign", "-o", str(target), str(source)],
                                     GPG_TIMEOUT_SECONDS)
            except CommandError as exc:
                done = None
                error = exc.reason
            if done is None or done.returncode != 0:
                log.error("hub_freshness_unsigned", error=(done.stderr[-500:] if done is not None else error))
                raise HubHTTPError(503, "freshness_unsigned", "the freshness statement cannot be signed now")
            return read_bytes_bounded(str(target), MAX_SIGNATURES_BYTES)
