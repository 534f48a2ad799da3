"""The package files rollback keeps, whatever the package manager: where each came from, how exact it is.

A kept file (:class:`KeptFile`) comes from the package manager's own cache (``archive cache``), from a repository
that still offers the version (``repository``), or is rebuilt from what the package database has installed
(``rebuilt``; exact only when every installed file still has the checksum the database recorded). The directory's
manifest (``kept.json`` beside the files) remembers that for each file, so a later check that finds the file
already kept still knows its source, and remembers the versions no file could be had for, so such a miss is
logged once per package version, not on every check.

Recording a set (:func:`keep_set`) first finds what is already kept or can be copied or downloaded, one package
after another (the package manager's tools are not run side by side), then rebuilds the rest in parallel, largest
first, with at most ``os.cpu_count()`` rebuilds at a time: a rebuild is reading, hashing and compressing, all of
which release the GIL, so threads use every core (issue #45). A package whose file is already kept (same name,
version and architecture) is never rebuilt again. A record that runs past a few seconds reports its progress and
the estimated time left (:class:`RecordProgress`).
"""

from __future__ import annotations

import json
import os
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Mapping, Optional, Protocol, Tuple, Union

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


@dataclass(frozen=True)
class PendingRebuild:
    """A package no cache or repository had: what rebuilding it from its installed files takes (run by
    :func:`keep_set`, beside the others)."""

    package: Tuple[str, str, str]  # name, version, arch
    target: str  # host path of the file to write
    rebuild: Callable[[], Optional["Rebuilt"]]
    unavailable: str  # why no cache or repository had it
    manager: str  # "dpkg" or "rpm"
    installed_bytes: int = 0  # what the rebuild reads (the database's installed size; 0: unknown), for progress

    def run(self, host: Host, manifest: Manifest) -> KeptFile:
        return keep_rebuilt(host, manifest, self.package, self.target, self.rebuild, self.unavailable, self.manager)


@dataclass(frozen=True)
class RecordProgress:
    """How far the rebuilds of one record are, and the time left estimated from the bytes rebuilt so far."""

    packages_done: int
    packages_total: int
    bytes_done: int
    bytes_total: int
    elapsed_seconds: float
    eta_seconds: Optional[float]  # None until one package is done

    def line(self) -> str:
        """One line for a person: ``rebuilding kept packages: 12/40, 2.1 of 8.6 GB, about 95 s left``."""
        eta = f", about {self.eta_seconds:.0f} s left" if self.eta_seconds is not None else ""
        return (f"rebuilding kept packages: {self.packages_done}/{self.packages_total}, "
                f"{self.bytes_done / 1e9:.1f} of {self.bytes_total / 1e9:.1f} GB{eta}")


ProgressSink = Callable[[RecordProgress], None]
# A record shorter than this reports nothing; a longer one at most once per interval, and when it ends.
PROGRESS_AFTER_SECONDS = 3.0
PROGRESS_INTERVAL_SECONDS = 10.0


def log_progress(progress: RecordProgress) -> None:
    """The daemon's (and the default) progress report: a ``known_good_progress`` event."""
    log.info("known_good_progress", packages_done=progress.packages_done, packages_total=progress.packages_total,
             bytes_done=progress.bytes_done, bytes_total=progress.bytes_total,
             elapsed_seconds=round(progress.elapsed_seconds, 1),
             eta_seconds=None if progress.eta_seconds is None else round(progress.eta_seconds, 1))


class _Progress:
    """Counts finished rebuilds and tells ``sink`` past :data:`PROGRESS_AFTER_SECONDS`, once per interval."""

    def __init__(self, pending: List[PendingRebuild], sink: ProgressSink, clock: Callable[[], float]) -> None:
        self.sink, self.clock = sink, clock
        self.total = len(pending)
        # A package of unknown size counts as the average of the known ones (or 1 byte when none is known).
        known = [p.installed_bytes for p in pending if p.installed_bytes > 0]
        self.default_bytes = sum(known) // len(known) if known else 1
        self.bytes_total = sum(self.size(p) for p in pending)
        self.done = self.bytes_done = 0
        self.started = clock()
        self.last_report: Optional[float] = None

    def size(self, pending: PendingRebuild) -> int:
        return pending.installed_bytes if pending.installed_bytes > 0 else self.default_bytes

    def finished(self, pending: PendingRebuild) -> None:
        self.done += 1
        self.bytes_done += self.size(pending)
        now = self.clock()
        elapsed = now - self.started
        if elapsed < PROGRESS_AFTER_SECONDS:
            return
        if self.done < self.total and self.last_report is not None \
                and now - self.last_report < PROGRESS_INTERVAL_SECONDS:
            return
        self.last_report = now
        rate = self.bytes_done / elapsed if elapsed > 0 else 0.0
        eta = (self.bytes_total - self.bytes_done) / rate if rate > 0 else None
        self.sink(RecordProgress(self.done, self.total, self.bytes_done, self.bytes_total, elapsed, eta))


def rebuild_workers(pending_count: int) -> int:
    """How many rebuilds run at once: one per CPU, never more than there are packages (at least one)."""
    return max(1, min(pending_count, os.cpu_count() or 1))


def rebuild_all(host: Host, manifest: Manifest, pending: Mapping[str, PendingRebuild],
                progress: ProgressSink = log_progress,
                clock: Callable[[], float] = time.monotonic) -> Dict[str, KeptFile]:
    """Run every pending rebuild, :func:`rebuild_workers` at a time, the largest first (so the last to finish
    is a small one); the kept file per package key."""
    if not pending:
        return {}
    order = sorted(pending, key=lambda k: (-pending[k].installed_bytes, k))
    counter = _Progress(list(pending.values()), progress, clock)

    def one(key: str) -> KeptFile:
        kept = pending[key].run(host, manifest)
        counter.finished(pending[key])
        return kept

    with ThreadPoolExecutor(max_workers=rebuild_workers(len(pending)), thread_name_prefix="rebuild") as pool:
        return dict(zip(order, pool.map(one, order)))


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

    def find(self, name: str, version: str, arch: str, manifest: Manifest) -> Union[KeptFile, PendingRebuild]:
        """The kept file when it is kept already or could be copied or downloaded; else the rebuild it takes."""


def keep_set(host: Host, cache: KeptFiles, suffix: str, installed: Mapping[str, Versioned],
             also_keep: Mapping[str, Versioned], max_bytes: int,
             progress: ProgressSink = log_progress) -> Dict[str, KeptFile]:
    """Keep a file for every package of ``installed`` (one per name, version and architecture, the file's name,
    which both sets may share), then bound the directory (:func:`settle`); the kept file per package key.

    What is kept, cached or offered is found one package after another; the rest are rebuilt in parallel
    (:func:`rebuild_all`)."""
    manifest = Manifest.load(host, cache.directory)
    found = {k: cache.find(package_name(k), v.version, v.arch, manifest) for k, v in sorted(installed.items())}
    files = {k: f for k, f in found.items() if isinstance(f, KeptFile)}
    files.update(rebuild_all(host, manifest, {k: p for k, p in found.items() if isinstance(p, PendingRebuild)},
                             progress))
    files = dict(sorted(files.items()))
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
