"""Which package database a host has, and its installed packages read from it: what rollback's backends, the pins
and the policy commands share.

A read needs no settings and builds no tool: the dpkg status file is parsed (agent.guard.apt.backend), the rpm
database is asked once (``rpm -qa``, agent.guard.dnf.tool). With agent/guard/manager.py, the one other place that
knows both apt and dnf.
"""

from __future__ import annotations

from typing import Dict, Sequence

from agent.guard.apt.backend import DPKG_STATUS, read_dpkg_installed
from agent.guard.dnf.tool import read_rpm_installed
from agent.guard.rollback.backend import InstalledPackage
from agent.host import Host
from agent.hostfacts.rpmdb import rpm_database_files


def detect_manager(host: Host) -> str:
    """``dpkg`` or ``rpm``: which package database this host has (dpkg wins when both are present)."""
    if host.path(DPKG_STATUS).is_file():
        return "dpkg"
    if rpm_database_files(str(host.root)):
        return "rpm"
    return "dpkg"  # neither: the dpkg reader names the missing status file, as before rpm support


def read_installed(host: Host, patterns: Sequence[str]) -> Dict[str, InstalledPackage]:
    """Installed packages matching the globs, from the host's package database (dpkg status or rpm), keyed as the
    hook and the checkers key them (``name``, ``name:arch``, ``name@version`` for rpm install-only packages)."""
    if detect_manager(host) == "rpm":
        return read_rpm_installed(host, patterns)
    return read_dpkg_installed(host, patterns)
