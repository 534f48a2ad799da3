"""Watched packages from the dpkg status database (/var/lib/dpkg/status), parsed directly: no dpkg-query spawn."""

from __future__ import annotations

from typing import Iterator, Tuple

from agent.collectors.packages import PackageInfo, PackageSet, Watchlist, key_packages
from agent.errors import CollectorUnavailable
from agent.host import Host

# dpkg status words (third field of Status:) for which the package's files are on disk.
_PRESENT_STATES = {"installed", "half-installed", "unpacked", "half-configured", "triggers-awaited",
                   "triggers-pending"}


def iter_dpkg_status(text: str) -> Iterator[Tuple[str, str, str, str]]:
    """Yield (package, version, architecture, state) for every stanza whose files are present."""
    for stanza in text.split("\n\n"):
        name = version = arch = status = ""
        for line in stanza.splitlines():
            if not line or line[0] in " \t":
                continue
            key, _, value = line.partition(":")
            if key == "Package":
                name = value.strip()
            elif key == "Version":
                version = value.strip()
            elif key == "Architecture":
                arch = value.strip()
            elif key == "Status":
                status = value.strip()
        if not name or not version:
            continue
        state = status.split()[-1] if status else ""
        if state in _PRESENT_STATES:
            yield name, version, arch, state


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

    def __init__(self, watch: Watchlist = Watchlist()) -> None:
        self.watch = watch

    def collect(self, host: Host) -> PackageSet:
        text = host.read_text("/var/lib/dpkg/status")
        if text is None:
            raise CollectorUnavailable("no dpkg database")
        return parse_dpkg_status(text, self.watch)
