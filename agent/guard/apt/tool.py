"""apt and dpkg as commands, for rollback and pins: plan (``apt-get -s``), install, download, list versions.

Commands run through the Host seam (argv lists, timeouts); for a Host whose root is not ``/`` (a chroot) they
run inside it with ``chroot ROOT``. Waiting for the dpkg lock uses the same POSIX record locks dpkg and apt use.
"""

from __future__ import annotations

import re
import time
from typing import Callable, Dict, List, Sequence, Tuple

from agent.guard.locks import record_lock_is_free, wait_for_locks
from agent.guard.rollback.backend import PlannedStep
from agent.host import CommandResult, Host

# apt-get -s prints "Inst name [old] (new source [arch])", "Remv name [old]", "Conf name (new ...)".
_SIM_LINE = re.compile(r"^(Inst|Remv) (\S+)(?: \[([^\]]+)\])?(?: \((\S+))?")
LOCK_FILES = ("/var/lib/dpkg/lock-frontend", "/var/lib/dpkg/lock")


def parse_simulation(text: str) -> List[PlannedStep]:
    """The Inst/Remv lines of ``apt-get -s`` output."""
    steps = []
    for line in text.splitlines():
        match = _SIM_LINE.match(line)
        if match:
            kind, name, old, new = match.groups()
            steps.append(PlannedStep("install" if kind == "Inst" else "remove", name, old or "", new or ""))
    return steps


class AptTool:
    """apt-get/apt-cache/dpkg for one Host."""

    manager = "dpkg"

    def __init__(self, host: Host, timeout_seconds: float = 900.0, lock_timeout_seconds: float = 300.0,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.host = host
        self.timeout_seconds = timeout_seconds
        self.lock_timeout_seconds = lock_timeout_seconds
        self.sleep = sleep

    def argv(self, *args: str) -> List[str]:
        """The argv to run a command on this host (inside the chroot when the root is not /)."""
        inner = ["env", "DEBIAN_FRONTEND=noninteractive", *args]
        return inner if self.host.is_live else ["chroot", str(self.host.root), *inner]

    def _run(self, args: Sequence[str], timeout_seconds: float) -> CommandResult:
        return self.host.run(self.argv(*args), timeout_seconds=timeout_seconds)

    def _apt_options(self) -> List[str]:
        # A rollback never prompts and never overwrites an operator's edit of a conffile: the old package's
        # version of the file is taken only where the operator left the file as it was (dpkg's confdef).
        return ["-o", f"DPkg::Lock::Timeout={int(self.lock_timeout_seconds)}", "-o", "Dpkg::Use-Pty=0",
                "-o", "Dpkg::Options::=--force-confdef", "-o", "Dpkg::Options::=--force-confold"]

    @staticmethod
    def _source_options(local_only: bool) -> List[str]:
        # No repositories at all: apt sees the installed set and the .deb files named on the command line only.
        # Otherwise, when an index still lists the same version (stale lists, a mirror that lost the file, a host
        # with no network), apt prefers the signed repository copy and fails with "Unable to fetch some
        # archives" (seen with apt 2.8 on Ubuntu 24.04) although the kept file is right there.
        return ["-o", "Dir::Etc::SourceList=/dev/null", "-o", "Dir::Etc::SourceParts=/dev/null"] if local_only else []

    def simulate(self, targets: Sequence[str], local_only: bool = False) -> Tuple[CommandResult, List[PlannedStep]]:
        """``apt-get -s install --allow-downgrades TARGETS``: what a rollback would do (nothing is changed)."""
        result = self._run(["apt-get", "-s", "-y", "--allow-downgrades", "--allow-change-held-packages",
                            *self._apt_options(), *self._source_options(local_only), "install", *targets], 120.0)
        return result, parse_simulation(result.stdout)

    def install(self, targets: Sequence[str], local_only: bool = False) -> CommandResult:
        """Run the rollback for real; the apt hook still checks it."""
        return self._run(["apt-get", "-y", "-q", "--allow-downgrades", "--allow-change-held-packages",
                          "--no-install-recommends", *self._apt_options(), *self._source_options(local_only),
                          "install", *targets], self.timeout_seconds)

    def dpkg_install(self, debs: Sequence[str]) -> CommandResult:
        """``dpkg -i DEBS`` in one run (dpkg unpacks them all, then configures): the exact set, no resolver."""
        return self._run(["dpkg", "--force-downgrade", "--force-confdef", "--force-confold", "-i", *debs],
                         self.timeout_seconds)

    def dpkg_remove(self, names: Sequence[str], force_depends: bool = False) -> CommandResult:
        """``dpkg -r NAMES`` (with ``--force-depends`` when what depends on them is about to be reinstalled)."""
        return self._run(["dpkg", *(["--force-depends"] if force_depends else []), "-r", *names],
                         self.timeout_seconds)

    def audit(self) -> CommandResult:
        """``dpkg --audit``: packages half-installed, half-configured or unpacked (no output when clean)."""
        return self._run(["dpkg", "--audit"], 120.0)

    def check(self) -> CommandResult:
        """``apt-get check``: exit 0 only when every installed package's dependencies are met.

        Without apt's binary caches: right after a ``dpkg -i`` in the same second that leaves the status file at
        the same size, apt took its cache built before the change for current and reported the old state.
        """
        return self._run(["apt-get", "-q", "-o", "Dir::Cache::pkgcache=", "-o", "Dir::Cache::srcpkgcache=", "check"],
                         120.0)

    def configure_pending(self) -> CommandResult:
        """``dpkg --configure -a``: never leave packages half-configured after a failed run."""
        return self._run(["dpkg", "--configure", "-a"], self.timeout_seconds)

    def download(self, name: str, version: str, dest_dir: str) -> CommandResult:
        """``apt-get download name=version`` into ``dest_dir`` (a host path)."""
        return self.host.run(self._download_argv(name, version, dest_dir), timeout_seconds=300.0)

    def _download_argv(self, name: str, version: str, dest_dir: str) -> List[str]:
        inner = ["env", f"--chdir={dest_dir}", "apt-get", "download", "-q", f"{name}={version}"]
        return inner if self.host.is_live else ["chroot", str(self.host.root), *inner]

    def available_versions(self, names: Sequence[str]) -> Dict[str, List[str]]:
        """Versions the package indexes offer, per name (``apt-cache madison``)."""
        if not names:
            return {}
        result = self._run(["apt-cache", "madison", *names], 60.0)
        out: Dict[str, List[str]] = {}
        for line in result.stdout.splitlines():
            parts = [p.strip() for p in line.split("|")]
            if len(parts) >= 3 and parts[0] and parts[1]:
                versions = out.setdefault(parts[0], [])
                if parts[1] not in versions:
                    versions.append(parts[1])
        return out

    def package_names(self, prefix: str) -> List[str]:
        """Package names known to the indexes that start with ``prefix`` (``apt-cache pkgnames``)."""
        result = self._run(["apt-cache", "pkgnames", prefix], 60.0)
        return sorted(set(result.stdout.split()))

    def wait_for_dpkg_lock(self) -> float:
        """Wait until nobody holds dpkg's locks; returns the seconds waited, CommandTimeout after the limit."""
        return wait_for_locks(self.host, [(p, record_lock_is_free) for p in LOCK_FILES], self.lock_timeout_seconds,
                              self.sleep)
