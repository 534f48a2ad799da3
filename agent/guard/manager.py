"""A host's package-manager tools and rollback backend, built from the guard settings.

Where apt and dnf meet with agent/guard/installed.py (which package database a host has, its installed set):
agent/guard/apt/ and agent/guard/dnf/ never import each other.
"""

from __future__ import annotations

import time
from typing import Callable, Optional, Union, cast

from agent.guard.apt.backend import AptBackend
from agent.guard.apt.tool import AptTool
from agent.guard.dnf.backend import RpmBackend
from agent.guard.dnf.tool import DnfTool
from agent.guard.installed import detect_manager
from agent.guard.rollback.backend import PackageBackend
from agent.guard.settings import GuardSettings
from agent.guard.zypper.locks import uses_zypper
from agent.guard.zypper.tool import ZypperTool
from agent.host import Host
from agent.statepaths import StatePaths

# The package-manager front end a backend drives: apt for dpkg hosts, dnf (or zypper, a DnfTool) for rpm hosts.
PackageTool = Union[AptTool, DnfTool]


def backend_for(host: Host, guard: GuardSettings, paths: StatePaths, tool: Optional[PackageTool] = None,
                sleep: Callable[[float], None] = time.sleep) -> PackageBackend:
    """The backend for this host's package database, keeping package files under ``paths``; ``tool`` (an AptTool
    or DnfTool) replaces the default, whose lock waits sleep with ``sleep`` (the daemon's gives up when it is
    stopping)."""
    if tool is None:
        tool = (dnf_tool_for(host, guard, paths, sleep) if detect_manager(host) == "rpm"
                else apt_tool_for(host, guard, sleep))
    # The tool's ``manager`` says which it is (not isinstance: tests hand in fakes of either tool).
    if getattr(tool, "manager", "dpkg") == "rpm":
        return RpmBackend(host, cast(DnfTool, tool), paths.rpms, guard.kept_packages_max_bytes)
    return AptBackend(host, cast(AptTool, tool), paths.debs, guard.kept_packages_max_bytes)


def apt_tool_for(host: Host, guard: GuardSettings, sleep: Callable[[float], None] = time.sleep) -> AptTool:
    """An AptTool with the guard settings' timeouts."""
    return AptTool(host, timeout_seconds=guard.package_tool_timeout_seconds,
                   lock_timeout_seconds=guard.lock_timeout_seconds, sleep=sleep)


def dnf_tool_for(host: Host, guard: GuardSettings, paths: StatePaths,
                 sleep: Callable[[float], None] = time.sleep) -> DnfTool:
    """A DnfTool with the guard settings' timeouts and dnf options, writing its script in the state directory; on a
    zypper host (an rpm host with zypper and no dnf) a ZypperTool, which runs the transactions through zypper."""
    if uses_zypper(host):
        return ZypperTool(host, timeout_seconds=guard.package_tool_timeout_seconds,
                          lock_timeout_seconds=guard.lock_timeout_seconds, sleep=sleep, paths=paths)
    return DnfTool(host, timeout_seconds=guard.package_tool_timeout_seconds,
                   lock_timeout_seconds=guard.lock_timeout_seconds, sleep=sleep, options=list(guard.dnf_options),
                   paths=paths)
