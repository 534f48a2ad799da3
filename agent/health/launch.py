"""Start the probe in its own process group, bounded by a timeout; on timeout kill the whole group.

Host.run suits commands that exit on their own. The probe starts grandchildren (one process per GPU) that hold its
output pipes, and a hung GPU call ignores SIGTERM, so it needs what Host.run does not give: a new session, a
SIGKILL to the whole process group, and a cleanup hook (a container is stopped by name, not by signal). With a
``Sandbox`` (sandbox.py) the probe starts as the sandbox's user, under its limits.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass
from typing import Callable, Mapping, Optional, Protocol, Sequence

from agent.health.sandbox import MemoryLimit, Sandbox
from agent.log import get_logger

log = get_logger("health.launch")
# After the kill, how long to wait for the pipes to drain before giving up on what the probe printed.
_DRAIN_SECONDS = 5.0


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


class Launcher(Protocol):
    """Runs the probe's argv with an environment and a timeout; never raises for the probe's own failures."""

    def __call__(self, argv: Sequence[str], env: Mapping[str, str], timeout_seconds: float,
                 on_timeout: Optional[Callable[[], None]] = None, sandbox: Optional[Sandbox] = None,
                 on_start: Optional[Callable[[int], None]] = None) -> ProbeOutcome: ...


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def launch_probe(argv: Sequence[str], env: Mapping[str, str], timeout_seconds: float,
                 on_timeout: Optional[Callable[[], None]] = None, sandbox: Optional[Sandbox] = None,
                 on_start: Optional[Callable[[int], None]] = None) -> ProbeOutcome:
    """Run argv (never through a shell) in a new session; SIGKILL its process group on timeout and at the end.

    ``on_start(pid)`` is called as soon as the process exists: its pid is also its session and process group id.
    """
    started = time.monotonic()
    memory = MemoryLimit(sandbox) if sandbox is not None else None
    try:
        proc = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                env=dict(env), start_new_session=True, text=True, errors="replace",
                                cwd=(sandbox.home if sandbox is not None and sandbox.home else None),
                                **(sandbox.popen_kwargs() if sandbox is not None else {}))  # type: ignore[call-overload]
    except (FileNotFoundError, PermissionError) as exc:
        if memory is not None:
            memory.finish()
        what = "not found" if isinstance(exc, FileNotFoundError) else f"not executable ({exc.strerror})"
        who = f" as {sandbox.user}" if sandbox is not None and sandbox.dropped else ""
        return ProbeOutcome(tuple(argv), None, "", "", False, 0.0, start_error=f"{argv[0]}: {what}{who}")
    if memory is not None:
        memory.start(proc.pid)
    if on_start is not None:
        on_start(proc.pid)
    timed_out = False
    try:
        stdout, stderr = proc.communicate(timeout=timeout_seconds)
    except subprocess.TimeoutExpired:
        # The probe's own process may have exited while a grandchild still holds the pipes: that is a hang too.
        timed_out = True
        log.warning("health_probe_timeout", timeout_seconds=timeout_seconds, pid=proc.pid)
        _kill_group(proc.pid)
        if on_timeout is not None:
            on_timeout()
        try:
            stdout, stderr = proc.communicate(timeout=_DRAIN_SECONDS)
        except subprocess.TimeoutExpired:
            proc.kill()
            stdout, stderr = "", "output lost: the pipes stayed open after the kill"
    finally:
        # Whatever the probe left running (a rank that outlived it) goes with it.
        _kill_group(proc.pid)
    returncode = proc.wait()
    limit, killed = memory.finish() if memory is not None else ("none", None)
    return ProbeOutcome(tuple(argv), None if timed_out else returncode, stdout or "", stderr or "", timed_out,
                        time.monotonic() - started, memory_limit=limit, killed_for_memory=killed)
