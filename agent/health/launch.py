"""Start the probe under its supervisor, bounded by a timeout; whatever it started ends with it.

Host.run suits commands that exit on their own. The probe starts grandchildren (one process per GPU) that hold its
output pipes, and a hung GPU call ignores SIGTERM, so it needs what Host.run does not give: a new session, an end
for its whole process tree, and a cleanup hook (a container is stopped by name, not by signal). The probe runs below
reaper.py, started with the agent's own interpreter (as the agent's user): a PID namespace where the agent may make
one, else a child subreaper, so a grandchild that left the session with setsid() still ends with the probe
(reaper.py says why not a process group or a cgroup). On timeout the supervisor gets SIGTERM and kills the tree;
the session's process group gets SIGKILL after it. With a ``Sandbox`` (sandbox.py) the supervisor starts the probe as
the sandbox's user, under its limits; the probe cannot signal a supervisor that kept root. A probe in a container
is not supervised (``supervise=False``): its processes are the container runtime's, in the container's own PID
namespace, and the runner stops the container by name; a PID namespace or a sweep around the runtime's client would
kill what the runtime leaves to clean up after it (podman's conmon).

The probe is untrusted (it runs whatever the host's ML environment imports): what it prints is read through bounded
captures, at most ``OUTPUT_CAP_BYTES`` of each pipe (the head of stdout, the tail of stderr); the rest is read and
discarded, counted, and the outcome says the output was too large, so a probe that prints gigabytes costs the agent
no memory. Its control characters are escaped (agent/printable.py) before anything shows them.
"""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Mapping, Optional, Protocol, Sequence

from agent.health.sandbox import MemoryLimit, Sandbox
from agent.log import get_logger
from agent.printable import printable

log = get_logger("health.launch")
# After the kill, how long to wait for the pipes to drain before giving up on what the probe printed.
_DRAIN_SECONDS = 5.0
# What the agent keeps of each of the probe's pipes: its result line is a few kilobytes, a framework's warnings more.
OUTPUT_CAP_BYTES = 1 << 20
_READ_BYTES = 1 << 16
REAPER_PATH = Path(__file__).with_name("reaper.py")
# reaper.py's word for a command it could not start (kept equal to its START_ERROR_MARKER by a test).
_START_ERROR_MARKER = "GPUGUARD_REAPER_START_ERROR"


@dataclass(frozen=True)
class ProbeOutcome:
    """How the probe process ended and what it printed."""

    argv: tuple
    returncode: Optional[int]
    stdout: str
    stderr: str
    timed_out: bool
    wall_seconds: float
    start_error: Optional[str] = None
    # How host memory was limited ("none" without a sandbox), and why that limit ended the probe.
    memory_limit: str = "none"
    killed_for_memory: Optional[str] = None
    # Set when a pipe said more than OUTPUT_CAP_BYTES: which, how much, and that the excess was discarded.
    output_too_large: Optional[str] = None
    # What the supervisor said it got: "pid-namespace", "subreaper" or "process-group"; how the home was bounded.
    containment: Optional[str] = None
    home_limit: Optional[str] = None
    # Set when the watchdog ended the probe for a limit other than memory (its processes, its home's size).
    killed_for_limit: Optional[str] = None


class BoundedCapture:
    """One pipe's bytes: at most ``cap_bytes`` kept (the first, or with ``keep_tail`` the last), all counted."""

    def __init__(self, cap_bytes: int = OUTPUT_CAP_BYTES, keep_tail: bool = False) -> None:
        self.cap_bytes = cap_bytes
        self.keep_tail = keep_tail
        self.total_bytes = 0
        self._kept = bytearray()

    def feed(self, chunk: bytes) -> None:
        self.total_bytes += len(chunk)
        if self.keep_tail:
            self._kept += chunk[-self.cap_bytes:]
            del self._kept[:max(0, len(self._kept) - self.cap_bytes)]
        elif len(self._kept) < self.cap_bytes:
            self._kept += chunk[:self.cap_bytes - len(self._kept)]

    @property
    def overflowed(self) -> bool:
        return self.total_bytes > self.cap_bytes

    def text(self, errors: str = "replace") -> str:
        """The kept bytes as text; ``errors="surrogateescape"`` keeps an invalid byte visible to a strict parser."""
        return self._kept.decode("utf-8", errors=errors)


def _read_until(proc: "subprocess.Popen[bytes]", captures: Mapping[int, BoundedCapture], deadline: float) -> bool:
    """Read the probe's pipes into their captures until both close (True) or ``deadline`` passes (False)."""
    with selectors.DefaultSelector() as selector:
        for fd in captures:
            selector.register(fd, selectors.EVENT_READ)
        while selector.get_map():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            for key, _ in selector.select(timeout=remaining):
                fd = key.fd
                assert isinstance(fd, int)
                try:
                    chunk = os.read(fd, _READ_BYTES)
                except OSError:
                    chunk = b""
                if chunk:
                    captures[fd].feed(chunk)
                else:
                    selector.unregister(fd)
    return True


def _too_large(stdout: BoundedCapture, stderr: BoundedCapture) -> Optional[str]:
    said = [f"{name} {cap.total_bytes} bytes" for name, cap in (("stdout", stdout), ("stderr", stderr))
            if cap.overflowed]
    if not said:
        return None
    return f"{' and '.join(said)} > cap {OUTPUT_CAP_BYTES} bytes each: the excess was discarded"


class Launcher(Protocol):
    """Runs the probe's argv with an environment and a timeout; never raises for the probe's own failures."""

    def __call__(self, argv: Sequence[str], env: Mapping[str, str], timeout_seconds: float,
                 on_timeout: Optional[Callable[[], None]] = None, sandbox: Optional[Sandbox] = None,
                 on_start: Optional[Callable[[int], None]] = None, supervise: bool = True) -> ProbeOutcome: ...


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _stop_tree(pid: int) -> None:
    """SIGTERM the supervisor, which kills the probe and everything below it; SIGKILL the group where it is gone."""
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        _kill_group(pid)


def supervised_argv(argv: Sequence[str], sandbox: Optional[Sandbox] = None,
                    pid_namespace: bool = True, report_fd: Optional[int] = None) -> List[str]:
    """``argv`` under reaper.py, run by the agent's own interpreter, isolated (-I -S: nothing of the site runs)."""
    extra = ([] if pid_namespace else ["--no-pid-namespace"]) + (
        [] if report_fd is None else ["--report-fd", str(report_fd)])
    return [sys.executable, "-I", "-S", str(REAPER_PATH), *(sandbox.reaper_args() if sandbox is not None else []),
            *extra, "--", *argv]


def _start_error(stderr: str) -> Optional[str]:
    """What reaper.py said when it could not start the command: "not found", "not executable (why)", or that its
    PID namespace could not have its own /proc."""
    for line in reversed(stderr.splitlines()[-5:]):
        if line.startswith(_START_ERROR_MARKER + " "):
            what, _, why = line[len(_START_ERROR_MARKER) + 1:].partition(" ")
            if what == "no-proc":
                return f"no /proc of its own could be mounted in its PID namespace ({why})"
            return "not found" if what == "not-found" else f"not executable ({why})"
    return None


_REPORT_MAX_BYTES = 4096


def _read_report(fd: int) -> Dict[str, str]:
    """The supervisor's ``key value`` lines (reaper.py), bounded; the probe never holds this pipe."""
    said = b""
    try:
        os.set_blocking(fd, False)
        while len(said) < _REPORT_MAX_BYTES:
            chunk = os.read(fd, _REPORT_MAX_BYTES)
            if not chunk:
                break
            said += chunk
    except OSError:
        pass
    finally:
        os.close(fd)
    report: Dict[str, str] = {}
    for line in said[:_REPORT_MAX_BYTES].decode("utf-8", errors="replace").splitlines():
        key, _, value = line.partition(" ")
        report.setdefault(key, printable(value))
    return report


def _home_limit(sandbox: Optional[Sandbox], said: Optional[str]) -> Optional[str]:
    """How the home was bounded: the supervisor's tmpfs, else the watchdog's check of the directory (and why)."""
    if sandbox is None or sandbox.home is None or not sandbox.home_max_bytes:
        return None
    if said is not None and said.startswith("tmpfs "):
        return f"tmpfs {sandbox.home_max_bytes} bytes (a private mount in the probe's namespace)"
    why = said[len("directory "):] if said and said.startswith("directory ") else "(no report)"
    return (f"directory checked by the watchdog, {sandbox.home_max_bytes} bytes, and RLIMIT_FSIZE "
            f"{sandbox.home_max_bytes} {why}")


def launch_probe(argv: Sequence[str], env: Mapping[str, str], timeout_seconds: float,
                 on_timeout: Optional[Callable[[], None]] = None, sandbox: Optional[Sandbox] = None,
                 on_start: Optional[Callable[[int], None]] = None, supervise: bool = True,
                 pid_namespace: bool = True) -> ProbeOutcome:
    """Run argv (never through a shell) below reaper.py in a new session; end its whole tree on timeout and at the end.

    ``on_start(pid)`` is called as soon as the supervisor exists: its pid is also the session and process group id
    of the probe. ``supervise=False`` (a container runtime's client, as the sandbox's user when given one) runs argv
    itself and kills its process group; ``pid_namespace=False`` makes the supervisor use its subreaper fallback.
    """
    started = time.monotonic()
    memory = MemoryLimit(sandbox) if sandbox is not None else None
    report_read: Optional[int] = None
    report_write: Optional[int] = None
    if supervise:
        report_read, report_write = os.pipe()
    try:
        proc = subprocess.Popen(supervised_argv(argv, sandbox, pid_namespace, report_write) if supervise
                                else list(argv),
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                env=dict(env), start_new_session=True,
                                cwd=(sandbox.home if sandbox is not None and sandbox.home else None),
                                pass_fds=() if report_write is None else (report_write,),
                                **({} if supervise or sandbox is None else sandbox.popen_kwargs()))
    except (FileNotFoundError, PermissionError) as exc:
        for fd in (report_read, report_write):
            if fd is not None:
                os.close(fd)
        if memory is not None:
            memory.finish()
        what = "not found" if isinstance(exc, FileNotFoundError) else f"not executable ({exc.strerror})"
        who = f" as {sandbox.user}" if sandbox is not None and sandbox.dropped else ""
        return ProbeOutcome(tuple(argv), None, "", "", False, 0.0, start_error=f"{argv[0]}: {what}{who}")
    if report_write is not None:
        os.close(report_write)
    if memory is not None:
        memory.start(proc.pid)
    if on_start is not None:
        on_start(proc.pid)
    timed_out = False
    stdout, stderr = BoundedCapture(), BoundedCapture(keep_tail=True)
    assert proc.stdout is not None and proc.stderr is not None
    captures = {proc.stdout.fileno(): stdout, proc.stderr.fileno(): stderr}
    lost = False
    try:
        deadline = started + timeout_seconds
        # Its own process may have exited while a grandchild still holds the pipes, or it may have closed its pipes
        # and run on: either past the timeout is a hang.
        if _read_until(proc, captures, deadline):
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                timed_out = True
        else:
            timed_out = True
        if timed_out:
            log.warning("health_probe_timeout", timeout_seconds=timeout_seconds, pid=proc.pid)
            if supervise:
                _stop_tree(proc.pid)
            else:
                _kill_group(proc.pid)
            if on_timeout is not None:
                on_timeout()
            if not _read_until(proc, captures, time.monotonic() + _DRAIN_SECONDS):
                proc.kill()
                lost = True
    finally:
        # Whatever is left in the session (the supervisor killed, or gone before its sweep) goes with it.
        _kill_group(proc.pid)
        proc.stdout.close()
        proc.stderr.close()
    returncode = proc.wait()
    said = _read_report(report_read) if report_read is not None else {}
    not_started = _start_error(stderr.text()) if supervise and returncode == 127 and not timed_out else None
    if not_started is not None:
        if memory is not None:
            memory.finish()
        who = f" as {sandbox.user}" if sandbox is not None and sandbox.dropped else ""
        return ProbeOutcome(tuple(argv), None, "", "", False, time.monotonic() - started,
                            start_error=f"{argv[0]}: {not_started}{who}")
    limit, killed = memory.finish() if memory is not None else ("none", None)
    killed_for_limit = memory.killed_for_limit if memory is not None else None
    # stderr is shown as it is (a crash's last line, the result's stderr tail): its escapes go here, once; stdout is
    # parsed, and parse.py escapes what it takes from it (and refuses a result line that is not UTF-8, so stdout keeps
    # its invalid bytes as lone surrogates rather than U+FFFD, which a valid line may hold).
    out_text, err_text = ("", "output lost: the pipes stayed open after the kill") if lost else (
        stdout.text("surrogateescape"), printable(stderr.text(), keep_newlines=True))
    return ProbeOutcome(tuple(argv), None if timed_out else returncode, out_text, err_text, timed_out,
                        time.monotonic() - started, memory_limit=limit, killed_for_memory=killed,
                        output_too_large=_too_large(stdout, stderr), containment=said.get("containment"),
                        home_limit=_home_limit(sandbox, said.get("home")), killed_for_limit=killed_for_limit)
