"""Who the probe runs as, in which environment, under which limits: a broken or hostile ML stack must not harm the host.

The probe runs the host's ML interpreter with whatever its site-packages import, every few hours. As root that would
hand the host to anything in that environment, so the agent (when root) starts it as ``[health] run_as`` (the
packages create the system user ``gpuguard-probe`` in the groups ``video`` and ``render``) with that user's
supplementary groups, a clean environment, and limits: RLIMIT_CPU, RLIMIT_NOFILE, RLIMIT_NPROC (a dropped user
only), RLIMIT_CORE=0, RLIMIT_FSIZE, host memory, processes and what it may write. Host memory is never RLIMIT_AS
(CUDA and ROCm reserve terabytes of address space and fail under it): a cgroup v2 child with ``memory.max`` where
the agent may create one, else a watchdog that kills the probe's whole tree when the resident memory of every
process below its supervisor (sessions included) passes the limit. The result says which limit applied.

A probe with nothing to keep (issue #39): every run gets a fresh, empty home (``HOME`` and ``TMPDIR``), a 0700
directory of the probe's user inside a 0711 directory of the agent's made for this run only, handed over through
file descriptors (O_NOFOLLOW, fchown, fchmod) and removed after the run, timeout and kill included. Where the
supervisor makes a PID namespace (root) its init mounts a tmpfs of ``[health] home_max_bytes`` there and hides the
user's own home under an empty read-only one (reaper.py); elsewhere the home is a plain directory whose size the
watchdog checks. RLIMIT_FSIZE bounds each file the probe writes anywhere. The agent reads nothing back from that
home (the watchdog only adds up sizes); what the probe says comes only through its bounded, escaped output
(launch.py, parse.py).

When the agent is not root (tests, an operator's ``gpuguard health run``) the probe runs as that user, and says so.
``run_as = "root"`` keeps root, with a warning.
"""

from __future__ import annotations

import errno
import grp
import os
import pwd
import shutil
import signal
import stat
import tempfile
import threading
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from agent.errors import GpuguardError, SetupError, StateWriteError
from agent.health.model import SandboxReport
from agent.health.settings import DEFAULT_PROBE_USER, HealthSettings
from agent.log import get_logger

log = get_logger("health.sandbox")

# What the framework needs from the agent's environment; everything else (credentials, SSH agents, sudo) stays out.
# No PYTHON* variable: the interpreter starts isolated (-I) and ignores them; [health] python_path is passed as an
# argument instead (runner.build_probe_argv).
_KEPT_NAMES = {"PATH", "LD_LIBRARY_PATH", "LANG", "LANGUAGE", "TZ", "VIRTUAL_ENV", "CONDA_PREFIX"}
_KEPT_PREFIXES = ("LC_", "CUDA_", "ROCM_", "ROCR_", "HIP_", "HSA_", "NCCL_", "RCCL_", "NVIDIA_", "TORCH_",
                  "PYTORCH_", "OMP_", "MKL_", "NVSHMEM_", "MIOPEN_", "AMD_", "GPU_DEVICE_ORDINAL", "CUBLAS_",
                  "CUDNN_")
_PAGE_BYTES = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_CGROUP_ROOT = "/sys/fs/cgroup"
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# A home with more entries than this is over its limit whatever their size (the watchdog's walk stays bounded).
HOME_MAX_ENTRIES = 100_000


@dataclass
class Sandbox:
    """The identity and limits one probe run gets (``user``/``group``/``extra_groups`` None: no change)."""

    user: str
    uid: int
    gid: int
    groups: List[int]
    dropped: bool
    home: Optional[str]
    memory_max_bytes: int
    rlimits: Dict[str, int]
    notes: List[str] = field(default_factory=list)
    # The 0711 directory of the agent's made for this run only, holding ``home`` (removed after the run).
    run_dir: Optional[str] = None
    # What the probe may write in its home (a tmpfs of this size, else the watchdog's bound), and each file anywhere.
    home_max_bytes: int = 0
    # Directories hidden from the probe under an empty read-only tmpfs where it gets mounts of its own.
    hide: List[str] = field(default_factory=list)
    # Processes below the supervisor (the watchdog's count; RLIMIT_NPROC holds per user only for a dropped user).
    processes_max: int = 0
    cgroup_root: str = _CGROUP_ROOT
    own_cgroup_file: str = "/proc/self/cgroup"

    def popen_kwargs(self) -> Dict[str, Any]:
        """``subprocess.Popen`` arguments for the identity, for a command started without the supervisor."""
        if not self.dropped:
            return {}
        return {"user": self.uid, "group": self.gid, "extra_groups": list(self.groups)}

    def reaper_args(self) -> List[str]:
        """reaper.py's options: the identity it drops to in the probe's process before exec, the home it mounts."""
        out: List[str] = []
        if self.dropped:
            out += ["--uid", str(self.uid), "--gid", str(self.gid), "--groups", ",".join(str(g) for g in self.groups)]
        if self.home is not None and self.home_max_bytes:
            out += ["--home", self.home, "--home-max-bytes", str(self.home_max_bytes)]
            for path in self.hide:
                out += ["--hide", path]
        return out

    def report(self, memory_limit: str, killed_for_memory: Optional[str], containment: Optional[str] = None,
               home_limit: Optional[str] = None, killed_for_limit: Optional[str] = None) -> SandboxReport:
        """What the result says of the identity and the limits that held the probe."""
        processes = (f"RLIMIT_NPROC {self.rlimits['RLIMIT_NPROC']} for uid {self.uid}; "
                     if "RLIMIT_NPROC" in self.rlimits else "")
        if self.processes_max:
            processes += f"watchdog: at most {self.processes_max} processes below the supervisor"
        return SandboxReport(user=self.user, uid=self.uid, gid=self.gid, groups=list(self.groups),
                             dropped=self.dropped, home=self.home, memory_limit=memory_limit,
                             rlimits=dict(self.rlimits), notes=list(self.notes), killed_for_memory=killed_for_memory,
                             containment=containment, process_limit=processes or "none",
                             home_limit=home_limit or "none", killed_for_limit=killed_for_limit)


def probe_user_command(name: str = DEFAULT_PROBE_USER) -> str:
    """The ``useradd`` line the packages' maintainer scripts create the probe's user with (deb postinst, rpm %post)."""
    return (f"useradd --system --user-group --home-dir /var/lib/{name} --create-home --shell /usr/sbin/nologin "
            f'--comment "gpuguard health probe" {name}')


def resolve_sandbox(settings: HealthSettings, state_dir: str, euid: Optional[int] = None) -> Sandbox:
    """The sandbox for this run: the agent's own user when it is not root (no switch, no lookup), else
    ``[health] run_as``; SetupError (with the command that makes it) when that user does not exist. Either way with
    a fresh home for this run only (remove_temporary_home removes it); StateWriteError (exit 16) when the disk
    cannot hold even that. ``state_dir`` is not used for the home any more: what the probe writes never lands
    among the agent's state."""
    euid = os.geteuid() if euid is None else euid
    rlimits = {"RLIMIT_CPU": settings.cpu_seconds_max, "RLIMIT_NOFILE": settings.open_files_max, "RLIMIT_CORE": 0,
               "RLIMIT_FSIZE": settings.home_max_bytes}
    limits: Dict[str, Any] = {"home_max_bytes": settings.home_max_bytes, "processes_max": settings.processes_max}
    if euid != 0:
        me = pwd.getpwuid(euid)
        home, run_dir = _run_home(euid, os.getegid())
        return Sandbox(me.pw_name, euid, os.getegid(), sorted(set(os.getgroups())), False, home,
                       settings.memory_max_bytes, rlimits,
                       [f"the agent is not root: the probe runs as {me.pw_name} (uid {euid})"], run_dir=run_dir,
                       **limits)
    name = settings.run_as
    try:
        entry = pwd.getpwuid(int(name)) if name.isdigit() else pwd.getpwnam(name)
    except (KeyError, ValueError):
        raise SetupError(f"[health] run_as: user {name!r} does not exist (the gpuguard packages create it; "
                         "or set [health] run_as)", probe_user_command(name)) from None
    if entry.pw_uid == 0:
        log.warning("health_probe_as_root", run_as=name,
                    hint="the host's ML stack runs with full privileges; set [health] run_as = \"gpuguard-probe\"")
        home, run_dir = _run_home(0, 0)
        return Sandbox(entry.pw_name, 0, 0, [0], False, home, settings.memory_max_bytes, rlimits,
                       ["run_as = root: the probe runs as root (configured; not recommended)"], run_dir=run_dir,
                       **limits)
    groups = sorted(set(os.getgrouplist(entry.pw_name, entry.pw_gid)))
    rlimits["RLIMIT_NPROC"] = settings.processes_max
    home, run_dir = _run_home(entry.pw_uid, entry.pw_gid)
    if not _reachable(Path(home), entry.pw_uid, groups):
        shutil.rmtree(run_dir, ignore_errors=True)
        raise SetupError(f"{home}: the probe's user {entry.pw_name} cannot reach its home for this run (a "
                         "directory above it is closed to that user)",
                         "chmod o+x on that directory, or set TMPDIR for the agent to one the user can reach")
    notes = [f"runs as {entry.pw_name} (uid {entry.pw_uid}, groups {', '.join(_group_names(groups))})"]
    return Sandbox(entry.pw_name, entry.pw_uid, entry.pw_gid, groups, True, home, settings.memory_max_bytes,
                   rlimits, notes, run_dir=run_dir, hide=_own_home(entry), **limits)


def remove_temporary_home(sandbox: Sandbox) -> None:
    """Remove this run's directory and everything the probe left in it (nothing in it is read: rmtree by fd, no
    link followed). Called after the run whatever its end; the probe's processes are gone by then."""
    if sandbox.run_dir:
        shutil.rmtree(sandbox.run_dir, ignore_errors=True)
        if os.path.lexists(sandbox.run_dir):
            log.warning("health_probe_home_left", path=sandbox.run_dir)


def _own_home(entry: pwd.struct_passwd) -> List[str]:
    """The user's own home directory (the packages make /var/lib/gpuguard-probe), to hide from the probe: what it
    wrote there would outlive the run."""
    own = Path(entry.pw_dir or "/nonexistent")
    try:
        st = own.lstat()
    except OSError:
        return []
    return [str(own)] if own != Path("/") and stat.S_ISDIR(st.st_mode) and st.st_uid == entry.pw_uid else []


def _run_home(uid: int, gid: int) -> Tuple[str, str]:
    """(home, run directory): ``<tmp>/gpuguard-probe-XXXX`` (0711, the agent's, made fresh with O_EXCL: no one
    else's link or directory can be there) holding ``home`` (0700, uid:gid, handed over by its descriptor)."""
    try:
        run_dir = tempfile.mkdtemp(prefix="gpuguard-probe-")
    except OSError as exc:
        raise _home_error(tempfile.gettempdir(), exc) from None
    try:
        parent = os.open(run_dir, _DIR_FLAGS)
        try:
            os.fchmod(parent, 0o711)
            os.mkdir("home", 0o700, dir_fd=parent)
            fd = os.open("home", _DIR_FLAGS, dir_fd=parent)
            try:
                os.fchown(fd, uid, gid)
                os.fchmod(fd, 0o700)
            finally:
                os.close(fd)
        finally:
            os.close(parent)
    except OSError as exc:
        shutil.rmtree(run_dir, ignore_errors=True)
        raise _home_error(run_dir, exc) from None
    return os.path.join(run_dir, "home"), run_dir


def _home_error(path: str, exc: OSError) -> GpuguardError:
    """A full or read-only disk is a state write that failed (exit 16); anything else a set-up problem."""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EIO):
        return StateWriteError.of(path, exc)
    return SetupError(f"{path}: cannot make the probe's home for this run ({exc.strerror or exc})",
                      "set TMPDIR for the agent to a writable directory")


def _group_names(gids: List[int]) -> List[str]:
    out = []
    for gid in gids:
        try:
            out.append(grp.getgrgid(gid).gr_name)
        except KeyError:
            out.append(str(gid))
    return out


def _reachable(path: Path, uid: int, groups: List[int]) -> bool:
    """Whether ``uid`` (with ``groups``) may traverse every directory above ``path``."""
    for parent in path.resolve().parents:
        st = parent.stat()
        if st.st_uid == uid:
            bit = stat.S_IXUSR
        elif st.st_gid in groups:
            bit = stat.S_IXGRP
        else:
            bit = stat.S_IXOTH
        if not st.st_mode & bit:
            return False
    return True


def sandbox_env(base: Mapping[str, str], sandbox: Sandbox) -> Dict[str, str]:
    """The environment the probe gets: only what the framework needs, with this run's HOME and TMPDIR."""
    env = {k: v for k, v in base.items() if k in _KEPT_NAMES or k.startswith(_KEPT_PREFIXES)}
    if sandbox.dropped:
        env.update(USER=sandbox.user, LOGNAME=sandbox.user)
    else:
        for key in ("USER", "LOGNAME"):
            if key in base:
                env[key] = base[key]
    if sandbox.home is not None:
        env.update(HOME=sandbox.home, TMPDIR=sandbox.home)
    return env


# The probe's limits are set by the probe's own process, before it becomes the probe: its interpreter starts
# isolated (-I -S: no site-packages, so nothing of the ML stack runs yet), lowers its limits (lowering one's own
# limits needs no privilege; a hard limit already lower is kept) and execs the real argv. Setting them from the
# agent with prlimit(2) after the start needs CAP_SYS_RESOURCE once the probe runs as another user, which a
# container's root usually lacks (seen on the H200: "Operation not permitted", the probe ran unlimited).
LIMITS_TRAMPOLINE = (
    "import os, resource, sys\n"
    "for pair in sys.argv[1].split(','):\n"
    "    name, _, value = pair.partition('=')\n"
    "    which, want = getattr(resource, name), int(value)\n"
    "    hard = resource.getrlimit(which)[1]\n"
    "    hard = want if hard == resource.RLIM_INFINITY else min(want, hard)\n"
    "    resource.setrlimit(which, (hard, hard))\n"
    "try:\n"
    "    os.execvp(sys.argv[2], sys.argv[2:])\n"
    "except OSError as exc:\n"
    "    sys.stderr.write('gpuguard: cannot start %s: %s\\n' % (sys.argv[2], exc.strerror))\n"
    "    os._exit(127)\n"
)


def with_limits(python: str, argv: Sequence[str], rlimits: Mapping[str, int]) -> List[str]:
    """``argv`` started through ``python``'s limits trampoline, which sets ``rlimits`` on itself and execs it."""
    if not rlimits:
        return list(argv)
    spec = ",".join(f"{name}={value}" for name, value in sorted(rlimits.items()))
    return [python, "-I", "-S", "-c", LIMITS_TRAMPOLINE, spec, *argv]


def docker_ulimits(rlimits: Mapping[str, int]) -> List[str]:
    """The same limits as ``--ulimit`` options of docker/podman run (the container's processes get them)."""
    names = {"RLIMIT_CPU": "cpu", "RLIMIT_NOFILE": "nofile", "RLIMIT_CORE": "core", "RLIMIT_NPROC": "nproc",
             "RLIMIT_FSIZE": "fsize"}
    return [f"--ulimit={names[name]}={value}:{value}" for name, value in sorted(rlimits.items()) if name in names]


# --- host memory ---------------------------------------------------------------------------------------------------

class MemoryLimit:
    """Host memory, processes and the home's size for the probe's whole tree: a cgroup v2 child with memory.max
    when the agent may create one, else an RSS watchdog over every process below the supervisor; the watchdog
    also counts those processes and adds up the home's size (where no tmpfs bounds it)."""

    # Each poll reads /proc/<pid>/stat of every process on the host: twice a second is cheap on a busy host too.
    def __init__(self, sandbox: Sandbox, poll_seconds: float = 0.5) -> None:
        self.sandbox = sandbox
        self.limit = sandbox.memory_max_bytes
        self.poll_seconds = poll_seconds
        self.cgroup: Optional[Path] = None
        self.description = "none"
        self.killed: Optional[str] = None
        # Why the watchdog ended the probe for another limit than memory (processes, the home's size).
        self.killed_for_limit: Optional[str] = None
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._cgroup_problem: Optional[str] = None
        self._prepare_cgroup()

    def _prepare_cgroup(self) -> None:
        try:
            parent = own_cgroup_dir(self.sandbox.cgroup_root, self.sandbox.own_cgroup_file)
            controls = (parent / "cgroup.subtree_control").read_text().split()
            if "memory" not in controls:
                # Enabling it fails (EBUSY) where the agent's own cgroup holds processes, which is the usual case
                # under systemd without a delegated leaf; the root cgroup is exempt.
                (parent / "cgroup.subtree_control").write_text("+memory")
            child = parent / f"gpuguard-probe-{uuid.uuid4().hex[:8]}"
            child.mkdir()
            (child / "memory.max").write_text(str(self.limit))
            try:
                (child / "memory.swap.max").write_text("0")
            except OSError:
                pass  # no swap accounting on this kernel: memory.max alone still holds
            self.cgroup = child
            self.description = f"cgroup {child} memory.max={self.limit}"
        except (OSError, ValueError) as exc:
            self._cgroup_problem = getattr(exc, "strerror", None) or str(exc)

    def start(self, pid: int) -> None:
        """Put the started probe (its supervisor, ``pid``) under the limits: into the cgroup, else under the
        watchdog's memory bound; the watchdog's count of processes and the home's size either way."""
        watch_memory = True
        if self.cgroup is not None:
            try:
                (self.cgroup / "cgroup.procs").write_text(str(pid))
                watch_memory = False
            except OSError as exc:
                self._cgroup_problem = exc.strerror or str(exc)
                self._remove_cgroup()
        if watch_memory:
            self.description = (f"rss watchdog {self.limit} bytes over every process below the supervisor (no "
                                f"cgroup v2 memory.max: {self._cgroup_problem or 'unavailable'})")
        self._thread = threading.Thread(target=self._watch, args=(pid, watch_memory), name="gpuguard-probe-rss",
                                        daemon=True)
        self._thread.start()

    def _over(self, pid: int, watch_memory: bool) -> Optional[Tuple[bool, str]]:
        """(for memory?, why) when the tree is over a limit now; None while it is within them."""
        rss, processes = tree_usage(pid)
        if watch_memory and rss > self.limit:
            return True, (f"resident memory {rss} bytes of {processes} processes > limit {self.limit} bytes: "
                          "process tree killed")
        if self.sandbox.processes_max and processes > self.sandbox.processes_max:
            return False, f"{processes} processes > limit {self.sandbox.processes_max}: process tree killed"
        home = self.sandbox.home
        if home is not None and self.sandbox.home_max_bytes:
            used = directory_bytes(home, HOME_MAX_ENTRIES)
            if used is None:
                return False, f"its home holds more than {HOME_MAX_ENTRIES} entries: process tree killed"
            if used > self.sandbox.home_max_bytes:
                return False, (f"its home holds {used} bytes > limit {self.sandbox.home_max_bytes} bytes: "
                               "process tree killed")
        return None

    def _watch(self, pid: int, watch_memory: bool) -> None:
        while not self._stop.wait(self.poll_seconds):
            over = self._over(pid, watch_memory)
            if over is None:
                continue
            for_memory, why = over
            if for_memory:
                self.killed = why
            else:
                self.killed_for_limit = why
            log.warning("health_probe_limit_killed", pid=pid, reason=why)
            # ``pid`` is the probe's supervisor and its session's leader (launch.py, reaper.py): SIGTERM makes it end
            # the whole tree, setsid() escapees included; the SIGKILL to the group after it is for whatever is left.
            for send in (lambda: os.kill(pid, signal.SIGTERM), lambda: os.killpg(pid, signal.SIGKILL)):
                try:
                    send()
                except (ProcessLookupError, PermissionError):
                    pass
                self._stop.wait(2.0)
            return

    def finish(self) -> Tuple[str, Optional[str]]:
        """Stop watching, read the cgroup's OOM kills, remove it: (how memory was limited, why it killed)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self.cgroup is not None:
            try:
                events = dict(line.split() for line in (self.cgroup / "memory.events").read_text().splitlines()
                              if len(line.split()) == 2)
                if int(events.get("oom_kill", "0")) > 0:
                    self.killed = f"cgroup memory.max {self.limit} bytes reached: {events['oom_kill']} OOM kill(s)"
            except (OSError, ValueError):
                pass
            self._remove_cgroup()
        return self.description, self.killed

    def _remove_cgroup(self) -> None:
        if self.cgroup is None:
            return
        try:
            procs = (self.cgroup / "cgroup.procs").read_text().split()
            for pid in procs:
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass
            self.cgroup.rmdir()
        except OSError as exc:
            log.info("health_cgroup_left", path=str(self.cgroup), error=exc.strerror or str(exc))
        self.cgroup = None


def own_cgroup_dir(cgroup_root: str, own_cgroup_file: str) -> Path:
    """The agent's own cgroup v2 directory (the ``0::`` line); OSError where there is none or it is not writable."""
    for line in Path(own_cgroup_file).read_text().splitlines():
        if line.startswith("0::"):
            path = Path(cgroup_root) / line[3:].lstrip("/")
            if not (path / "cgroup.subtree_control").exists():
                raise OSError(0, f"{path}: not a cgroup v2 directory")
            if not os.access(path, os.W_OK):
                raise OSError(0, f"{path}: not writable")
            return path
    raise OSError(0, "no cgroup v2 (unified) hierarchy")


def tree_usage(root: int, proc: str = "/proc") -> Tuple[int, int]:
    """(resident bytes, processes) of every process below ``root`` (not ``root`` itself), by their parent links
    in /proc/<pid>/stat: a child that left the session with setsid() is still below the supervisor, which is its
    subreaper or the init of its PID namespace's parent."""
    parents: Dict[int, int] = {}
    for name in os.listdir(proc):
        if not name.isdigit():
            continue
        try:
            fields = Path(proc, name, "stat").read_text().rsplit(")", 1)[1].split()
            parents[int(name)] = int(fields[1])
        except (OSError, IndexError, ValueError):
            continue  # a process that exited while being read
    children: Dict[int, List[int]] = {}
    for pid, ppid in parents.items():
        children.setdefault(ppid, []).append(pid)
    total = count = 0
    todo = list(children.get(root, []))
    while todo:
        pid = todo.pop()
        todo.extend(children.get(pid, []))
        try:
            total += int(Path(proc, str(pid), "statm").read_text().split()[1]) * _PAGE_BYTES
            count += 1
        except (OSError, IndexError, ValueError):
            continue
    return total, count


def directory_bytes(path: str, max_entries: int) -> Optional[int]:
    """Bytes a directory tree takes on disk (st_blocks, by lstat: no link followed, no file opened); None past
    ``max_entries`` entries."""
    total, entries = 0, 0
    todo = [path]
    while todo:
        try:
            with os.scandir(todo.pop()) as listing:
                for entry in listing:
                    entries += 1
                    if entries > max_entries:
                        return None
                    try:
                        st = entry.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    total += st.st_blocks * 512
                    if stat.S_ISDIR(st.st_mode):
                        todo.append(entry.path)
        except OSError:
            continue
    return total
