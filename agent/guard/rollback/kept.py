"""The package files rollback keeps, whatever the package manager: where each came from, how exact it is.

A kept file (:class:`KeptFile`) comes from the package manager's own cache (``archive cache``), from a repository
that still offers the version (``repository``), or is rebuilt from what the package database has installed
(``rebuilt``; exact only when every installed file still has the checksum the database recorded). The directory's
manifest (``kept.json`` beside the files) remembers that for each file, so a later check that finds the file
already kept still knows its source, and remembers the versions no file could be had for, so such a miss is
logged once per package version, not on every check.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

from agent.errors import InputFileError
from agent.files import read_json_file, write_atomically
from agent.host import Host
from agent.log import get_logger

log = get_logger("guard.kept")
MANIFEST = "kept.json"
MANIFEST_FORMAT = 1
SOURCES = ("archive cache", "repository", "rebuilt")  # the order a file is looked for in


@dataclass(frozen=True)
class KeptFile:
    """One guarded package's kept file, or why there is none (``path`` None)."""

    path: Optional[str]  # host path
    source: str = "none"  # one of SOURCES, or "none"
    inexact: Tuple[str, ...] = ()  # a rebuilt file's differences from the installed package ("changed ...: /p")
    conffiles_edited: Tuple[str, ...] = ()  # conffiles carried with the operator's edits
    reason: str = ""  # why no file could be kept
    size_bytes: int = 0

    @property
    def restorable(self) -> bool:
        return self.path is not None

    def entry(self) -> dict:
        """The manifest's (and known-good.json's) fields for this file."""
        out: dict = {"source": self.source}
        if self.inexact:
            out["inexact"] = list(self.inexact)
        if self.conffiles_edited:
            out["conffiles_edited"] = list(self.conffiles_edited)
        if self.reason:
            out["reason"] = self.reason
        return out


@dataclass
class Manifest:
    """``kept.json`` of one kept-files directory."""

    files: Dict[str, dict] = field(default_factory=dict)  # file name -> KeptFile.entry()
    misses: Dict[str, str] = field(default_factory=dict)  # "name version arch" -> the reason last logged

    @staticmethod
    def load(host: Host, directory: str) -> "Manifest":
        where = str(host.path(f"{directory.rstrip('/')}/{MANIFEST}"))
        try:
            data = read_json_file(where)
        except InputFileError as exc:
            log.warning("kept_manifest_unreadable", path=where, error=exc.reason)
            return Manifest()
        if not isinstance(data, dict) or data.get("format") != MANIFEST_FORMAT:
            return Manifest()
        files, misses = data.get("files"), data.get("misses")
        return Manifest({str(k): v for k, v in files.items() if isinstance(v, dict)} if isinstance(files, dict) else {},
                        {str(k): str(v) for k, v in misses.items()} if isinstance(misses, dict) else {})

    def save(self, host: Host, directory: str) -> None:
        where = str(host.path(f"{directory.rstrip('/')}/{MANIFEST}"))
        host.path(directory).mkdir(parents=True, exist_ok=True)
        write_atomically(where, json.dumps({"format": MANIFEST_FORMAT, "files": self.files, "misses": self.misses},
                                           indent=1, sort_keys=True) + "\n")

    def known(self, host_path: str) -> KeptFile:
        """The kept file at ``host_path`` with what the manifest says about it (``archive cache`` when it says
        nothing: a file kept before the manifest existed came from a cache or a repository)."""
        entry = self.files.get(host_path.rsplit("/", 1)[-1], {})
        return KeptFile(host_path, str(entry.get("source", "archive cache")), tuple(entry.get("inexact", ())),
                        tuple(entry.get("conffiles_edited", ())))

    def remember(self, kept: KeptFile) -> None:
        if kept.path is not None:
            self.files[kept.path.rsplit("/", 1)[-1]] = kept.entry()

    def first_miss(self, name: str, version: str, arch: str, reason: str) -> bool:
        """Record a miss; True only the first time this package version missed (the time to log it)."""
        key = f"{name} {version} {arch}"
        first = key not in self.misses
        self.misses[key] = reason
        return first

    def forget_misses_except(self, wanted: List[Tuple[str, str, str]]) -> None:
        keep = {f"{n} {v} {a}" for n, v, a in wanted}
        self.misses = {k: v for k, v in self.misses.items() if k in keep}

    def forget_files_except(self, names: List[str]) -> None:
        keep = set(names)
        self.files = {k: v for k, v in self.files.items() if k in keep}
