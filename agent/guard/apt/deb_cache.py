"""Keep the .deb files of the last known-good set, so a rollback works after the repository dropped them.

Files are named like apt names them (``name_version_arch.deb`` with the epoch colon as ``%3a``). They are copied
from apt's archive cache when apt downloaded them there, otherwise fetched with ``apt-get download`` (which also
copies from ``file:`` repositories) while the version is still in an index.
"""

from __future__ import annotations

import shutil
from typing import List, Optional, Tuple

from agent.errors import CommandError
from agent.guard.apt.tool import AptTool
from agent.host import Host
from agent.log import get_logger

log = get_logger("guard.deb_cache")
APT_ARCHIVES = "/var/cache/apt/archives"


def deb_file_name(name: str, version: str, arch: str) -> str:
    """The file name apt gives a package (``amdgpu-dkms_1%3a6.8.5..._all.deb``)."""
    return f"{name}_{version.replace(':', '%3a')}_{arch or 'all'}.deb"


def parse_deb_file_name(file_name: str) -> Tuple[str, str, str]:
    """(name, version, arch) of a ``name_version_arch.deb`` file name, as :func:`deb_file_name` writes it."""
    name, version, arch = file_name[:-len(".deb")].split("_", 2)
    return name, version.replace("%3a", ":"), arch


class DebCache:
    """The directory of kept .deb files (a host path under the Host's root)."""

    def __init__(self, host: Host, directory: str, tool: AptTool) -> None:
        self.host = host
        self.directory = directory
        self.tool = tool

    def path(self, name: str, version: str, arch: str) -> str:
        """Host path of a package's cached .deb (whether or not it exists)."""
        return f"{self.directory.rstrip('/')}/{deb_file_name(name, version, arch)}"

    def has(self, name: str, version: str, arch: str) -> bool:
        return self.host.path(self.path(name, version, arch)).is_file()

    def ensure(self, name: str, version: str, arch: str) -> Optional[str]:
        """Make sure the .deb is cached; its host path, or None when it cannot be had (logged)."""
        target = self.path(name, version, arch)
        if self.host.path(target).is_file():
            return target
        self.host.path(self.directory).mkdir(parents=True, exist_ok=True)
        for candidate_arch in dict.fromkeys([arch, "all"]):
            archived = self.host.path(f"{APT_ARCHIVES}/{deb_file_name(name, version, candidate_arch)}")
            if archived.is_file():
                shutil.copy2(archived, self.host.path(target))
                return target
        try:
            self.tool.download(name, version, self.directory).check()
        except CommandError as exc:
            log.warning("deb_cache_miss", package=name, version=version, error=str(exc))
            return None
        return target if self.host.path(target).is_file() else None

    def prune(self, keep: List[str]) -> List[str]:
        """Delete cached files not in ``keep`` (host paths); returns what was deleted."""
        keep_names = {k.rsplit("/", 1)[-1] for k in keep}
        removed = []
        for name in self.host.list_dir(self.directory):
            if name.endswith(".deb") and name not in keep_names:
                self.host.path(f"{self.directory}/{name}").unlink()
                removed.append(name)
        return removed
