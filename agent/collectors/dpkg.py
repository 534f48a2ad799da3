"""Watched packages from the dpkg status database (/var/lib/dpkg/status), parsed directly: no dpkg-query spawn."""

from __future__ import annotations

from agent.collectors.packages import DEFAULT_WATCHLIST, PackageInfo, PackageSet, Watchlist, key_packages
from agent.errors import CollectorUnavailable
from agent.host import Host
from agent.hostfacts.dpkg_status import count_present, iter_dpkg_status, iter_named  # stdlib only, as the apt hook

DPKG_STATUS = "/var/lib/dpkg/status"


def parse_dpkg_status(text: str, watch: Watchlist) -> PackageSet:
    """The watched subset of a dpkg status file, plus how many packages are present in all."""
    total = 0
    entries = []
    for name, version, arch, state in iter_dpkg_status(text):
        total += 1
        if name in watch:
            entries.append((name, PackageInfo(version=version, arch=arch, state=state)))
    return PackageSet(manager="dpkg", installed_count=total, packages=key_packages(entries))


def dpkg_package_set(data: bytes, watch: Watchlist) -> PackageSet:
    """:func:`parse_dpkg_status` of the status file's bytes; where the watchlist is names and ``prefix*`` patterns
    only, the watched stanzas are found in the bytes and the rest only counted, as the apt hook reads the file."""
    chosen = watch.names_and_prefixes
    if chosen is None:
        return parse_dpkg_status(data.decode("utf-8", errors="replace"), watch)
    names, prefixes = chosen
    entries = [(name, PackageInfo(version=version, arch=arch, state=state))
               for name, version, arch, state in iter_named(data, names=sorted(names), prefixes=prefixes)]
    return PackageSet(manager="dpkg", installed_count=count_present(data), packages=key_packages(entries))


class DpkgCollector:
    """Reads /var/lib/dpkg/status."""

    name = "dpkg"

    def __init__(self, watch: Watchlist = DEFAULT_WATCHLIST) -> None:
        self.watch = watch

    def collect(self, host: Host) -> PackageSet:
        data = host.read_bytes(DPKG_STATUS)
        if data is None:
            raise CollectorUnavailable("no dpkg database")
        return dpkg_package_set(data, self.watch)
