"""Keep the .deb files of the last known-good set, so a rollback works after the repository dropped them.

Files are named like apt names them (``name_version_arch.deb`` with the epoch colon as ``%3a``). They are copied
from apt's archive cache when apt downloaded them there, otherwise fetched with ``apt-get download`` (which also
copies from ``file:`` repositories) while the version is still in an index, otherwise rebuilt from what dpkg has
installed (agent.guard.apt.deb_rebuild). Where each came from is kept in the directory's manifest
(agent.guard.rollback.kept).
"""

from __future__ import annotations

import shutil
from typing import Tuple, Union

from agent.errors import CommandError
from agent.guard.apt.deb_rebuild import DPKG_STATUS, DebRebuilder, find_stanza, installed_size_bytes
from agent.guard.apt.tool import AptTool
from agent.guard.rollback.kept import KeptFile, Manifest, PendingRebuild
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

    def ensure(self, name: str, version: str, arch: str, manifest: Manifest) -> KeptFile:
        """Make sure the .deb is kept: from the archive cache, a repository, or rebuilt from the installed files.

        A miss (none of the three) is logged the first time for a package version, not on every check.
        """
        found = self.find(name, version, arch, manifest)
        return found.run(self.host, manifest) if isinstance(found, PendingRebuild) else found

    def find(self, name: str, version: str, arch: str, manifest: Manifest) -> Union[KeptFile, PendingRebuild]:
        """The kept .deb when it is kept already (never rebuilt again), in the archive cache or offered by a
        repository; else the rebuild from the installed files it takes."""
        target = self.path(name, version, arch)
        if self.host.path(target).is_file():
            return manifest.known(target)
        self.host.path(self.directory).mkdir(parents=True, exist_ok=True)
        for candidate_arch in dict.fromkeys([arch, "all"]):
            archived = self.host.path(f"{APT_ARCHIVES}/{deb_file_name(name, version, candidate_arch)}")
            if archived.is_file():
                shutil.copy2(archived, self.host.path(target))
                return self._kept(manifest, KeptFile(target, "archive cache"))
        try:
            self.tool.download(name, version, self.directory).check()
            if self.host.path(target).is_file():
                return self._kept(manifest, KeptFile(target, "repository"))
            download_error = "apt-get download wrote no file"
        except CommandError as exc:
            download_error = str(exc)
        stanza = find_stanza(self.host.read_text(DPKG_STATUS) or "", name, arch, version)
        return PendingRebuild((name, version, arch), target,
                              lambda: DebRebuilder(self.host).rebuild(name, version, arch, target),
                              f"no repository offers it ({download_error})", "dpkg",
                              installed_size_bytes(stanza) if stanza else 0)

    @staticmethod
    def _kept(manifest: Manifest, kept: KeptFile) -> KeptFile:
        manifest.remember(kept)
        return kept
