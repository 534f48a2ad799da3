"""The rpm database: where it lives, which files make it up, and the one ``rpm -qa`` row format gpuguard reads.

The database format itself is rpm's business (Berkeley DB, NDB or SQLite): gpuguard finds its files and asks rpm.
"""

from __future__ import annotations

import os

from agent.hostfacts.paths import under

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs milliseconds of the apt hook's start-up budget
    from typing import Iterator, List, Tuple

RPM_DB_DIRS = ("/var/lib/rpm", "/usr/lib/sysimage/rpm")
# name, [epoch:]version-release, arch, provides (comma-separated) per line
RPM_QUERY_FORMAT = "%{NAME}\\t%|EPOCH?{%{EPOCH}:}|%{VERSION}-%{RELEASE}\\t%{ARCH}\\t[%{PROVIDENAME},]\\n"


def rpm_database_files(root: str) -> List[str]:
    """Host paths of the rpm database's files (``rpmdb.sqlite*`` or the older ``Packages``), first directory found."""
    for directory in RPM_DB_DIRS:
        try:
            names = sorted(os.listdir(under(root, directory)))
        except OSError:
            continue
        files = [f"{directory}/{n}" for n in names if n.startswith(("rpmdb", "Packages"))]
        if files:
            return files
    return []


def rpm_query_argv(root: str) -> List[str]:
    """The argv that lists every installed package in RPM_QUERY_FORMAT."""
    return ["rpm", "--root", root, "-qa", "--qf", RPM_QUERY_FORMAT]


def parse_rpm_rows(text: str) -> Iterator[Tuple[str, str, str, Tuple[str, ...]]]:
    """(name, EVR, arch, provides) per row of ``rpm_query_argv``'s output (imported keys are gpg-pubkey rows)."""
    for line in text.splitlines():
        fields = line.split("\t")
        if len(fields) < 3 or not fields[0]:
            continue
        provides = tuple(p for p in (fields[3] if len(fields) > 3 else "").split(",") if p)
        yield fields[0], fields[1], fields[2], provides
