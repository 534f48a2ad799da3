"""The package-manager side of rollback: one small interface, an apt/dpkg and a dnf/rpm implementation.

:func:`agent.guard.rollback.check_and_rollback` is neutral: it reads the guarded installed set, compares it with
the known-good set, evaluates the policy and records events. Everything that differs between dpkg and rpm hosts
goes through a :class:`PackageBackend`:

- ``read_installed``: the guarded packages, keyed ``name`` (``name:arch`` for a foreign arch; ``name@version``
  for rpm install-only packages such as kernels, which sit side by side)
- ``wait_for_lock``: wait until no package manager holds the database
- ``cache_known_good``: keep the package files of the known-good set (ensure, then prune the rest)
- ``plan_targets``: what restores the known-good set (cached files first, versions otherwise, removals)
- ``simulate``, ``apply``, ``finish_pending``: plan without change, run it, never leave a half-done state

:func:`backend_for` picks the backend from the host's package database, in this one place.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Protocol, Sequence, Tuple

from agent.host import Host
from agent.log import get_logger

log = get_logger("guard.backend")

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

    def read_installed(self, patterns: Sequence[str]) -> Dict[str, InstalledPackage]: ...

    def wait_for_lock(self) -> float: ...

    def cache_known_good(self, installed: Dict[str, InstalledPackage]) -> Dict[str, Optional[str]]: ...

    def has_cached(self, key: str, package: InstalledPackage) -> bool: ...

    @property
    def cache_dir(self) -> str: ...

    def plan_targets(self, known_good: Dict[str, InstalledPackage],
                     current: Dict[str, InstalledPackage]) -> Targets: ...

    def simulate(self, targets: Sequence[str]) -> Tuple[List[PlannedStep], Optional[str]]: ...

    def apply(self, targets: Sequence[str]) -> Optional[str]: ...

    def finish_pending(self) -> None: ...


def _last_line(text: str) -> str:
    return (text.strip().splitlines() or ["no output"])[-1]


class AptBackend:
    """apt-get and dpkg (agent.guard.apt_tool) with the .deb cache (agent.guard.deb_cache)."""

    manager = "dpkg"
    tool_name = "apt-get"
    file_field = "deb"

    def __init__(self, host: Host, tool, cache_dir: str) -> None:
        from agent.guard.deb_cache import DebCache

        self.host = host
        self.tool = tool
        self.cache = DebCache(host, cache_dir, tool)
        self._local_only = False  # set by simulate(): apply() runs in the mode that planned

    def read_installed(self, patterns: Sequence[str]) -> Dict[str, InstalledPackage]:
        import fnmatch

        from agent.dpkg_status import iter_dpkg_status, package_key
        from agent.errors import InputFileError

        text = self.host.read_text("/var/lib/dpkg/status")
        if text is None:
            raise InputFileError(str(self.host.path("/var/lib/dpkg/status")), "no dpkg status database")
        wanted = list(patterns)
        out = {}
        for name, version, arch, _ in iter_dpkg_status(text,
                                                       lambda n: any(fnmatch.fnmatchcase(n, p) for p in wanted)):
            out[package_key(name, arch, "")] = InstalledPackage(version, arch)
        return out

    def wait_for_lock(self) -> float:
        return self.tool.wait_for_dpkg_lock()

    def cache_known_good(self, installed: Dict[str, InstalledPackage]) -> Dict[str, Optional[str]]:
        debs = self.cache.ensure_all({k.split(":", 1)[0]: (v.version, v.arch) for k, v in installed.items()})
        self.cache.prune([p for p in debs.values() if p])
        return {k: debs.get(k.split(":", 1)[0]) for k in installed}

    def has_cached(self, key: str, package: InstalledPackage) -> bool:
        return self.cache.has(key.split(":", 1)[0], package.version, package.arch)

    @property
    def cache_dir(self) -> str:
        return self.cache.directory

    def plan_targets(self, known_good: Dict[str, InstalledPackage], current: Dict[str, InstalledPackage]) -> Targets:
        """apt-get install arguments: cached .deb files, else name=version, and name- for new guarded packages."""
        targets, before, after = [], {}, {}
        for key in sorted(set(known_good) | set(current)):
            good, now = known_good.get(key), current.get(key)
            if good is not None and now is not None and good.version == now.version:
                continue
            name = key.split(":", 1)[0]
            before[key] = now.version if now else "(not installed)"
            after[key] = good.version if good else "(removed)"
            if good is None:
                targets.append(f"{key}-")
            elif self.cache.has(name, good.version, good.arch):
                targets.append(str(self.cache.path(name, good.version, good.arch)))
            else:
                targets.append(f"{key}={good.version}")
        return targets, before, after

    def simulate(self, targets: Sequence[str]) -> Tuple[List[PlannedStep], Optional[str]]:
        """Plan with the kept .deb files alone when every target is one (or a removal); else with the repositories.

        The mode that planned is the mode :meth:`apply` runs in. A local-only plan that fails (the old build needs
        a dependency only a repository has) is planned again with the repositories.
        """
        self._local_only = bool(targets) and all(t.startswith("/") or t.endswith("-") for t in targets)
        if self._local_only:
            result, plan = self.tool.simulate(targets, local_only=True)
            if result.returncode == 0:
                return plan, None
            log.info("rollback_local_plan_failed", error=_last_line(result.stderr))
            self._local_only = False
        result, plan = self.tool.simulate(targets)
        if result.returncode != 0:
            return plan, "apt-get -s could not plan the rollback: " + _last_line(result.stderr)
        return plan, None

    def apply(self, targets: Sequence[str]) -> Optional[str]:
        run = self.tool.install(targets, local_only=self._local_only)
        if run.returncode != 0:
            return "apt-get install failed: " + _last_line(run.stderr)
        return None

    def finish_pending(self) -> None:
        self.tool.configure_pending()


def detect_manager(host: Host) -> str:
    """``dpkg`` or ``rpm``: which package database this host has (dpkg wins when both are present)."""
    from agent.guard.dnf_tool import has_rpm_database

    if host.path("/var/lib/dpkg/status").is_file():
        return "dpkg"
    if has_rpm_database(host):
        return "rpm"
    return "dpkg"  # neither: the dpkg reader names the missing status file, as before rpm support


def backend_for(host: Host, settings, tool=None) -> PackageBackend:
    """The backend for this host's package database; ``tool`` (an AptTool or DnfTool) replaces the default."""
    from agent.guard.state import GuardPaths

    paths = GuardPaths(settings.agent.state_dir)
    guard = settings.guard
    if tool is not None and getattr(tool, "manager", "dpkg") == "rpm":
        return RpmBackend(host, tool, paths.rpms)
    if tool is None and detect_manager(host) == "rpm":
        from agent.guard.dnf_tool import DnfTool

        tool = dnf_tool_for(host, settings)
        return RpmBackend(host, tool, paths.rpms)
    if tool is None:
        from agent.guard.apt_tool import AptTool

        tool = AptTool(host, timeout_seconds=guard.apt_timeout_seconds, lock_timeout_seconds=guard.lock_timeout_seconds)
    return AptBackend(host, tool, paths.debs)


def dnf_tool_for(host: Host, settings):
    """A DnfTool with the guard settings' timeouts and dnf options, writing its script in the state directory."""
    from agent.guard.dnf_tool import DnfTool

    guard = settings.guard
    return DnfTool(host, timeout_seconds=guard.apt_timeout_seconds, lock_timeout_seconds=guard.lock_timeout_seconds,
                   options=list(getattr(guard, "dnf_options", ()) or ()), work_dir=settings.agent.state_dir)


class RpmBackend:
    """dnf and rpm (agent.guard.dnf_tool) with the .rpm cache (agent.guard.rpm_cache)."""

    manager = "rpm"
    tool_name = "dnf"
    file_field = "rpm"

    def __init__(self, host: Host, tool, cache_dir: str) -> None:
        from agent.guard.rpm_cache import RpmCache

        self.host = host
        self.tool = tool
        self.cache = RpmCache(host, cache_dir, tool)

    def read_installed(self, patterns: Sequence[str]) -> Dict[str, InstalledPackage]:
        return {k: InstalledPackage(v.version, v.arch) for k, v in self.tool.installed(patterns).items()}

    def wait_for_lock(self) -> float:
        return self.tool.wait_for_rpm_lock()

    def cache_known_good(self, installed: Dict[str, InstalledPackage]) -> Dict[str, Optional[str]]:
        from agent.guard.dnf_tool import package_name

        files = {k: self.cache.ensure(package_name(k), v.version, v.arch) for k, v in sorted(installed.items())}
        self.cache.prune([p for p in files.values() if p])
        return files

    def has_cached(self, key: str, package: InstalledPackage) -> bool:
        from agent.guard.dnf_tool import package_name

        return self.cache.has(package_name(key), package.version, package.arch)

    @property
    def cache_dir(self) -> str:
        return self.cache.directory

    def plan_targets(self, known_good: Dict[str, InstalledPackage], current: Dict[str, InstalledPackage]) -> Targets:
        """dnf shell lines: ``install FILE|NEVRA`` (dnf downgrades when it is older) and ``remove NEVRA``."""
        from agent.guard.dnf_tool import nevra, package_name

        targets, before, after = [], {}, {}
        for key in sorted(set(known_good) | set(current)):
            good, now = known_good.get(key), current.get(key)
            if good is not None and now is not None and good.version == now.version:
                continue
            name = package_name(key)
            before[key] = now.version if now else "(not installed)"
            after[key] = good.version if good else "(removed)"
            if good is None:
                targets.append(f"remove {nevra(name, now.version, now.arch)}")
            elif self.cache.has(name, good.version, good.arch):
                targets.append(f"install {self.host.path(self.cache.path(name, good.version, good.arch))}")
            else:
                targets.append(f"install {nevra(name, good.version, good.arch)}")
        # dnf shell takes local files only before any other job ("Cannot add local packages, because transaction
        # job already exists"): files first, then repository builds, then removals.
        targets.sort(key=lambda line: (0 if line.startswith("install /") else 1 if line.startswith("install") else 2))
        return targets, before, after

    def simulate(self, targets: Sequence[str]) -> Tuple[List[PlannedStep], Optional[str]]:
        return self.tool.simulate(targets)

    def apply(self, targets: Sequence[str]) -> Optional[str]:
        return self.tool.apply(targets)

    def finish_pending(self) -> None:
        self.tool.finish_pending()
