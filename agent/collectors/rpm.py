"""Watched packages from the rpm database, through ``rpm -qa --root`` (the database format is rpm's business)."""

from __future__ import annotations

from agent.collectors.packages import DEFAULT_WATCHLIST, PackageInfo, PackageSet, Watchlist, key_packages
from agent.errors import CollectorUnavailable, CommandNotFound
from agent.host import Host
from agent.hostfacts.rpmdb import parse_rpm_rows, rpm_database_files, rpm_query_argv


def parse_rpm_query(text: str, watch: Watchlist) -> PackageSet:
    """The watched packages of ``rpm_query_argv``'s output."""
    total = 0
    entries = []
    for name, version, arch, _ in parse_rpm_rows(text):
        total += 1
        if name in watch and not name.startswith("gpg-pubkey"):
            entries.append((name, PackageInfo(version=version, arch=arch)))
    return PackageSet(manager="rpm", installed_count=total, packages=key_packages(entries))


class RpmCollector:
    """Runs rpm against the host's database; absent when there is no rpm database."""

    name = "rpm"

    def __init__(self, watch: Watchlist = DEFAULT_WATCHLIST, timeout_seconds: float = 30.0) -> None:
        self.watch = watch
        self.timeout_seconds = timeout_seconds

    def collect(self, host: Host) -> PackageSet:
        if not rpm_database_files(str(host.root)):
            raise CollectorUnavailable("no rpm database")
        try:
            result = host.run(rpm_query_argv(str(host.root)), self.timeout_seconds).check()
        except CommandNotFound as exc:
            raise CollectorUnavailable("rpm database present but rpm is not installed") from exc
        packages = parse_rpm_query(result.stdout, self.watch)
        if packages.installed_count == 0:
            raise CollectorUnavailable("rpm database is empty")
        return packages
