"""The package-manager side of rollback: one small interface and its types, implemented for apt/dpkg and dnf/rpm.

:func:`agent.guard.rollback.core.check_and_rollback` is neutral: it reads the guarded installed set, compares it with
the known-good set, evaluates the policy and records events. Everything that differs between dpkg and rpm hosts
goes through a :class:`PackageBackend`:

- ``read_installed``: the guarded packages, keyed ``name`` (``name:arch`` for a foreign arch; ``name@version``
  for rpm install-only packages such as kernels, which sit side by side)
- ``wait_for_lock``: wait until no package manager holds the database
- ``cache_known_good``: keep the package files of the known-good set (ensure, then prune the rest but the files
  of ``also_keep``, the set before the last change; within [guard] kept_packages_max_bytes): from the package
  manager's cache, a repository, or rebuilt from the installed files (agent.guard.rollback.kept), the rebuilds in
  parallel with their progress told to ``progress`` (default: logged)
- ``plan_targets``: what restores the known-good set (cached files first, versions otherwise, removals)
- ``simulate``, ``apply``, ``finish_pending``: plan without change, run it, never leave a half-done state
  (``mechanism`` says how the last plan restores the set, for the rollback event)
- ``verify_database``: after the rollback, None when the package database is consistent (no half-installed
  package, every dependency met), else what is wrong

The implementations are agent.guard.apt.backend.AptBackend and agent.guard.dnf.backend.RpmBackend;
agent.guard.manager.backend_for picks one from the host's package database, in that one place.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Dict, List, Optional, Protocol, Sequence, Tuple

if TYPE_CHECKING:
    from agent.guard.rollback.kept import KeptFile, ProgressSink

Targets = Tuple[List[str], Dict[str, str], Dict[str, str]]


@dataclass(frozen=True)
class InstalledPackage:
    version: str
    arch: str


@dataclass(frozen=True)
class PlannedStep:
    """One step of a package manager's plan."""

    action: str  # "install", "remove" (apt); "install", "upgrade", "downgrade", "reinstall", "remove" (dnf)
    package: str
    old_version: str
    new_version: str


class PackageBackend(Protocol):
    """What rollback needs from a package manager; every command goes through the Host seam."""

    manager: str  # the version scheme: "dpkg" or "rpm"
    tool_name: str  # for messages: "apt-get" or "dnf"
    file_field: str  # the known-good entry field naming the cached package file: "deb" or "rpm"

    @property
    def mechanism(self) -> str:
        """How the last simulate() plan restores the set: "apt-get install", "dpkg -i ...", "dnf shell", "dnf5 do"."""
        ...

    def read_installed(self, patterns: Sequence[str]) -> Dict[str, InstalledPackage]: ...

    def wait_for_lock(self) -> float: ...

    def cache_known_good(self, installed: Dict[str, InstalledPackage],
                         also_keep: Optional[Dict[str, InstalledPackage]] = None,
                         progress: "Optional[ProgressSink]" = None) -> "Dict[str, KeptFile]": ...

    def has_cached(self, key: str, package: InstalledPackage) -> bool: ...

    @property
    def cache_dir(self) -> str: ...

    def plan_targets(self, known_good: Dict[str, InstalledPackage],
                     current: Dict[str, InstalledPackage]) -> Targets: ...

    def simulate(self, targets: Sequence[str]) -> Tuple[List[PlannedStep], Optional[str]]: ...

    def apply(self, targets: Sequence[str]) -> Optional[str]: ...

    def finish_pending(self) -> None: ...

    def verify_database(self) -> Optional[str]: ...
