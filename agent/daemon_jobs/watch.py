"""Notice package database changes cheaply (a few stat calls per poll) and ask for a snapshot once they settle.

dpkg rewrites /var/lib/dpkg/status after every package it touches; rpm writes its database under /var/lib/rpm or
/usr/lib/sysimage/rpm (rpmdb.sqlite and its -wal, or the older Berkeley DB files). A change is reported once the
signature has stayed the same for one poll, so one apt/dnf transaction yields one snapshot, not one per package.
Package-manager hooks can also send SIGUSR1 to the daemon to ask for a snapshot at once.

The same poll stats the guard's ``guard-events.jsonl`` (the apt hook appends a line when it blocks a transaction,
warns or lets one through an override window): a new size, mtime or inode calls ``on_guard_events`` at once, so
the event is forwarded and delivered within a poll without the hook having to signal anyone.
"""

from __future__ import annotations

import os
import stat
from typing import Callable, Optional, Tuple

from agent.host import Host
from agent.log import get_logger

log = get_logger("package_watch")

PACKAGE_DB_PATHS = ("/var/lib/dpkg/status", "/var/lib/rpm", "/usr/lib/sysimage/rpm")

Signature = Tuple[Tuple[str, int, int, int], ...]


def watch_targets(host: Host) -> Tuple[str, ...]:
    """Where the package databases really are under the Host root (symlinks followed inside the root, once)."""
    return tuple(dict.fromkeys(host.file(host.resolve(path)) for path in PACKAGE_DB_PATHS))


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


def file_signature(path: str) -> Optional[Tuple[int, int, int]]:
    """(mtime_ns, size, inode) of one file, None when it is not there."""
    try:
        info = os.stat(path)
    except OSError:
        return None
    return info.st_mtime_ns, info.st_size, info.st_ino


class PackageWatcher:
    """Polls the package databases' signature; calls ``on_change`` once a change has settled.

    With ``guard_events_path`` (a real path) it also calls ``on_guard_events`` whenever that file changed.
    """

    def __init__(self, host: Host, on_change: Callable[[str], None], guard_events_path: Optional[str] = None,
                 on_guard_events: Callable[[str], None] = lambda reason: None) -> None:
        self.host = host
        self.on_change = on_change
        self.guard_events_path = guard_events_path
        self.on_guard_events = on_guard_events
        self._targets = watch_targets(host)
        self._last = package_db_signature(self._targets)
        self._unsettled = False
        self._guard_events_last = file_signature(guard_events_path) if guard_events_path else None

    def run(self, reason: str = "interval") -> None:
        if self.guard_events_path is not None:
            events = file_signature(self.guard_events_path)
            if events != self._guard_events_last:
                self._guard_events_last = events
                if events is not None:
                    log.debug("guard_events_changed")
                    self.on_guard_events("guard_events_written")
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
