"""The package-set model shared by the dpkg and rpm collectors, and which packages gpuguard watches."""

from __future__ import annotations

from typing import Dict, FrozenSet, Iterable, Literal, Optional, Tuple

from agent.defaults import DEFAULT_WATCHED_PATTERNS
from agent.frozen import Frozen, frozen_record

PackageManager = Literal["dpkg", "rpm"]
_GLOB_CHARS = "*?["  # what makes fnmatch treat a pattern as more than a name


@frozen_record
class PackageInfo(Frozen):
    """One installed package version."""

    version: str
    arch: str
    state: str = "installed"


@frozen_record
class PackageSet(Frozen):
    """The watched packages of one package database, keyed by name (``name:arch`` where a name has several)."""

    manager: PackageManager
    installed_count: int
    packages: Dict[str, PackageInfo]


class Watchlist:
    """Decides whether a package name is watched (shell patterns, as fnmatch); it runs for every installed package.

    Names and ``prefix*`` patterns (every default one) are a set and a ``str.startswith`` tuple: compiling them into
    one regular expression cost ``gpuguard snapshot`` milliseconds of its start-up. Other patterns are compiled.
    """

    def __init__(self, patterns: Iterable[str] = DEFAULT_WATCHED_PATTERNS) -> None:
        self.patterns = tuple(patterns)
        names, prefixes, others = set(), [], []
        for pattern in self.patterns:
            stem = pattern[:-1] if pattern.endswith("*") else pattern
            if any(c in stem for c in _GLOB_CHARS):
                others.append(pattern)
            elif pattern.endswith("*"):
                prefixes.append(stem)
            else:
                names.add(pattern)
        self._names = frozenset(names)
        self._prefixes = tuple(prefixes)
        self._regex = None
        if others:
            import fnmatch
            import re

            self._regex = re.compile("|".join(fnmatch.translate(p) for p in others))

    @property
    def names_and_prefixes(self) -> Optional[Tuple[FrozenSet[str], Tuple[str, ...]]]:
        """(names, prefixes) when every pattern is a name or a ``prefix*``; None when another glob needs fnmatch."""
        return None if self._regex is not None else (self._names, self._prefixes)

    def __contains__(self, name: str) -> bool:
        return (name in self._names or name.startswith(self._prefixes)
                or (self._regex is not None and self._regex.match(name) is not None))


# The default patterns, compiled once (a Watchlist is never changed after construction).
DEFAULT_WATCHLIST = Watchlist()


def key_packages(entries: Iterable[Tuple[str, PackageInfo]]) -> Dict[str, PackageInfo]:
    """Key entries by name, or by ``name:arch`` for names installed for several architectures."""
    by_name: Dict[str, list] = {}
    for name, info in entries:
        by_name.setdefault(name, []).append(info)
    out: Dict[str, PackageInfo] = {}
    for name in sorted(by_name):
        infos = by_name[name]
        if len(infos) == 1:
            out[name] = infos[0]
        else:
            for info in sorted(infos, key=lambda i: i.arch):
                out[f"{name}:{info.arch}"] = info
    return out


def find_version(packages: Dict[str, PackageInfo], name: str) -> Optional[str]:
    """The installed version of a package name (any architecture), or None."""
    if name in packages:
        return packages[name].version
    for key, info in packages.items():
        if key.split(":", 1)[0] == name:
            return info.version
    return None
