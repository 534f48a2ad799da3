"""Watched packages from the rpm database, through ``rpm -qa --root`` (the database format is rpm's business)."""

from __future__ import annotations

from agent.collectors.packages import PackageInfo, PackageSet, Watchlist, key_packages
from agent.errors import CollectorUnavailable, CommandNotFound
from agent.host import Host

RPM_QUERY_FORMAT = "%{NAME}\\t%|EPOCH?{%{EPOCH}:}|%{VERSION}-%{RELEASE}\\t%{ARCH}\\n"
_DB_PATHS = ("/var/lib/rpm", "/usr/lib/sysimage/rpm")


def rpm_query_argv(root: str) -> list:
    """The argv that lists every installed package as name, [epoch:]version-release and arch."""
    return ["rpm", "--root", root, "-qa", "--qf", RPM_QUERY_FORMAT]


def parse_rpm_query(text: str, watch: Watchlist) -> PackageSet:
    """Parse the tab-separated output of ``rpm_query_argv``."""
    total = 0
    entries = []
    for line in text.splitlines():
        fields = line.split("\t")
        if len(fields) != 3 or not fields[0]:
            continue
        total += 1
        name, version, arch = fields
        if name in watch and not name.startswith("gpg-pubkey"):
            entries.append((name, PackageInfo(version=version, arch=arch)))
    return PackageSet(manager="rpm", installed_count=total, packages=key_packages(entries))


class RpmCollector:
    """Runs rpm against the host's database; absent when there is no rpm database."""

    name = "rpm"

    def __init__(self, watch: Watchlist = Watchlist(), timeout_seconds: float = 30.0) -> None:
        self.watch = watch
        self.timeout_seconds = timeout_seconds

    def collect(self, host: Host) -> PackageSet:
        if not any(host.is_dir(p) and host.list_dir(p) for p in _DB_PATHS):
            raise CollectorUnavailable("no rpm database")
        try:
            result = host.run(rpm_query_argv(str(host.root)), self.timeout_seconds).check()
        except CommandNotFound as exc:
            raise CollectorUnavailable("rpm database present but rpm is not installed") from exc
        packages = parse_rpm_query(result.stdout, self.watch)
        if packages.installed_count == 0:
            raise CollectorUnavailable("rpm database is empty")
        return packages
