"""Watched packages from the rpm database, through ``rpm -qa --root`` (the database format is rpm's business).

The listing cannot change while the database's files do not: it is kept in the fact cache
(agent/collectors/factcache.py) keyed on their identity, and rpm is asked again only after a package changed. The
rpm binary is not part of the key: the query format is fixed (RPM_QUERY_FORMAT), and on the live host an rpm
upgrade is itself a database change.
"""

from __future__ import annotations

from typing import Iterable, List, Tuple

from agent.collectors.factcache import MISSING, FactCache, files_identity
from agent.collectors.packages import DEFAULT_WATCHLIST, PackageInfo, PackageSet, Watchlist, key_packages
from agent.errors import CollectorUnavailable, CommandNotFound
from agent.host import Host
from agent.hostfacts.rpmdb import parse_rpm_rows, rpm_database_files, rpm_query_argv


def parse_rpm_query(text: str, watch: Watchlist) -> PackageSet:
    """The watched packages of ``rpm_query_argv``'s output."""
    return watched_rpm_packages(rpm_rows(text), watch)


def rpm_rows(text: str) -> List[Tuple[str, str, str]]:
    """(name, EVR, arch) of every package of ``rpm_query_argv``'s output (what the fact cache keeps)."""
    return [(name, version, arch) for name, version, arch, _ in parse_rpm_rows(text)]


def watched_rpm_packages(rows: Iterable[Tuple[str, str, str]], watch: Watchlist) -> PackageSet:
    """The watched packages among (name, EVR, arch) rows, and how many rows there are in all."""
    total = 0
    entries = []
    for name, version, arch in rows:
        total += 1
        if name in watch and not name.startswith("gpg-pubkey"):
            entries.append((name, PackageInfo(version=version, arch=arch)))
    return PackageSet(manager="rpm", installed_count=total, packages=key_packages(entries))


def _are_rows(value: object) -> bool:
    return value is not MISSING and isinstance(value, list) and all(
        isinstance(row, (list, tuple)) and len(row) == 3 and all(isinstance(f, str) for f in row) for row in value)


class RpmCollector:
    """Runs rpm against the host's database; absent when there is no rpm database."""

    name = "rpm"

    def __init__(self, watch: Watchlist = DEFAULT_WATCHLIST, timeout_seconds: float = 30.0) -> None:
        self.watch = watch
        self.timeout_seconds = timeout_seconds

    def collect(self, host: Host) -> PackageSet:
        database = [host.file(p) for p in rpm_database_files(str(host.root))]
        if not database:
            raise CollectorUnavailable("no rpm database")
        cache = FactCache(host, "rpm-packages")
        identity = files_identity(database)
        rows = cache.get("rows", identity)
        if not _are_rows(rows):  # not cached, or damaged: ask rpm
            try:
                result = host.run(rpm_query_argv(str(host.root)), self.timeout_seconds).check()
            except CommandNotFound as exc:
                raise CollectorUnavailable("rpm database present but rpm is not installed") from exc
            rows = rpm_rows(result.stdout)
            if files_identity(database) == identity:  # not changed while rpm read it
                cache.put("rows", identity, rows)
        cache.save()
        packages = watched_rpm_packages(rows, self.watch)
        if packages.installed_count == 0:
            raise CollectorUnavailable("rpm database is empty")
        return packages
