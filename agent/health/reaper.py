"""The probe's supervisor: whatever the probe starts ends with it, sessions included (standalone, stdlib only).

    python3 -I -S reaper.py [--uid U --gid G --groups G1,G2] [--no-pid-namespace] -- ARGV...

launch.py starts this with the agent's own interpreter (as root when the agent is root) in place of the probe; it
starts ARGV in a child as the given user and waits. A process group does not hold the probe's tree: a grandchild
that calls setsid() leaves it, and one that also closes its pipes outlives every kill the launcher can aim. So:

1. **A PID namespace** where this process may make one (CAP_SYS_ADMIN: the agent as root). The probe is the
   namespace's first process; when it exits, or is killed, the kernel kills every process in the namespace, and no
   process can leave a PID namespace. The probe also gets PR_SET_PDEATHSIG=SIGKILL (set after the drop, which would
   clear it), so a killed supervisor takes the namespace with it.
2. Else **a child subreaper** (PR_SET_CHILD_SUBREAPER, no privilege needed): an orphan anywhere below is re-parented
   to this process, not to init, so after the probe exits every process left below is killed and reaped. Its limit:
   the probe must not be able to kill this process, which holds when it dropped to another user (the agent is
   root); a non-root agent runs the probe as itself and gets the same sweep but no such guarantee.

A cgroup would hold the tree as well, but the agent gets a writable one only with a delegated cgroup v2 subtree
(sandbox.py uses one for memory.max when it can); this works under any systemd unit and in containers.

On SIGTERM (the launcher's timeout) the probe and everything below it is killed before this process exits. It exits
as the probe did: the same code, or the same signal. When ARGV cannot be started it prints ``START_ERROR_MARKER``,
the reason and the errno's text on stderr and exits 127.
"""

from __future__ import annotations

import ctypes
import errno
import os
import signal
import sys
import time
from typing import List, Optional, Sequence, Tuple

START_ERROR_MARKER = "GPUGUARD_REAPER_START_ERROR"
_CLONE_NEWPID = 0x20000000
_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36
# How long the sweep may take: a process stuck in the kernel (a hung GPU call) can take a while to die.
SWEEP_SECONDS = 10.0

_libc: Optional[ctypes.CDLL] = None


def _call(name: str, *args: int) -> bool:
    """A libc call that returns 0 on success; False (errno kept) when it failed or does not exist."""
    global _libc
    try:
        if _libc is None:
            _libc = ctypes.CDLL(None, use_errno=True)
        return int(getattr(_libc, name)(*[ctypes.c_ulong(a) for a in args])) == 0
    except (OSError, AttributeError):
        return False


def contain(pid_namespace: bool = True) -> str:
    """Make this process's next child the first of a new PID namespace, else a subreaper: which one it got."""
    if pid_namespace and _call("unshare", _CLONE_NEWPID):
        return "pid-namespace"
    if _call("prctl", _PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0):
        return "subreaper"
    return "process-group"


def children(pid: int) -> List[int]:
    """The live children of ``pid`` (from /proc/PID/task/*/children, else every /proc/N/stat)."""
    found: List[int] = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as handle:
                found.extend(int(p) for p in handle.read().split())
        return found
    except OSError:
        pass
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as handle:
                    fields = handle.read().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            if int(fields[1]) == pid:
                found.append(int(name))
    return found


def sweep(deadline_seconds: float = SWEEP_SECONDS) -> int:
    """Kill and reap every process below this one until none is left (orphans come here as they appear)."""
    me = os.getpid()
    killed = 0
    deadline = time.monotonic() + deadline_seconds
    while time.monotonic() < deadline:
        for pid in children(me):
            try:
                os.kill(pid, signal.SIGKILL)
                killed += 1
            except ProcessLookupError:
                pass
        try:
            while os.waitpid(-1, os.WNOHANG)[0] > 0:
                pass
        except ChildProcessError:
            return killed
        time.sleep(0.01)
    sys.stderr.write("gpuguard: processes of the probe still alive %.0f s after the kill\n" % deadline_seconds)
    return killed


def _drop(uid: Optional[int], gid: Optional[int], groups: Optional[List[int]]) -> None:
    if groups is not None:
        os.setgroups(groups)
    if gid is not None:
        os.setresgid(gid, gid, gid)
    if uid is not None:
        os.setresuid(uid, uid, uid)


def _start_child(argv: Sequence[str], uid: Optional[int], gid: Optional[int], groups: Optional[List[int]],
                 mode: str) -> int:
    """Fork, drop to the user, exec ``argv``; in the child an exec failure is reported and exits 127."""
    parent = os.getpid()
    pid = os.fork()
    if pid:
        return pid
    try:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)
        _drop(uid, gid, groups)
        _call("prctl", _PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        # The supervisor died before the line above (in a PID namespace the parent is outside it: pid 0).
        if mode != "pid-namespace" and os.getppid() != parent:
            os._exit(137)
        os.execvp(argv[0], list(argv))
    except OSError as exc:
        what = "not-found" if exc.errno == errno.ENOENT else "not-executable"
        os.write(2, ("%s %s %s\n" % (START_ERROR_MARKER, what, exc.strerror)).encode())
    finally:
        os._exit(127)


def parse_args(args: Sequence[str]) -> Tuple[Optional[int], Optional[int], Optional[List[int]], bool, List[str]]:
    """(uid, gid, groups, PID namespace?, argv) from ``[--uid U] [--gid G] [--groups A,B] [--no-pid-namespace] --
    ARGV...``."""
    uid = gid = None
    groups: Optional[List[int]] = None
    pid_namespace = True
    rest = list(args)
    while rest and rest[0] != "--":
        if rest[0] == "--no-pid-namespace":
            pid_namespace, rest = False, rest[1:]
            continue
        if len(rest) < 2:
            raise SystemExit("gpuguard reaper: %s needs a value" % rest[0])
        flag, value = rest[0], rest[1]
        if flag == "--uid":
            uid = int(value)
        elif flag == "--gid":
            gid = int(value)
        elif flag == "--groups":
            groups = [int(g) for g in value.split(",") if g]
        else:
            raise SystemExit("gpuguard reaper: unknown option %s" % flag)
        rest = rest[2:]
    if not rest[1:]:
        raise SystemExit("gpuguard reaper: no command after --")
    return uid, gid, groups, pid_namespace, rest[1:]


def main(args: Sequence[str]) -> int:
    uid, gid, groups, pid_namespace, argv = parse_args(args)
    mode = contain(pid_namespace)
    child = _start_child(argv, uid, gid, groups, mode)
    stopping: List[int] = []

    def stop(signum: int, frame: object) -> None:
        stopping.append(signum)
        try:
            os.kill(child, signal.SIGKILL)
        except ProcessLookupError:
            pass

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, stop)
    while True:
        try:
            _, status = os.waitpid(child, 0)
            break
        except InterruptedError:  # pragma: no cover - PEP 475 retries; kept for older interpreters
            continue
    sweep()
    if os.WIFSIGNALED(status):
        signum = os.WTERMSIG(status)
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        return 128 + signum
    return os.WEXITSTATUS(status)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
