"""Keep the .rpm files of the last known-good set, so a rollback works after the repository dropped them.

Files are named as rpmbuild and repositories name them (``name-version-release.arch.rpm``, no epoch). They come,
in this order, from dnf's package cache under the host root (``keepcache``), from ``dnf download --destdir``
while the build is still in a repository, or by copying the file a ``file://`` repository serves
(``dnf repoquery --location``), which needs no download plugin, and otherwise are rebuilt from what rpm has
installed (agent.guard.dnf.rpm_rebuild).
"""

from __future__ import annotations

import shutil
from typing import Optional, Union
from urllib.parse import unquote, urlparse

from agent.errors import CommandError
from agent.guard.dnf.rpm_rebuild import RpmRebuilder
from agent.guard.dnf.tool import DnfTool, nevra, rpm_file_name
from agent.guard.rollback.kept import KeptFile, Manifest, PendingRebuild
from agent.host import Host
from agent.log import get_logger

log = get_logger("guard.rpm_cache")
DNF_CACHE_DIRS = ("/var/cache/dnf", "/var/cache/libdnf5", "/var/cache/yum")


class RpmCache:
    """The directory of kept .rpm files (a host path under the Host's root)."""

    def __init__(self, host: Host, directory: str, tool: DnfTool) -> None:
        self.host = host
        self.directory = directory
        self.tool = tool

    def path(self, name: str, version: str, arch: str) -> str:
        """Host path of a build's cached .rpm (whether or not it exists)."""
        return f"{self.directory.rstrip('/')}/{rpm_file_name(name, version, arch)}"

    def has(self, name: str, version: str, arch: str) -> bool:
        return self.host.path(self.path(name, version, arch)).is_file()

    def _from_dnf_cache(self, file_name: str) -> Optional[str]:
        for cache_dir in DNF_CACHE_DIRS:
            for candidate in self.host.walk_files(cache_dir):
                if candidate.rsplit("/", 1)[-1] == file_name:
                    return candidate
        return None

    def ensure(self, name: str, version: str, arch: str, manifest: Manifest) -> KeptFile:
        """Make sure the .rpm is kept; a miss is logged the first time for a package version, not on every check."""
        found = self.find(name, version, arch, manifest)
        return found.run(self.host, manifest) if isinstance(found, PendingRebuild) else found

    def find(self, name: str, version: str, arch: str, manifest: Manifest) -> Union[KeptFile, PendingRebuild]:
        """The kept .rpm when it is kept already (never rebuilt again), cached or offered by a repository; else the
        rebuild from the installed files it takes."""
        target = self.path(name, version, arch)
        real = self.host.path(target)
        if real.is_file():
            return manifest.known(target)
        found = self._fetch(name, version, arch, target)
        if found is not None:
            manifest.remember(found)
            return found
        return PendingRebuild((name, version, arch), target,
                              lambda: RpmRebuilder(self.host, self.tool.rpm_argv()).rebuild(nevra(name, version, arch),
                                                                                          target),
                              "no dnf cache or configured repository offers it", "rpm")

    def _fetch(self, name: str, version: str, arch: str, target: str) -> Optional[KeptFile]:
        real = self.host.path(target)
        real.parent.mkdir(parents=True, exist_ok=True)
        cached = self._from_dnf_cache(real.name)
        if cached is not None:
            shutil.copy2(self.host.path(cached), real)
            return KeptFile(target, "archive cache")
        try:
            self.tool.download(name, version, arch, self.directory).check()
        except CommandError as exc:
            log.debug("rpm_download_failed", package=name, version=version, error=str(exc))
        if real.is_file():
            return KeptFile(target, "repository")
        url = self.tool.location(name, version, arch)
        if url and urlparse(url).scheme == "file":
            source = unquote(urlparse(url).path)
            try:
                shutil.copy2(source, real)
                return KeptFile(target, "repository")
            except OSError as exc:
                log.warning("rpm_cache_copy_failed", package=name, source=source, error=exc.strerror or str(exc))
        return None
