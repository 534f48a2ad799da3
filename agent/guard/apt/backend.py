"""The apt/dpkg side of rollback: :class:`AptBackend`, a :class:`~agent.guard.rollback.backend.PackageBackend`."""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

from agent.errors import InputFileError
from agent.guard.apt.deb_cache import DebCache, parse_deb_file_name
from agent.guard.apt.tool import AptTool
from agent.guard.rollback.backend import InstalledPackage, PlannedStep, Targets
from agent.guard.rollback.kept import KeptFile, ProgressSink, keep_set, log_progress
from agent.host import Host
from agent.hostfacts.dpkg_status import iter_dpkg_status, native_architecture
from agent.hostfacts.package_keys import package_key
from agent.log import get_logger
from agent.policy.globs import any_glob

log = get_logger("guard.apt.backend")
DPKG_STATUS = "/var/lib/dpkg/status"


def read_dpkg_installed(host: Host, patterns: Sequence[str]) -> Dict[str, InstalledPackage]:
    """Installed packages matching the globs, from the host's dpkg status file; InputFileError without one."""
    text = host.read_text(DPKG_STATUS)
    if text is None:
        raise InputFileError(str(host.path(DPKG_STATUS)), "no dpkg status database")
    # Keyed as the apt hook keys them (name, or name:arch for a foreign architecture), so the known-good set,
    # the rollback authorization and the hook's resulting set name a multi-arch package the same way.
    native, wanted = native_architecture(text), list(patterns)
    out = {}
    for name, version, arch, _ in iter_dpkg_status(text, any_glob(wanted)):
        out[package_key(name, arch, native)] = InstalledPackage(version, arch)
    return out


def _last_line(text: str) -> str:
    return (text.strip().splitlines() or ["no output"])[-1]


class AptBackend:
    """apt-get and dpkg (agent.guard.apt.tool) with the .deb cache (agent.guard.apt.deb_cache)."""

    manager = "dpkg"
    tool_name = "apt-get"
    file_field = "deb"

    def __init__(self, host: Host, tool: AptTool, cache_dir: str, max_bytes: int = 0) -> None:
        self.host = host
        self.max_bytes = max_bytes  # [guard] kept_packages_max_bytes (0: no cap)
        self.tool = tool
        self.cache = DebCache(host, cache_dir, tool)
        self._local_only = False  # set by simulate(): apply() runs in the mode that planned
        self.mechanism = "apt-get install"  # how the last plan restores the set (for the rollback event)

    def read_installed(self, patterns: Sequence[str]) -> Dict[str, InstalledPackage]:
        return read_dpkg_installed(self.host, patterns)

    def wait_for_lock(self) -> float:
        return self.tool.wait_for_dpkg_lock()

    def cache_known_good(self, installed: Dict[str, InstalledPackage],
                         also_keep: Optional[Dict[str, InstalledPackage]] = None,
                         progress: Optional[ProgressSink] = None) -> Dict[str, KeptFile]:
        return keep_set(self.host, self.cache, ".deb", installed, also_keep or {}, self.max_bytes,
                        progress or log_progress)

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
        # A name installed for several architectures (Multi-Arch: same) must be at one version in all of them:
        # its unchanged copies are reinstalled with the moved one, so dpkg can put them back as a group.
        moved = {key.split(":", 1)[0] for key in after}
        for key, good in sorted(known_good.items()):
            name = key.split(":", 1)[0]
            siblings = [k for k in known_good if k.split(":", 1)[0] == name]
            if name in moved and key not in after and len(siblings) > 1 and self.cache.has(name, good.version,
                                                                                          good.arch):
                targets.append(str(self.cache.path(name, good.version, good.arch)))
        return targets, before, after

    def simulate(self, targets: Sequence[str]) -> Tuple[List[PlannedStep], Optional[str]]:
        """Plan with the kept .deb files alone when every target is one (or a removal); else with the repositories;
        when apt cannot plan at all, install the exact kept set with dpkg.

        The mode that planned is the mode :meth:`apply` runs in. A local-only plan that fails (the old build needs
        a dependency only a repository has) is planned again with the repositories. apt refuses to plan from a
        state whose dependencies are already broken (``dpkg -i --force-depends`` of a driver without its
        firmware: "E: Unmet dependencies"), and it would refuse every retry; when every target is a kept .deb or a
        removal, the rollback then runs ``dpkg -i`` of exactly those files, ``dpkg -r`` of the removals and
        ``dpkg --configure -a``, and :meth:`verify_database` checks the result.
        """
        all_local = bool(targets) and all(t.startswith("/") or t.endswith("-") for t in targets)
        self._local_only = all_local
        self.mechanism = "apt-get install (kept .deb files)" if all_local else "apt-get install"
        if self._local_only:
            result, plan = self.tool.simulate(targets, local_only=True)
            if result.returncode == 0:
                return plan, None
            log.info("rollback_local_plan_failed", error=_last_line(result.stderr))
            self._local_only = False
            self.mechanism = "apt-get install"
        result, plan = self.tool.simulate(targets)
        if result.returncode == 0:
            return plan, None
        apt_error = "apt-get -s could not plan the rollback: " + _last_line(result.stderr)
        if not all_local:
            return plan, apt_error
        log.info("rollback_apt_plan_failed", error=_last_line(result.stderr))
        self.mechanism = f"dpkg -i of the kept .deb files (apt could not plan: {_last_line(result.stderr)})"
        return [self._dpkg_step(t) for t in targets], None

    def _dpkg_step(self, target: str) -> PlannedStep:
        if target.endswith("-"):
            return PlannedStep("remove", target[:-1], "", "")
        name, version, _ = parse_deb_file_name(target.rsplit("/", 1)[-1])
        return PlannedStep("install", name, "", version)

    def apply(self, targets: Sequence[str]) -> Optional[str]:
        if self.mechanism.startswith("dpkg"):
            return self._apply_with_dpkg(targets)
        run = self.tool.install(targets, local_only=self._local_only)
        if run.returncode != 0:
            return "apt-get install failed: " + _last_line(run.stderr)
        return None

    def _apply_with_dpkg(self, targets: Sequence[str]) -> Optional[str]:
        debs = [t for t in targets if not t.endswith("-")]
        removals = [t[:-1] for t in targets if t.endswith("-")]  # name:arch stays: dpkg -r takes it
        if debs:
            run = self.tool.dpkg_install(debs)
            group = _multi_arch_instances(debs)
            if run.returncode != 0 and group:
                # A Multi-Arch: same name left at two versions (one copy forced): dpkg refuses to unpack the old
                # build over a shared file the other version wrote ("different from other instances"). Remove
                # those copies (their dependants are reinstalled at once), then install the group again.
                log.info("rollback_multi_arch_reinstall", packages=group, error=_last_line(run.stderr))
                removed = self.tool.dpkg_remove(group, force_depends=True)
                if removed.returncode != 0:
                    return "dpkg -r of the multi-arch copies failed: " + _last_line(removed.stderr)
                run = self.tool.dpkg_install(debs)
            if run.returncode != 0:
                return "dpkg -i failed: " + _last_line(run.stderr)
        if removals:
            run = self.tool.dpkg_remove(removals)
            if run.returncode != 0:
                return "dpkg -r failed: " + _last_line(run.stderr)
        run = self.tool.configure_pending()
        if run.returncode != 0:
            return "dpkg --configure -a failed: " + _last_line(run.stderr)
        return None

    def verify_database(self) -> Optional[str]:
        """None when ``dpkg --audit`` reports nothing and ``apt-get check`` passes; else what they said."""
        problems = []
        audit = self.tool.audit()
        if audit.returncode != 0 or audit.stdout.strip():
            problems.append("dpkg --audit: " + " ".join((audit.stdout or audit.stderr).split())[:300])
        check = self.tool.check()
        if check.returncode != 0:
            unmet = [" ".join(line.split()) for line in check.stdout.splitlines() if ":" in line and "Depends" in line]
            problems.append("apt-get check: " + ("; ".join(unmet[:5]) or _last_line(check.stderr or check.stdout)))
        return "; ".join(problems) or None

    def finish_pending(self) -> None:
        self.tool.configure_pending()


def _multi_arch_instances(debs: Sequence[str]) -> List[str]:
    """``name:arch`` of every kept .deb whose name is among the files for more than one architecture."""
    parsed = [parse_deb_file_name(path.rsplit("/", 1)[-1]) for path in debs]
    names = [name for name, _, _ in parsed]
    return sorted(f"{name}:{arch}" for name, _, arch in parsed if names.count(name) > 1)
