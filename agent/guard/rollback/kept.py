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
import shutil
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Mapping, Optional, Protocol, Tuple

from agent.errors import GpuguardError, InputFileError
from agent.files import read_json_file, write_atomically
from agent.host import Host
from agent.hostfacts.package_keys import package_name
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


class Rebuilt(Protocol):
    """What a rebuild wrote (agent.guard.apt.deb_rebuild.RebuiltDeb, agent.guard.dnf.rpm_rebuild.RebuiltRpm)."""

    @property
    def exact(self) -> bool: ...

    @property
    def conffiles_edited(self) -> Tuple[str, ...]: ...

    def differences(self) -> List[str]: ...


def keep_rebuilt(host: Host, manifest: Manifest, package: Tuple[str, str, str], target: str,
                 rebuild: Callable[[], Optional[Rebuilt]], unavailable: str, manager: str) -> KeptFile:
    """The last resort of a cache: ``rebuild()`` the installed package into ``target``; the kept file, or why there
    is none (``unavailable`` says why no cache or repository had it). An inexact rebuild is logged once (the file
    stays, so the next check finds it kept); a miss is logged the first time for a package version."""
    name, version, arch = package
    try:
        rebuilt = rebuild()
    except (GpuguardError, ValueError, OSError) as exc:
        reason = f"{unavailable}, and rebuilding it failed: {exc}"
    else:
        if rebuilt is not None:
            if not rebuilt.exact:
                log.warning("package_rebuilt_inexact", package=name, version=version, arch=arch,
                            differences=rebuilt.differences())
            kept = KeptFile(target, "rebuilt", tuple(rebuilt.differences()), tuple(rebuilt.conffiles_edited),
                            size_bytes=_size(host, target))
            manifest.remember(kept)
            return kept
        reason = f"{unavailable}, and {manager} does not have it installed to rebuild"
    if manifest.first_miss(name, version, arch, reason):
        log.warning("package_file_miss", manager=manager, package=name, version=version, arch=arch, reason=reason)
    return KeptFile(None, reason=reason)


class Versioned(Protocol):
    """An installed package's version and architecture (agent.guard.rollback.backend.InstalledPackage)."""

    @property
    def version(self) -> str: ...

    @property
    def arch(self) -> str: ...


class KeptFiles(Protocol):
    """A directory of kept package files (agent.guard.apt.deb_cache.DebCache, agent.guard.dnf.rpm_cache.RpmCache)."""

    directory: str

    def path(self, name: str, version: str, arch: str) -> str: ...

    def ensure(self, name: str, version: str, arch: str, manifest: Manifest) -> KeptFile: ...


def keep_set(host: Host, cache: KeptFiles, suffix: str, installed: Mapping[str, Versioned],
             also_keep: Mapping[str, Versioned], max_bytes: int) -> Dict[str, KeptFile]:
    """Keep a file for every package of ``installed`` (one per name, version and architecture, the file's name,
    which both sets may share), then bound the directory (:func:`settle`); the kept file per package key."""
    manifest = Manifest.load(host, cache.directory)
    files = {k: cache.ensure(package_name(k), v.version, v.arch, manifest) for k, v in sorted(installed.items())}
    older = [cache.path(package_name(k), v.version, v.arch) for k, v in also_keep.items()]
    return settle(host, cache.directory, suffix, files, older, manifest,
                  [(package_name(k), v.version, v.arch) for k, v in installed.items()], max_bytes)


def _size(host: Host, host_path: str) -> int:
    try:
        return host.path(host_path).stat().st_size
    except OSError:
        return 0


def settle(host: Host, directory: str, suffix: str, files: Dict[str, KeptFile], also_keep: List[str],
           manifest: Manifest, wanted: List[Tuple[str, str, str]], max_bytes: int) -> Dict[str, KeptFile]:
    """Bound the kept-files directory once a set's files are ensured; the set's kept files as they stand after.

    Files no kept set references are removed: neither ``files`` (the set being recorded) nor ``also_keep`` (host
    paths of the set kept before the last change, which the health-gated rollback restores). One file per
    name, version and architecture serves both sets. Over ``max_bytes`` (0: no cap), the older set's files go
    first, then the recorded set's largest files, each then not restorable with the reason, and one
    ``kept_packages_cap_reached`` warning says what was dropped.
    """
    current = {kept.path for kept in files.values() if kept.path}
    keep = current | set(also_keep)
    for name in host.list_dir(directory):
        where = f"{directory.rstrip('/')}/{name}"
        if (name.endswith(suffix) and where not in keep) or name.endswith(".partial"):
            host.path(where).unlink()  # ".partial": a rebuild killed half-way (the guard child's time limit)
        elif name.startswith(".rebuild-"):
            shutil.rmtree(host.path(where), ignore_errors=True)
    present = {p: _size(host, p) for p in keep if host.path(p).is_file()}
    total = sum(present.values())
    out = dict(files)
    if max_bytes and total > max_bytes:
        dropped: List[str] = []
        older = sorted((p for p in present if p not in current), key=lambda p: -present[p])
        by_size = sorted(((k, kept) for k, kept in files.items() if kept.path in present),
                         key=lambda item: -present[str(item[1].path)])
        for victim in older + [str(kept.path) for _, kept in by_size]:
            if total <= max_bytes:
                break
            host.path(victim).unlink()
            total -= present.pop(victim)
            dropped.append(victim.rsplit("/", 1)[-1])
        reason = (f"over [guard] kept_packages_max_bytes ({max_bytes} bytes): raise it, or free the space the kept "
                  f"files need")
        for key, kept in files.items():
            if kept.path is not None and kept.path not in present:
                out[key] = KeptFile(None, reason=reason)
        log.warning("kept_packages_cap_reached", max_bytes=max_bytes, kept_bytes=total, dropped=dropped)
    manifest.forget_files_except([p.rsplit("/", 1)[-1] for p in present])
    manifest.forget_misses_except(wanted)
    manifest.save(host, directory)
    return out
