"""Python distributions installed outside the package manager (pip) in the system's site directories.

The amdsmi binding from PyPI (``amdsmi-7.0.2.dist-info``) loads whatever ``libamd_smi.so`` the host has; a binding of
another ROCm release fails at ``import amdsmi``. Only the directories every system interpreter reads are looked at
(dpkg's ``dist-packages`` and pip's ``/usr/local`` ones on Debian and Ubuntu, ``site-packages`` under ``/usr/lib``,
``/usr/lib64`` and ``/usr/local`` on rpm hosts), not virtual environments. Standard library only (the apt hook
reads it through the host context when a policy judges the amdsmi pairing).
"""

from __future__ import annotations

import posix

from agent.hostfacts.paths import under

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs milliseconds of the apt hook's start-up budget
    from typing import List, Optional, Tuple

_BASES = ("/usr/lib", "/usr/lib64", "/usr/local/lib", "/usr/local/lib64")
_SUFFIXES = (".dist-info", ".egg-info")


def site_directories(root: str) -> List[str]:
    """The system interpreters' site directories that exist under ``root`` (host paths), sorted."""
    found = []
    for base in _BASES:
        try:
            names = posix.listdir(under(root, base))
        except OSError:
            continue
        for name in names:
            if name == "python3" or (name.startswith("python3.") and name[8:].isdecimal()):
                for leaf in ("dist-packages", "site-packages"):
                    path = f"{base}/{name}/{leaf}"
                    try:
                        posix.stat(under(root, path))
                    except OSError:
                        continue
                    found.append(path)
    return sorted(found)


def parse_dist_name(entry: str) -> Optional[Tuple[str, str]]:
    """(normalised project name, version) of a ``NAME-VERSION.dist-info`` or ``.egg-info`` entry, else None."""
    for suffix in _SUFFIXES:
        if entry.endswith(suffix):
            stem = entry[: -len(suffix)]
            name, sep, version = stem.partition("-")
            if sep and version and version[0].isdigit():
                version = version.split("-py", 1)[0]  # egg-info: amdsmi-6.2.0-py3.12.egg-info
                return name.lower().replace("-", "_").replace(".", "_"), version
    return None


def find_distribution(root: str, project: str) -> Optional[Tuple[str, str]]:
    """(version, site directory) of the first ``project`` found in the system site directories, else None."""
    wanted = project.lower().replace("-", "_")
    for directory in site_directories(root):
        try:
            entries = sorted(posix.listdir(under(root, directory)))
        except OSError:
            continue
        for entry in entries:
            parsed = parse_dist_name(entry)
            if parsed is not None and parsed[0] == wanted:
                return parsed[1], directory
    return None
