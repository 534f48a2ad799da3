"""Notice package database changes cheaply (a few stat calls per poll) and ask for a snapshot once they settle.

dpkg rewrites /var/lib/dpkg/status after every package it touches; rpm writes its database under /var/lib/rpm or
/usr/lib/sysimage/rpm (rpmdb.sqlite and its -wal, or the older Berkeley DB files). A change is reported once the
signature has stayed the same for one poll, so one apt/dnf transaction yields one snapshot, not one per package.
Package-manager hooks can also send SIGUSR1 to the daemon to ask for a snapshot at once.
"""

from __future__ import annotations

import os
from typing import Callable, Optional, Tuple

from agent.host import Host
from agent.log import get_logger

log = get_logger("package_watch")

PACKAGE_DB_PATHS = ("/var/lib/dpkg/status", "/var/lib/rpm", "/usr/lib/sysimage/rpm")

Signature = Tuple[Tuple[str, int, int, int], ...]


def _stat_entry(host: Host, host_path: str) -> Optional[Tuple[str, int, int, int]]:
    try:
        info = os.stat(host.path(host.resolve(host_path)))
    except OSError:
        return None
    return (host_path, info.st_mtime_ns, info.st_size, info.st_ino)


def package_db_signature(host: Host) -> Signature:
    """(path, mtime_ns, size, inode) of every package database file present under the Host root."""
    entries = []
    for path in PACKAGE_DB_PATHS:
        if host.is_dir(host.resolve(path)):
            for name in host.list_dir(host.resolve(path)):
                entry = _stat_entry(host, f"{path}/{name}")
                if entry is not None:
                    entries.append(entry)
        else:
            entry = _stat_entry(host, path)
            if entry is not None:
                entries.append(entry)
    return tuple(entries)


class PackageWatcher:
    """Polls the package databases' signature; calls ``on_change`` once a change has settled."""

    def __init__(self, host: Host, on_change: Callable[[str], None]) -> None:
        self.host = host
        self.on_change = on_change
        self._last = package_db_signature(host)
        self._unsettled = False

    def run(self, reason: str = "interval") -> None:
        current = package_db_signature(self.host)
        if current != self._last:
            self._last = current
            self._unsettled = True
            log.debug("package_db_changing")
            return
        if self._unsettled:
            self._unsettled = False
            log.info("package_db_changed")
            self.on_change("package_change")
