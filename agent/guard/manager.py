"""Which package manager a host has, and its tools and rollback backend built from the guard settings.

The one place that knows both apt and dnf: agent/guard/apt/ and agent/guard/dnf/ never import each other.
"""

from __future__ import annotations

import time
from typing import Callable, Optional, Union, cast

from agent.config import Settings
from agent.guard.apt.backend import AptBackend
from agent.guard.apt.tool import AptTool
from agent.guard.dnf.backend import RpmBackend
from agent.guard.dnf.tool import DnfTool
from agent.guard.rollback.backend import PackageBackend
from agent.host import Host
from agent.hostfacts.rpmdb import rpm_database_files
from agent.statepaths import StatePaths

# The package-manager front end a backend drives: apt for dpkg hosts, dnf for rpm hosts.
PackageTool = Union[AptTool, DnfTool]


def detect_manager(host: Host) -> str:
    """``dpkg`` or ``rpm``: which package database this host has (dpkg wins when both are present)."""
    if host.path("/var/lib/dpkg/status").is_file():
        return "dpkg"
    if rpm_database_files(str(host.root)):
        return "rpm"
    return "dpkg"  # neither: the dpkg reader names the missing status file, as before rpm support


def backend_for(host: Host, settings: Settings, tool: Optional[PackageTool] = None,
                sleep: Callable[[float], None] = time.sleep) -> PackageBackend:
    """The backend for this host's package database; ``tool`` (an AptTool or DnfTool) replaces the default, whose
    lock waits sleep with ``sleep`` (the daemon's gives up when it is stopping)."""
    paths = StatePaths(settings.agent.state_dir)
    if tool is None:
        tool = (dnf_tool_for(host, settings, sleep) if detect_manager(host) == "rpm"
                else apt_tool_for(host, settings, sleep))
    # The tool's ``manager`` says which it is (not isinstance: tests hand in fakes of either tool).
    if getattr(tool, "manager", "dpkg") == "rpm":
        return RpmBackend(host, cast(DnfTool, tool), paths.rpms)
    return AptBackend(host, cast(AptTool, tool), paths.debs)


def apt_tool_for(host: Host, settings: Settings, sleep: Callable[[float], None] = time.sleep) -> AptTool:
    """An AptTool with the guard settings' timeouts."""
    guard = settings.guard
    return AptTool(host, timeout_seconds=guard.apt_timeout_seconds, lock_timeout_seconds=guard.lock_timeout_seconds,
                   sleep=sleep)


def dnf_tool_for(host: Host, settings: Settings, sleep: Callable[[float], None] = time.sleep) -> DnfTool:
    """A DnfTool with the guard settings' timeouts and dnf options, writing its script in the state directory."""
    guard = settings.guard
    return DnfTool(host, timeout_seconds=guard.apt_timeout_seconds, lock_timeout_seconds=guard.lock_timeout_seconds,
                   sleep=sleep,
                   options=list(guard.dnf_options), paths=StatePaths(settings.agent.state_dir))
