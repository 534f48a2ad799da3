"""The apt/dpkg side of rollback: :class:`AptBackend`, a :class:`~agent.guard.rollback.backend.PackageBackend`."""

from __future__ import annotations

import fnmatch
from typing import Dict, List, Optional, Sequence, Tuple

from agent.errors import InputFileError
from agent.guard.apt.deb_cache import DebCache
from agent.guard.apt.tool import AptTool
from agent.guard.rollback.backend import InstalledPackage, PlannedStep, Targets
from agent.host import Host
from agent.hostfacts.dpkg_status import iter_dpkg_status, package_key
from agent.log import get_logger

log = get_logger("guard.apt.backend")


def _last_line(text: str) -> str:
    return (text.strip().splitlines() or ["no output"])[-1]


class AptBackend:
    """apt-get and dpkg (agent.guard.apt.tool) with the .deb cache (agent.guard.apt.deb_cache)."""

    manager = "dpkg"
    tool_name = "apt-get"
    file_field = "deb"

    def __init__(self, host: Host, tool: AptTool, cache_dir: str) -> None:
        self.host = host
        self.tool = tool
        self.cache = DebCache(host, cache_dir, tool)
        self._local_only = False  # set by simulate(): apply() runs in the mode that planned

    def read_installed(self, patterns: Sequence[str]) -> Dict[str, InstalledPackage]:
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
