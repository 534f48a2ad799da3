"""The probe's supervisor: whatever the probe starts ends with it, sessions included (standalone, stdlib only).

    python3 -I -S reaper.py [--uid U --gid G --groups G1,G2] [--no-pid-namespace]
                            [--home DIR --home-max-bytes N --hide DIR] [--report-fd FD] -- ARGV...

launch.py starts this with the agent's own interpreter (as root when the agent is root) in place of the probe; it
starts ARGV in a child as the given user and waits. A process group does not hold the probe's tree: a grandchild
that calls setsid() leaves it, and one that also closes its pipes outlives every kill the launcher can aim. So:

1. **A PID namespace** where this process may make one (CAP_SYS_ADMIN: the agent as root). Its first process (its
   init) is a fork of this one, still the agent's user: it mounts the namespace's own /proc in a mount namespace of
   its own, starts the probe, reaps whatever is orphaned in the namespace, and exits when the probe does; the kernel
   then kills every process left in the namespace, and no process can leave a PID namespace. The /proc is needed:
   with the host's, the probe's PIDs do not match what it reads there, and CUDA's initialisation fails (torch sees
   no GPU: seen on the H200, docs/hardware.md). Where no private mount namespace can be made, no PID namespace is
   made either: the subreaper below. The probe is not the init itself, so signals and exits work for it as anywhere
   (an init ignores the signals it has no handler for), and it cannot signal an init that kept root. The init has
   PR_SET_PDEATHSIG=SIGKILL, so a killed supervisor takes the namespace with it.
2. Else **a child subreaper** (PR_SET_CHILD_SUBREAPER, no privilege needed): an orphan anywhere below is re-parented
   to this process, not to init, so after the probe exits every process left below is killed and reaped. Its limit:
   the probe must not be able to kill this process, which holds when it dropped to another user (the agent is
   root); a non-root agent runs the probe as itself and gets the same sweep but no such guarantee.

A cgroup would hold the tree as well, but the agent gets a writable one only with a delegated cgroup v2 subtree
(sandbox.py uses one for memory.max when it can); this works under any systemd unit and in containers.

In a PID namespace the init also gives the probe a home with nothing to keep: a tmpfs of ``--home-max-bytes`` on
``--home`` (the fresh per-run directory the agent made, owned by the probe's user; the probe starts there), and an
empty read-only tmpfs over each ``--hide`` directory (the probe user's own home, which would outlive the run). On
``--report-fd`` it says what it got, one ``key value`` line each (``containment pid-namespace``, ``home tmpfs N``,
``home directory <why>``), then closes it; the probe never inherits that descriptor.

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
_CLONE_NEWNS = 0x00020000
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC, _MS_REC, _MS_PRIVATE = 1, 2, 4, 8, 16384, 1 << 18
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


def _mount(source: Optional[str], target: str, fstype: Optional[str], flags: int,
           data: Optional[str] = None) -> bool:
    """mount(2); False (errno kept) when it failed."""
    global _libc
    try:
        if _libc is None:
            _libc = ctypes.CDLL(None, use_errno=True)
        encode = (lambda text: None if text is None else text.encode())  # noqa: E731 - four arguments
        return int(_libc.mount(encode(source), target.encode(), encode(fstype), ctypes.c_ulong(flags),
                               encode(data))) == 0
    except (OSError, AttributeError):
        return False


def _private_mounts() -> bool:
    """This process in a mount namespace of its own whose mounts propagate nowhere (so a /proc mounted below it
    stays there); False when it cannot have one (no CAP_SYS_ADMIN, seccomp)."""
    return _call("unshare", _CLONE_NEWNS) and _mount(None, "/", None, _MS_REC | _MS_PRIVATE)


def contain(pid_namespace: bool = True) -> str:
    """Make this process's next child the first of a new PID namespace (with mounts of its own, for its /proc),
    else a subreaper: which one it got."""
    if pid_namespace and _private_mounts() and _call("unshare", _CLONE_NEWPID):
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


class Options:
    """What the command line asked for (parse_args)."""

    def __init__(self) -> None:
        self.uid: Optional[int] = None
        self.gid: Optional[int] = None
        self.groups: Optional[List[int]] = None
        self.pid_namespace = True
        self.home: Optional[str] = None
        self.home_max_bytes = 0
        self.hide: List[str] = []
        self.report_fd: Optional[int] = None
        self.argv: List[str] = []


def report(options: Options, key: str, value: str) -> None:
    """One ``key value`` line on the report descriptor (nothing when there is none)."""
    if options.report_fd is not None:
        try:
            os.write(options.report_fd, ("%s %s\n" % (key, value.replace("\n", " "))).encode())
        except OSError:
            pass


def _close_report(options: Options) -> None:
    if options.report_fd is not None:
        try:
            os.close(options.report_fd)
        except OSError:
            pass
        options.report_fd = None


def _private_home(options: Options) -> None:
    """In the namespace's own mounts: a size-limited tmpfs on the probe's home, the user's own home hidden under an
    empty read-only one, and the home as the working directory. Refused (no tmpfs here), the home stays a plain
    directory whose size the agent checks, and the report says why."""
    if options.home is None:
        return
    owner = "" if options.uid is None else ",uid=%d,gid=%d" % (options.uid, options.gid or 0)
    if _mount("gpuguard-probe-run", options.home, "tmpfs", _MS_NOSUID | _MS_NODEV,
              "size=%d,mode=0700%s" % (options.home_max_bytes, owner)):
        report(options, "home", "tmpfs %d" % options.home_max_bytes)
    else:
        report(options, "home", "directory (tmpfs refused: %s)" % os.strerror(ctypes.get_errno() or errno.EPERM))
    for path in options.hide:
        if not _mount("gpuguard-probe-hidden", path, "tmpfs", _MS_RDONLY | _MS_NOSUID | _MS_NODEV | _MS_NOEXEC,
                      "size=4k,mode=0555"):
            report(options, "hide", "%s refused: %s" % (path, os.strerror(ctypes.get_errno() or errno.EPERM)))
    os.chdir(options.home)  # the directory below the tmpfs is not where the probe starts


def _drop(uid: Optional[int], gid: Optional[int], groups: Optional[List[int]]) -> None:
    if groups is not None:
        os.setgroups(groups)
    if gid is not None:
        os.setresgid(gid, gid, gid)
    if uid is not None:
        os.setresuid(uid, uid, uid)


def _exec_probe(argv: Sequence[str], uid: Optional[int], gid: Optional[int], groups: Optional[List[int]],
                parent: int) -> None:
    """In a fresh child: default signals, drop to the user, exec ``argv``; an exec failure is reported, exit 127."""
    try:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)
        _drop(uid, gid, groups)
        _call("prctl", _PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)  # after the drop, which clears it
        if os.getppid() != parent:  # the parent died before the line above
            os._exit(137)
        os.execvp(argv[0], list(argv))
    except OSError as exc:
        what = "not-found" if exc.errno == errno.ENOENT else "not-executable"
        os.write(2, ("%s %s %s\n" % (START_ERROR_MARKER, what, exc.strerror)).encode())
    finally:
        os._exit(127)


def _namespace_init(options: Options, status_fd: int) -> None:
    """PID 1 of the new namespace: mount its /proc, start the probe, reap every orphan, write the probe's wait
    status, exit. A /proc that cannot be mounted is a start error: the probe would misjudge the GPUs without it."""
    try:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)
        _call("prctl", _PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        # Its own mount namespace again (the supervisor's keeps the host's /proc, which its sweep reads).
        if not (_private_mounts() and _mount("proc", "/proc", "proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC)):
            reason = os.strerror(ctypes.get_errno() or errno.EPERM)
            os.write(2, ("%s no-proc %s\n" % (START_ERROR_MARKER, reason)).encode())
            os._exit(127)
        _private_home(options)
        _close_report(options)
        me = os.getpid()
        probe = os.fork()
        if probe == 0:
            _exec_probe(options.argv, options.uid, options.gid, options.groups, me)
        while True:
            pid, status = os.wait()
            if pid == probe:
                os.write(status_fd, b"%d\n" % status)
                break
    finally:
        os._exit(0)  # the kernel now kills everything left in the namespace


def _start_child(options: Options, mode: str) -> Tuple[int, Optional[int]]:
    """(the child to wait for, the pipe its probe's wait status comes through in a PID namespace, else None)."""
    parent = os.getpid()
    read_fd: Optional[int] = None
    if mode == "pid-namespace":
        read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        if read_fd is None:
            _exec_probe(options.argv, options.uid, options.gid, options.groups, parent)
        else:
            os.close(read_fd)
            _namespace_init(options, write_fd)
    if read_fd is not None:
        os.close(write_fd)
    return pid, read_fd


def parse_args(args: Sequence[str]) -> Options:
    """The options of ``[--uid U] [--gid G] [--groups A,B] [--no-pid-namespace] [--home DIR --home-max-bytes N]
    [--hide DIR] [--report-fd FD] -- ARGV...``."""
    options = Options()
    rest = list(args)
    while rest and rest[0] != "--":
        if rest[0] == "--no-pid-namespace":
            options.pid_namespace, rest = False, rest[1:]
            continue
        if len(rest) < 2:
            raise SystemExit("gpuguard reaper: %s needs a value" % rest[0])
        flag, value = rest[0], rest[1]
        if flag == "--uid":
            options.uid = int(value)
        elif flag == "--gid":
            options.gid = int(value)
        elif flag == "--groups":
            options.groups = [int(g) for g in value.split(",") if g]
        elif flag == "--home":
            options.home = value
        elif flag == "--home-max-bytes":
            options.home_max_bytes = int(value)
        elif flag == "--hide":
            options.hide.append(value)
        elif flag == "--report-fd":
            options.report_fd = int(value)
        else:
            raise SystemExit("gpuguard reaper: unknown option %s" % flag)
        rest = rest[2:]
    if not rest[1:]:
        raise SystemExit("gpuguard reaper: no command after --")
    options.argv = rest[1:]
    return options


def main(args: Sequence[str]) -> int:
    options = parse_args(args)
    if options.report_fd is not None:
        os.set_inheritable(options.report_fd, False)  # the probe's exec closes it
    mode = contain(options.pid_namespace)
    report(options, "containment", mode)
    if options.home is not None and mode != "pid-namespace":
        report(options, "home", "directory (no mount namespace of its own)")
    child: List[int] = []
    stopping: List[int] = []

    def stop(signum: int, frame: object) -> None:
        stopping.append(signum)
        for pid in child:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    # Before the fork: a SIGTERM that comes while the child starts must not end this process unswept.
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, stop)
    pid, status_fd = _start_child(options, mode)
    _close_report(options)
    child.append(pid)
    if stopping:
        stop(stopping[0], None)
    _, status = os.waitpid(pid, 0)
    if status_fd is not None:
        # The probe's own status, as the namespace's init saw it; nothing when the init was killed (the timeout).
        said = os.read(status_fd, 64).strip()
        os.close(status_fd)
        if said:
            status = int(said)
    sweep()
    if os.WIFSIGNALED(status):
        signum = os.WTERMSIG(status)
        for number in (int(signal.SIGTERM), int(signal.SIGINT), int(signal.SIGHUP), signum):
            try:
                signal.signal(number, signal.SIG_DFL)
            except (OSError, ValueError):  # SIGKILL and SIGSTOP have no handler to reset
                pass
        os.kill(os.getpid(), signum)
        return 128 + signum
    return os.WEXITSTATUS(status)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
