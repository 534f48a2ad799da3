"""The dnf/rpm side of rollback: :class:`RpmBackend`, a :class:`~agent.guard.rollback.backend.PackageBackend`."""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

from agent.guard.dnf.rpm_cache import RpmCache
from agent.guard.dnf.tool import DnfTool, nevra
from agent.guard.rollback.backend import InstalledPackage, PlannedStep, Targets
from agent.guard.rollback.kept import KeptFile, ProgressSink, keep_set, log_progress
from agent.host import Host
from agent.hostfacts.package_keys import package_name


class RpmBackend:
    """dnf and rpm (agent.guard.dnf.tool) with the .rpm cache (agent.guard.dnf.rpm_cache)."""

    manager = "rpm"
    tool_name = "dnf"
    file_field = "rpm"

    def __init__(self, host: Host, tool: DnfTool, cache_dir: str, max_bytes: int = 0) -> None:
        self.host = host
        self.max_bytes = max_bytes  # [guard] kept_packages_max_bytes (0: no cap)
        self.tool = tool
        self.cache = RpmCache(host, cache_dir, tool)

    @property
    def mechanism(self) -> str:
        """``dnf shell`` (dnf4) or ``dnf5 do`` (dnf5): how the rollback transaction runs."""
        return str(getattr(self.tool, "mechanism", "dnf shell"))

    def read_installed(self, patterns: Sequence[str]) -> Dict[str, InstalledPackage]:
        return {k: InstalledPackage(v.version, v.arch) for k, v in self.tool.installed(patterns).items()}

    def wait_for_lock(self) -> float:
        return self.tool.wait_for_rpm_lock()

    def cache_known_good(self, installed: Dict[str, InstalledPackage],
                         also_keep: Optional[Dict[str, InstalledPackage]] = None,
                         progress: Optional[ProgressSink] = None) -> Dict[str, KeptFile]:
        return keep_set(self.host, self.cache, ".rpm", installed, also_keep or {}, self.max_bytes,
                        progress or log_progress)

    def has_cached(self, key: str, package: InstalledPackage) -> bool:
        return self.cache.has(package_name(key), package.version, package.arch)

    @property
    def cache_dir(self) -> str:
        return self.cache.directory

    def plan_targets(self, known_good: Dict[str, InstalledPackage], current: Dict[str, InstalledPackage]) -> Targets:
        """Rollback lines: ``install FILE|NEVRA`` (dnf and dnf5 downgrade when it is older) and ``remove NEVRA``
        (a dnf shell script on dnf4, the items of one ``dnf5 do`` on dnf5)."""
        targets, before, after = [], {}, {}
        for key in sorted(set(known_good) | set(current)):
            good, now = known_good.get(key), current.get(key)
            if good is not None and now is not None and good.version == now.version:
                continue
            name = package_name(key)
            before[key] = now.version if now else "(not installed)"
            after[key] = good.version if good else "(removed)"
            if good is None:
                assert now is not None  # the key is in known_good or in current
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

    def verify_database(self) -> Optional[str]:
        """None when ``rpm -Va --nofiles`` reports no unmet dependency; else what it said."""
        return self.tool.verify_dependencies()
