"""Who the probe runs as, in which environment, under which limits: a broken or hostile ML stack must not harm the host.

The probe runs the host's ML interpreter with whatever its site-packages import, every few hours. As root that would
hand the host to anything in that environment, so the agent (when root) starts it as ``[health] run_as`` (the
packages create the system user ``gpuguard-probe`` in the groups ``video`` and ``render``) with that user's
supplementary groups, a clean environment (``HOME`` and ``TMPDIR`` in a private directory the user owns), and limits:
RLIMIT_CPU, RLIMIT_NOFILE, RLIMIT_NPROC (a dropped user only), RLIMIT_CORE=0, and host memory. Host memory is never
RLIMIT_AS (CUDA and ROCm reserve terabytes of address space and fail under it): a cgroup v2 child with
``memory.max`` where the agent may create one, else a watchdog that kills the probe's process group when the resident
memory of its processes passes the limit. The result says which limit applied.

The probe's home is handed over through file descriptors (O_NOFOLLOW, fchown, fchmod): never through a link, never
below a parent that anyone but the agent may write, never a directory of a third user. The agent reads nothing back
from that home; what the probe says comes only through its bounded, escaped output (launch.py, parse.py).

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

from agent.errors import SetupError
from agent.health.model import SandboxReport
from agent.health.settings import DEFAULT_PROBE_USER, HealthSettings
from agent.log import get_logger
from agent.statepaths import StatePaths

log = get_logger("health.sandbox")

# What the framework needs from the agent's environment; everything else (credentials, SSH agents, sudo) stays out.
_KEPT_NAMES = {"PATH", "LD_LIBRARY_PATH", "LANG", "LANGUAGE", "TZ", "PYTHONPATH", "VIRTUAL_ENV", "CONDA_PREFIX"}
_KEPT_PREFIXES = ("LC_", "CUDA_", "ROCM_", "ROCR_", "HIP_", "HSA_", "NCCL_", "RCCL_", "NVIDIA_", "TORCH_",
                  "PYTORCH_", "OMP_", "MKL_", "NVSHMEM_", "MIOPEN_", "AMD_", "GPU_DEVICE_ORDINAL", "CUBLAS_",
                  "CUDNN_")
_PAGE_BYTES = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_CGROUP_ROOT = "/sys/fs/cgroup"


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
    # A home made under /tmp for this run only (removed after it).
    home_is_temporary: bool = False
    cgroup_root: str = _CGROUP_ROOT
    own_cgroup_file: str = "/proc/self/cgroup"

    def popen_kwargs(self) -> Dict[str, Any]:
        """``subprocess.Popen`` arguments for the identity, for a command started without the supervisor."""
        if not self.dropped:
            return {}
        return {"user": self.uid, "group": self.gid, "extra_groups": list(self.groups)}

    def reaper_args(self) -> List[str]:
        """reaper.py's options for the identity: the supervisor drops to it in the probe's process before exec."""
        if not self.dropped:
            return []
        return ["--uid", str(self.uid), "--gid", str(self.gid), "--groups", ",".join(str(g) for g in self.groups)]

    def report(self, memory_limit: str, killed_for_memory: Optional[str]) -> SandboxReport:
        return SandboxReport(user=self.user, uid=self.uid, gid=self.gid, groups=list(self.groups),
                             dropped=self.dropped, home=self.home, memory_limit=memory_limit,
                             rlimits=dict(self.rlimits), notes=list(self.notes), killed_for_memory=killed_for_memory)


def probe_user_command(name: str = DEFAULT_PROBE_USER) -> str:
    """The ``useradd`` line the packages' maintainer scripts create the probe's user with (deb postinst, rpm %post)."""
    return (f"useradd --system --user-group --home-dir /var/lib/{name} --create-home --shell /usr/sbin/nologin "
            f'--comment "gpuguard health probe" {name}')


def resolve_sandbox(settings: HealthSettings, state_dir: str, euid: Optional[int] = None) -> Sandbox:
    """The sandbox for this run: the agent's own user when it is not root (no switch, no lookup), else
    ``[health] run_as``; SetupError (with the command that makes it) when that user does not exist."""
    euid = os.geteuid() if euid is None else euid
    rlimits = {"RLIMIT_CPU": settings.cpu_seconds_max, "RLIMIT_NOFILE": settings.open_files_max, "RLIMIT_CORE": 0}
    if euid != 0:
        me = pwd.getpwuid(euid)
        return Sandbox(me.pw_name, euid, os.getegid(), sorted(set(os.getgroups())), False, None,
                       settings.memory_max_bytes, rlimits,
                       [f"the agent is not root: the probe runs as {me.pw_name} (uid {euid})"])
    name = settings.run_as
    try:
        entry = pwd.getpwuid(int(name)) if name.isdigit() else pwd.getpwnam(name)
    except (KeyError, ValueError):
        raise SetupError(f"[health] run_as: user {name!r} does not exist (the gpuguard packages create it; "
                         "or set [health] run_as)", probe_user_command(name)) from None
    if entry.pw_uid == 0:
        log.warning("health_probe_as_root", run_as=name,
                    hint="the host's ML stack runs with full privileges; set [health] run_as = \"gpuguard-probe\"")
        return Sandbox(entry.pw_name, 0, 0, [0], False, None, settings.memory_max_bytes, rlimits,
                       ["run_as = root: the probe runs as root (configured; not recommended)"])
    groups = sorted(set(os.getgrouplist(entry.pw_name, entry.pw_gid)))
    rlimits["RLIMIT_NPROC"] = settings.processes_max
    home = _private_home(entry, groups, Path(StatePaths(state_dir).probe_home))
    notes = [f"runs as {entry.pw_name} (uid {entry.pw_uid}, groups {', '.join(_group_names(groups))})"]
    return Sandbox(entry.pw_name, entry.pw_uid, entry.pw_gid, groups, True, home, settings.memory_max_bytes,
                   rlimits, notes, home_is_temporary=Path(home).parent == Path(tempfile.gettempdir()))


def remove_temporary_home(sandbox: Sandbox) -> None:
    """Remove a home made under /tmp for one run (what the probe left there goes with it)."""
    if sandbox.home_is_temporary and sandbox.home:
        shutil.rmtree(sandbox.home, ignore_errors=True)


def _group_names(gids: List[int]) -> List[str]:
    out = []
    for gid in gids:
        try:
            out.append(grp.getgrgid(gid).gr_name)
        except KeyError:
            out.append(str(gid))
    return out


def _private_home(entry: pwd.struct_passwd, groups: List[int], preferred: Path) -> str:
    """A 0700 directory the probe's user owns and can reach: its own home (the packages make
    /var/lib/gpuguard-probe), else one under the state directory, else a fresh one under /tmp.

    The state directory is usually 0750 root: a home under it that the user cannot reach would break the
    framework's caches and the checkpoint step's temporary files, so reachability is checked, not assumed.
    """
    uid, gid = entry.pw_uid, entry.pw_gid
    own = Path(entry.pw_dir or "/nonexistent")
    try:
        st = own.lstat()
        if own != Path("/") and stat.S_ISDIR(st.st_mode) and st.st_uid == uid and _reachable(own, uid, groups):
            return str(own)
    except OSError:
        pass
    for make in (lambda: _own_dir(preferred), lambda: Path(tempfile.mkdtemp(prefix="gpuguard-probe-"))):
        try:
            path = make()
            _give_dir(path, uid, gid)
            if _reachable(path, uid, groups):
                return str(path)
            log.info("health_probe_home_unreachable", path=str(path), user=entry.pw_name)
        except OSError as exc:
            log.info("health_probe_home_unusable", path=str(preferred), error=exc.strerror or str(exc))
    home = entry.pw_dir if entry.pw_dir and entry.pw_dir != "/" else f"/var/lib/{entry.pw_name}"
    raise SetupError(f"{preferred}: cannot make a private home directory for the probe's user {entry.pw_name}",
                     f"install -d -m 0700 -o {entry.pw_name} -g {entry.pw_gid} {home}")


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


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _own_dir(path: Path) -> Path:
    """``path`` made (or found) below a parent that is the agent's and writable by no one else, neither a symlink.

    The probe's user owns what it finds inside; a parent it (or anyone else) could write would let it put a link
    where the agent is about to hand a directory over.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    parent = os.open(path.parent, _DIR_FLAGS)
    try:
        st = os.fstat(parent)
        if st.st_uid != os.geteuid() or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            raise OSError(errno.EPERM, f"{path.parent}: not the agent's own directory (uid {st.st_uid}, mode "
                                       f"{stat.S_IMODE(st.st_mode):o})")
        try:
            os.mkdir(path.name, 0o700, dir_fd=parent)
        except FileExistsError:
            pass
    finally:
        os.close(parent)
    return path


def _give_dir(path: Path, uid: int, gid: int) -> None:
    """Hand the directory ``path`` to uid:gid as 0700, through its file descriptor (never following a link).

    Only a directory that is the agent's or already the user's is handed over: another user's would give the probe
    that user's files.
    """
    fd = os.open(path, _DIR_FLAGS)
    try:
        st = os.fstat(fd)
        if st.st_uid not in (os.geteuid(), uid):
            raise OSError(errno.EPERM, f"owned by uid {st.st_uid}, neither the agent's nor the probe user's")
        os.fchown(fd, uid, gid)
        os.fchmod(fd, 0o700)
    finally:
        os.close(fd)


def sandbox_env(base: Mapping[str, str], sandbox: Sandbox) -> Dict[str, str]:
    """The environment the probe gets: only what the framework needs, with its own HOME, TMPDIR and USER."""
    env = {k: v for k, v in base.items() if k in _KEPT_NAMES or k.startswith(_KEPT_PREFIXES)}
    if sandbox.dropped:
        assert sandbox.home is not None
        env.update(HOME=sandbox.home, TMPDIR=sandbox.home, USER=sandbox.user, LOGNAME=sandbox.user)
    else:
        for key in ("HOME", "TMPDIR", "USER", "LOGNAME"):
            if key in base:
                env[key] = base[key]
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
    names = {"RLIMIT_CPU": "cpu", "RLIMIT_NOFILE": "nofile", "RLIMIT_CORE": "core", "RLIMIT_NPROC": "nproc"}
    return [f"--ulimit={names[name]}={value}:{value}" for name, value in sorted(rlimits.items()) if name in names]


# --- host memory ---------------------------------------------------------------------------------------------------

class MemoryLimit:
    """A cgroup v2 child with memory.max when the agent may create one, else an RSS watchdog on the process group."""

    # Each poll reads /proc/<pid>/stat of every process on the host: twice a second is cheap on a busy host too.
    def __init__(self, sandbox: Sandbox, poll_seconds: float = 0.5) -> None:
        self.sandbox = sandbox
        self.limit = sandbox.memory_max_bytes
        self.poll_seconds = poll_seconds
        self.cgroup: Optional[Path] = None
        self.description = "none"
        self.killed: Optional[str] = None
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
        """Put the started probe under the limit: into the cgroup, else under the watchdog."""
        if self.cgroup is not None:
            try:
                (self.cgroup / "cgroup.procs").write_text(str(pid))
                return
            except OSError as exc:
                self._cgroup_problem = exc.strerror or str(exc)
                self._remove_cgroup()
        self.description = (f"rss watchdog {self.limit} bytes (no cgroup v2 memory.max: "
                            f"{self._cgroup_problem or 'unavailable'})")
        self._thread = threading.Thread(target=self._watch, args=(pid,), name="gpuguard-probe-rss", daemon=True)
        self._thread.start()

    def _watch(self, pgid: int) -> None:
        while not self._stop.wait(self.poll_seconds):
            rss = group_rss_bytes(pgid)
            if rss > self.limit:
                self.killed = f"resident memory {rss} bytes > limit {self.limit} bytes: process group killed"
                log.warning("health_probe_memory_killed", pgid=pgid, rss_bytes=rss, limit_bytes=self.limit)
                # The group's leader is the probe's supervisor (launch.py, reaper.py): SIGTERM makes it end the whole
                # tree, setsid() escapees included; the SIGKILL to the group after it is for whatever is left.
                for send in (lambda: os.kill(pgid, signal.SIGTERM), lambda: os.killpg(pgid, signal.SIGKILL)):
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


def group_rss_bytes(pgid: int, proc: str = "/proc") -> int:
    """Resident memory of every process in a process group, from /proc/<pid>/stat and statm."""
    total = 0
    for name in os.listdir(proc):
        if not name.isdigit():
            continue
        try:
            stat = Path(proc, name, "stat").read_text()
            fields = stat.rsplit(")", 1)[1].split()
            if int(fields[2]) != pgid:
                continue
            total += int(Path(proc, name, "statm").read_text().split()[1]) * _PAGE_BYTES
        except (OSError, IndexError, ValueError):
            continue  # a process that exited while being read
    return total
