"""Notice package database changes cheaply (a few stat calls per poll) and ask for a snapshot once they settle.

dpkg rewrites /var/lib/dpkg/status after every package it touches; rpm writes its database under /var/lib/rpm or
/usr/lib/sysimage/rpm (rpmdb.sqlite and its -wal, or the older Berkeley DB files). A change is reported once the
signature has stayed the same for one poll, so one apt/dnf transaction yields one snapshot, not one per package.
Package-manager hooks can also send SIGUSR1 to the daemon to ask for a snapshot at once.
"""

from __future__ import annotations

import os
import stat
from typing import Callable, Tuple

from agent.host import Host
from agent.log import get_logger

log = get_logger("package_watch")

PACKAGE_DB_PATHS = ("/var/lib/dpkg/status", "/var/lib/rpm", "/usr/lib/sysimage/rpm")

Signature = Tuple[Tuple[str, int, int, int], ...]


def watch_targets(host: Host) -> Tuple[str, ...]:
    """Where the package databases really are under the Host root (symlinks followed inside the root, once)."""
    return tuple(dict.fromkeys(str(host.path(host.resolve(path))) for path in PACKAGE_DB_PATHS))


def package_db_signature(targets: Tuple[str, ...]) -> Signature:
    """(path, mtime_ns, size, inode) of every package database file present: a few stat calls, no reads."""
    entries = []
    for target in targets:
        try:
            info = os.stat(target)
        except OSError:
            continue
        if not stat.S_ISDIR(info.st_mode):
            entries.append((target, info.st_mtime_ns, info.st_size, info.st_ino))
            continue
        try:
            with os.scandir(target) as listing:
                for entry in listing:
                    try:
                        child = entry.stat()
                    except OSError:
                        continue
                    entries.append((entry.path, child.st_mtime_ns, child.st_size, child.st_ino))
        except OSError:
            continue
    return tuple(sorted(entries))


class PackageWatcher:
    """Polls the package databases' signature; calls ``on_change`` once a change has settled."""

    def __init__(self, host: Host, on_change: Callable[[str], None]) -> None:
        self.host = host
        self.on_change = on_change
        self._targets = watch_targets(host)
        self._last = package_db_signature(self._targets)
        self._unsettled = False

    def run(self, reason: str = "interval") -> None:
        current = package_db_signature(self._targets)
        if current != self._last:
            self._last = current
            self._unsettled = True
            log.debug("package_db_changing")
            return
        if self._unsettled:
            self._unsettled = False
            log.info("package_db_changed")
            self.on_change("package_change")
