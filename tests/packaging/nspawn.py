"""A Debian 12 root booted with systemd as PID 1 under systemd-nspawn, for the units' tests under real systemd.

The root is the guard tests' debootstrap base (tests/guard/apt/chroot/harness.py ``build_base``: one debootstrap
per test process, or the cached tarball outside CI) with systemd, systemd-sysv, dbus and procps installed on top, the
harness's local repository of fake GPU packages in place of the mirror.

Booting follows ../shared/reference/real-components.md: ``--register=no --keep-unit`` (this machine runs no
systemd or D-Bus of its own), ``--console=passive`` (no tty in CI); commands run inside through ``nsenter`` into
the container's PID 1. ``poweroff`` always waits for nspawn to exit and, if it does not, ends it by its PID (the
only process this module kills is the nspawn it started).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from tests.guard.apt.chroot.harness import Chroot, build_base

# procps: on every real Debian host (Priority: important) and a dependency of the gpuguard .deb (/bin/kill, the
# unit's ExecReload). Installed with the base, because its own postinst reloads systemd (update-rc.d), and the
# tests count the reloads of gpuguard's scripts only.
SYSTEMD_PACKAGES = ("systemd", "systemd-sysv", "dbus", "procps")
ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C", "LANG": "C",
       "DEBIAN_FRONTEND": "noninteractive", "SYSTEMD_PAGER": "", "SYSTEMD_COLORS": "0"}
NSENTER = ("nsenter", "-m", "-u", "-i", "-n", "-p", "-C")


def missing_tools() -> List[str]:
    return [tool for tool in ("systemd-nspawn", "nsenter", "debootstrap", "dpkg-deb", "apt-ftparchive", "chroot")
            if shutil.which(tool, path=ENV["PATH"]) is None]


def _host(argv: Sequence[str], timeout_seconds: float = 300, check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout_seconds, env=ENV,
                            stdin=subprocess.DEVNULL)
    if check and result.returncode != 0:
        raise AssertionError(f"{' '.join(argv)} exited {result.returncode}:\n{result.stdout[-3000:]}\n"
                             f"{result.stderr[-3000:]}")
    return result


def build_systemd_root(root: Path, work: Path, use_cache: bool) -> Dict[str, float]:
    """The shared debootstrap base plus systemd, the fake GPU package repository and procps; timings in seconds."""
    timings: Dict[str, float] = dict(build_base(root, use_cache=use_cache))
    started = time.monotonic()
    chroot = Chroot(root)
    chroot.mount()
    try:
        _host(["chroot", str(root), "apt-get", "update", "-q"], timeout_seconds=600)
        _host(["chroot", str(root), "apt-get", "install", "-y", "-q", "--no-install-recommends", *SYSTEMD_PACKAGES],
              timeout_seconds=600)
        chroot.build_repo(work)  # the local repository replaces the mirror in sources.list
    finally:
        chroot.unmount()
    left = chroot.mounts_inside()
    if left:
        raise AssertionError(f"mounts left inside the root: {left}")
    # No tty, no network configuration, no time sync in a test container: fewer units, a faster boot.
    for unit in ("getty@tty1.service", "console-getty.service", "systemd-networkd.service",
                 "systemd-timesyncd.service", "systemd-resolved.service"):
        _host(["systemctl", f"--root={root}", "mask", unit], check=False)
    timings["systemd_root_seconds"] = time.monotonic() - started
    return timings


class Container:
    """One boot of a root under systemd-nspawn; ``run`` executes a command inside (in PID 1's namespaces)."""

    def __init__(self, root: Path, name: str, log_path: Path) -> None:
        self.root = root
        self.name = name
        self.log_path = log_path
        self.nspawn: Optional[subprocess.Popen] = None
        self.leader: Optional[int] = None  # the container's PID 1 as this machine sees it

    # --- boot and power off ------------------------------------------------------------------------------------

    def boot(self, timeout_seconds: float = 60) -> None:
        with open(self.log_path, "ab") as log:
            self.nspawn = subprocess.Popen(
                ["systemd-nspawn", "-q", "-b", "-D", str(self.root), "--register=no", "--keep-unit",
                 f"--machine={self.name}", "--console=passive"],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=ENV, start_new_session=True)
        deadline = time.monotonic() + timeout_seconds
        while self.leader is None:
            self._check_alive()
            self.leader = self._find_leader()
            if self.leader is None:
                if time.monotonic() > deadline:
                    raise AssertionError(f"no systemd inside the container after {timeout_seconds} s:\n{self.log()}")
                time.sleep(0.1)
        state = ""
        while time.monotonic() < deadline:
            self._check_alive()
            state = self.run("systemctl", "is-system-running").stdout.strip()
            if state in ("running", "degraded"):
                return
            time.sleep(0.2)
        failed = self.run("systemctl", "--failed", "--no-legend").stdout
        raise AssertionError(f"the container did not finish booting ({state!r}); failed units:\n{failed}\n{self.log()}")

    def _check_alive(self) -> None:
        assert self.nspawn is not None
        if self.nspawn.poll() is not None:
            raise AssertionError(f"systemd-nspawn exited {self.nspawn.returncode}:\n{self.log()}")

    def _find_leader(self) -> Optional[int]:
        """PID of the ``systemd`` among nspawn's children and grandchildren (not nspawn's own helper child)."""
        assert self.nspawn is not None
        frontier = [self.nspawn.pid]
        for _ in range(2):
            children: List[int] = []
            for pid in frontier:
                try:
                    text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
                except OSError:
                    continue
                children.extend(int(c) for c in text.split())
            for child in children:
                if _comm(child) == "systemd":
                    return child
            frontier = children
        return None

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-4000:]
        except OSError:
            return ""

    def poweroff(self, timeout_seconds: float = 60) -> Optional[int]:
        """Power the container off and wait for nspawn to exit; end it (by its PID) if it will not. Its exit code."""
        if self.nspawn is None:
            return None
        if self.nspawn.poll() is None and self.leader is not None:
            self.run("systemctl", "poweroff", "--no-block", timeout_seconds=30)
        try:
            return self.nspawn.wait(timeout_seconds)
        except subprocess.TimeoutExpired:
            pass
        # nspawn turns SIGTERM into a poweroff of the container; SIGKILL is the last resort (its own PID only).
        for sig, wait_seconds in ((signal.SIGTERM, 30), (signal.SIGKILL, 30)):
            try:
                os.kill(self.nspawn.pid, sig)
            except ProcessLookupError:
                break
            try:
                return self.nspawn.wait(wait_seconds)
            except subprocess.TimeoutExpired:
                continue
        return self.nspawn.poll()

    # --- inside ------------------------------------------------------------------------------------------------

    def run(self, *argv: str, check: bool = False, timeout_seconds: float = 300,
            input_text: Optional[str] = None) -> subprocess.CompletedProcess:
        assert self.leader is not None, "not booted"
        result = subprocess.run([NSENTER[0], "-t", str(self.leader), *NSENTER[1:], "--", "env", "-i",
                                 *(f"{k}={v}" for k, v in ENV.items()), *argv],
                                capture_output=True, text=True, timeout=timeout_seconds, env=ENV,
                                input=input_text, stdin=None if input_text is not None else subprocess.DEVNULL)
        if check and result.returncode != 0:
            raise AssertionError(f"{' '.join(argv)} exited {result.returncode} in the container:\n"
                                 f"{result.stdout[-4000:]}\n{result.stderr[-4000:]}")
        return result

    def show(self, unit: str, *properties: str) -> Dict[str, str]:
        """``systemctl show -p ...`` as a dict."""
        out = self.run("systemctl", "show", unit, *(f"--property={p}" for p in properties), check=True).stdout
        return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)

    def host_pid(self, pid: int) -> int:
        """This machine's PID for the container's ``pid`` (from NSpid in /proc/*/status)."""
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                status = (entry / "status").read_text()
            except OSError:
                continue
            match = re.search(r"^NSpid:\s+(\d+)\s+(\d+)\s*$", status, re.MULTILINE)
            if match and int(match.group(2)) == pid and self._descends_from_leader(int(entry.name)):
                return int(entry.name)
        raise AssertionError(f"no process for container PID {pid}")

    def _descends_from_leader(self, pid: int) -> bool:
        for _ in range(32):
            if pid == self.leader:
                return True
            try:
                stat = Path(f"/proc/{pid}/stat").read_text()
            except OSError:
                return False
            pid = int(stat.rsplit(")", 1)[1].split()[1])
            if pid <= 1:
                return False
        return False

    def journal(self, *args: str) -> List[str]:
        """This boot's journal (messages only, flushed first), optionally filtered (``-u UNIT``, ``_PID=1``)."""
        self.run("journalctl", "--sync")
        return self.run("journalctl", "-b", "--no-pager", "-o", "cat", *args).stdout.splitlines()

    def mark(self) -> Counter:
        """The journal so far, for ``since``: a multiset of lines, not a cursor (the journal's files interleave,
        and ``--after-cursor`` was seen to skip entries written during an apt run)."""
        return Counter(self.journal())

    def since(self, mark: Counter, *args: str) -> List[str]:
        """Journal lines (with the filter ``args``) that were not there at ``mark``, in journal order."""
        seen = Counter(mark)
        out: List[str] = []
        for line in self.journal(*args):
            if seen[line] > 0:
                seen[line] -= 1
            else:
                out.append(line)
        return out

    def daemon_reloads(self, mark: Counter) -> int:
        """How many times systemd (PID 1) reloaded its units since ``mark``."""
        return sum(1 for line in self.since(mark, "_PID=1") if line.strip() == "Reloading.")


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""



def root_is_a_mount_point() -> bool:
    """Whether this process's ``/`` is a mount point. Inside a plain chroot (the fresh-debian12 tool's) it is not,
    and systemd-nspawn cannot boot there: "Failed to mount n/a on / (MS_REC|MS_SLAVE): Invalid argument", and
    from a bind mount of ``/`` in a new mount namespace the container's systemd stayed "offline". CI runs on the
    machine itself, where ``/`` is a mount point and these tests run."""
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        if len(fields) > 4 and fields[4] == "/":
            return True
    return False
