"""zypper and rpm for one Host: the tool RpmBackend drives on zypper hosts (rollback of what bypassed zypper).

The same interface as agent/guard/dnf/tool.py's DnfTool, whose rpm side (installed set, rpm lock, ``rpm -Va``,
the .rpm rebuilt from the rpm database) it keeps; the transaction goes through zypper instead of ``dnf shell``:

- ``install FILE|NEVRA`` and ``remove NEVRA`` lines become ONE ``zypper install --oldpackage`` with the files, the
  ``name=EVR`` builds and ``!NEVRA`` removals (zypper removes what an install argument marks with ``!``);
- planned with ``--dry-run --xmlout``: the ``<install-summary>`` (``to-downgrade``, ``to-upgrade``,
  ``to-install``, ``to-remove`` solvables) is the plan, run only when it moves exactly the packages asked for;
- a build not kept is fetched with ``zypper download`` (into zypper's package cache, then copied).

gpuguard's rpm plugin judges the rollback like any transaction and honours the one-shot rollback authorization.
"""

from __future__ import annotations

import os
import shutil
from typing import Dict, List, Optional, Sequence, Tuple

from agent.errors import InputFileError
from agent.guard.dnf.tool import RPM_LOCK_FILES, DnfTool, plan_problems, rpm_file_name, split_nevra
from agent.guard.locks import record_lock_is_free, wait_for_locks
from agent.guard.rollback.backend import PlannedStep
from agent.host import CommandResult

ZYPP_PACKAGE_CACHE = "/var/cache/zypp/packages"
# libzypp's lock: a pid file, held while that process lives (zypp/ZYppFactory.cc; /var/run/zypp.pid before /run).
ZYPP_LOCK_FILES = ("/run/zypp.pid", "/var/run/zypp.pid")
SUMMARY_ACTIONS = {"to-downgrade": "downgrade", "to-upgrade": "upgrade", "to-install": "install",
                   "to-reinstall": "reinstall", "to-remove": "remove"}


def install_args(lines: Sequence[str]) -> List[str]:
    """zypper install arguments for rollback lines: files, ``name=EVR`` builds, ``!NEVRA`` removals (pure)."""
    args: List[str] = []
    for line in lines:
        verb, _, spec = line.partition(" ")
        if verb == "remove":
            args.append(f"!{spec}")
        elif spec.startswith("/"):
            args.append(spec)
        else:
            name, evr, _ = split_nevra(spec)
            args.append(f"{name}={evr}")
    return args


def parse_install_summary(text: str) -> List[PlannedStep]:
    """The plan in ``zypper --xmlout install --dry-run`` output; InputFileError when there is no summary."""
    import xml.etree.ElementTree as ET

    start = text.find("<stream")
    try:
        root = ET.fromstring(text[start:] if start >= 0 else text)
    except ET.ParseError as exc:
        raise InputFileError("zypper --xmlout install --dry-run", f"not XML ({exc})") from None
    summary = root.find("install-summary")
    if summary is None:
        return []
    steps = []
    for section in summary:
        action = SUMMARY_ACTIONS.get(section.tag)
        if action is None:
            continue
        for solvable in section.iter("solvable"):
            if solvable.get("type", "package") != "package":
                continue
            name, edition = solvable.get("name", ""), solvable.get("edition", "")
            old = solvable.get("edition-old", "")
            steps.append(PlannedStep(action, name, edition, "") if action == "remove"
                         else PlannedStep(action, name, old, edition))
    return steps


def _exit(returncode: int) -> str:
    return f"killed by signal {-returncode}" if returncode < 0 else f"exit {returncode}"


def zypp_lock_holder(pid_text: bytes, own_pid: int) -> Optional[int]:
    """The pid in libzypp's lock file when it names another process, else None (pure but for the liveness)."""
    try:
        pid = int(pid_text[:20].strip() or b"0")
    except ValueError:
        return None
    if pid <= 0 or pid == own_pid:
        return None
    return pid if os.path.exists(f"/proc/{pid}") else None


def _messages(text: str) -> List[str]:
    """zypper's error messages in --xmlout output."""
    import re

    found = re.findall(r'<message type="error">(.*?)</message>', text, re.DOTALL)
    return [" ".join(m.split())[:300] for m in found]


class ZypperTool(DnfTool):
    """zypper/rpm for one Host; ``options`` go before every zypper command (global options)."""

    def argv(self, *args: str) -> List[str]:
        root = [] if self.host.is_live else ["--root", str(self.host.root)]
        return ["zypper", "--non-interactive", *root, *self.options, *args]

    def is_dnf5(self) -> bool:
        return False

    @property
    def mechanism(self) -> str:
        return "zypper install"

    def _install_argv(self, dry_run: bool, lines: Sequence[str]) -> List[str]:
        return self.argv("--xmlout", "install", "--oldpackage", "--no-recommends", "--allow-unsigned-rpm",
                         *(["--dry-run"] if dry_run else []), "--", *install_args(lines))

    def simulate(self, lines: Sequence[str]) -> Tuple[List[PlannedStep], Optional[str]]:
        """Resolve the rollback with ``--dry-run``: zypper's plan, and why it cannot be run (None when it can)."""
        result = self.host.run(self._install_argv(True, lines), timeout_seconds=300.0)
        try:
            plan = parse_install_summary(result.stdout)
        except InputFileError as exc:
            return [], f"zypper could not plan the rollback: {exc}"
        errors = _messages(result.stdout)
        if result.returncode != 0 or not plan:
            detail = "; ".join(errors) or (result.stderr.strip().splitlines() or ["no plan"])[-1]
            return plan, f"zypper could not plan the rollback ({_exit(result.returncode)}): {detail}"
        problems = [p.replace("dnf", "zypper") for p in plan_problems(lines, plan)]
        if problems:
            return plan, "zypper's plan differs from the rollback: " + "; ".join(problems)
        return plan, None

    def apply(self, lines: Sequence[str]) -> Optional[str]:
        """Run the rollback as one zypper transaction; why it failed, or None."""
        result = self.host.run(self._install_argv(False, lines), timeout_seconds=self.timeout_seconds)
        if result.returncode != 0:
            detail = "; ".join(_messages(result.stdout)) or (result.stderr.strip().splitlines() or ["no output"])[-1]
            return f"zypper install failed ({_exit(result.returncode)}): {detail}"
        return None

    def wait_for_rpm_lock(self) -> float:
        """Wait until neither rpm nor another libzypp program (zypper, YaST, PackageKit) holds its lock; the seconds
        waited, CommandTimeout after the limit."""
        from agent.hostfacts.paths import read_regular_file

        def zypp_free(path: str) -> bool:
            try:  # a FIFO in its place is no holder, and is not waited on
                text = read_regular_file(path, 4096)
            except OSError:
                return True
            return zypp_lock_holder(text, os.getpid()) is None

        locks = [(p, record_lock_is_free) for p in RPM_LOCK_FILES] + [(p, zypp_free) for p in ZYPP_LOCK_FILES]
        return wait_for_locks(self.host, locks, self.lock_timeout_seconds, self.sleep)

    def download(self, name: str, version: str, arch: str, dest_dir: str) -> CommandResult:
        """``zypper download name=EVR`` into zypper's package cache, then the file copied into ``dest_dir``."""
        result = self.host.run(self.argv("download", f"{name}={version}"), timeout_seconds=300.0)
        file_name = rpm_file_name(name, version, arch)
        for candidate in self.host.walk_files(ZYPP_PACKAGE_CACHE):
            if candidate.rsplit("/", 1)[-1] == file_name:
                target = self.host.path(f"{dest_dir.rstrip('/')}/{file_name}")
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(self.host.path(candidate), target)
                break
        return result

    def location(self, name: str, version: str, arch: str) -> Optional[str]:
        """zypper names no download URL; the package cache (download) and the rebuild cover it."""
        return None

    def available_versions(self, specs: Sequence[str]) -> Dict[str, List[str]]:
        from agent.guard.zypper.locks import available_versions

        return available_versions(self.host, specs)
