"""Watched packages from the dpkg status database (/var/lib/dpkg/status), parsed directly: no dpkg-query spawn."""

from __future__ import annotations

from agent.collectors.packages import DEFAULT_WATCHLIST, PackageInfo, PackageSet, Watchlist, key_packages
from agent.errors import CollectorUnavailable
from agent.host import Host
from agent.hostfacts.dpkg_status import iter_dpkg_status  # stdlib-only parser, shared with the apt hook


def parse_dpkg_status(text: str, watch: Watchlist) -> PackageSet:
    """The watched subset of a dpkg status file, plus how many packages are present in all."""
    total = 0
    entries = []
    for name, version, arch, state in iter_dpkg_status(text):
        total += 1
        if name in watch:
            entries.append((name, PackageInfo(version=version, arch=arch, state=state)))
    return PackageSet(manager="dpkg", installed_count=total, packages=key_packages(entries))


class DpkgCollector:
    """Reads /var/lib/dpkg/status."""

    name = "dpkg"

    def __init__(self, watch: Watchlist = DEFAULT_WATCHLIST) -> None:
        self.watch = watch

    def collect(self, host: Host) -> PackageSet:
        text = host.read_text("/var/lib/dpkg/status")
        if text is None:
            raise CollectorUnavailable("no dpkg database")
        return parse_dpkg_status(text, self.watch)
