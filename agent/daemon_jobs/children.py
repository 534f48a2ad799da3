"""Heavy job bodies in short-lived child processes, so the resident daemon stays small.

The snapshot (collectors, GPU libraries, the policy engine), the guard's ``check_and_rollback`` (apt/dnf tooling)
and the health check load far more code and native memory than scheduling needs, and run every few minutes or
hours. Delivery's drain runs more often (only while the outbox holds events: after each heartbeat, about once a
minute), but requests with urllib3, charset_normalizer and the loaded trust store held 6.5 MiB of the resident's
46. The daemon runs each of them as ``gpuguard _job NAME`` (a hidden subcommand; ``child_argv``), which does the one
run and exits; its memory goes with it.

    resident (gpuguard run)                          child (gpuguard _job NAME)
    request: host_id, hostname, state it needs  -->  argv --request JSON
                                                     runs the body once; events straight into the outbox
                                                     (SQLite, BEGIN IMMEDIATE: safe beside the resident)
    reads the result file, updates its state    <--  --result FILE (JSON), exit 0

The child inherits stderr (its log lines go where the daemon's go), not the daemon's signal handlers, nor
$NOTIFY_SOCKET / $WATCHDOG_*. SIGTERM to the child sets its ``stopping`` event, exactly what SIGTERM to the daemon
does to an in-process body (a lock wait gives up, a running step finishes); the daemon sends it when it is
stopping and waits for the child, and the kernel sends it when the daemon dies (``PR_SET_PDEATHSIG``). A child
that fails, crashes or is killed raises :class:`ChildJobFailed` in the daemon (exit status or signal, and its peak
RSS): the job runner logs it and the next run tries again.
Each exit is logged as ``job_child_exited`` (debug for delivery's clean ones) with the child's CPU time (``wait4``)
and peak RSS: VmHWM, which the child reports in its result and the daemon reads from /proc while it waits (for a
child that leaves no result). Not ``ru_maxrss``: after posix_spawn's vfork it includes the daemon's own peak, the
memory the child shared until its exec.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Sequence

from agent.daemon_jobs.delivery import Drained
from agent.daemon_jobs.runtime import SnapshotFacts
from agent.errors import GpuguardError, Interrupted
from agent.log import get_logger
from agent.statepaths import StatePaths

log = get_logger("job_child")

# How often the daemon looks at a running child (and at its own stopping flag) while it waits.
POLL_SECONDS = 0.05
_ENV_DROPPED = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID", "LISTEN_FDS", "LISTEN_PID", "LISTEN_FDNAMES")


class ChildJobFailed(GpuguardError):
    """A job child exited non-zero, was killed, or left no result."""

    def __init__(self, job: str, problem: str) -> None:
        super().__init__(f"job child {job}: {problem}")
        self.job = job
        self.problem = problem


def child_argv(job: str, config_path: str, root: str, request_json: str, result_path: str) -> List[str]:
    """The child's command line: this interpreter with the daemon's flags and import path, this agent package.

    The .deb's launcher runs ``python3 -IS`` and puts /usr/lib/gpuguard and its vendor directory first on sys.path
    (no PYTHON* variables, no host site-packages); the child starts the same way, with the same sys.path.
    """
    flags = [flag for flag, on in (("-I", sys.flags.isolated), ("-S", sys.flags.no_site)) if on]
    paths = [p for p in sys.path if p and os.path.isabs(p)]
    boot = f"import sys; sys.path[:0] = {paths!r}; from agent.cli import main; sys.exit(main())"
    return [sys.executable, *flags, "-c", boot, "_job", job, "--config", config_path, "--root", root,
            "--request", request_json, "--result", result_path]


def child_env(environ: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    """The daemon's environment without systemd's per-process variables (the child is not the service)."""
    return {k: v for k, v in (os.environ if environ is None else environ).items() if k not in _ENV_DROPPED}


def run_child(job: str, config_path: str, root: str, request: Dict[str, Any], state_dir: str,
              stopping: threading.Event, argv: Optional[Callable[..., Sequence[str]]] = None) -> Dict[str, Any]:
    """Run one job child to its end and return its result; raises ChildJobFailed.

    When ``stopping`` is set while it runs, the child gets SIGTERM once and is waited for.
    """
    result_path = StatePaths(state_dir).job_result(job)
    try:
        os.unlink(result_path)
    except FileNotFoundError:
        pass
    command = list((argv or child_argv)(job, config_path, root, json.dumps(request, sort_keys=True), result_path))
    started = time.monotonic()
    pid = _spawn(command)
    terminated = False
    peak_rss_kib = 0
    while True:
        peak_rss_kib = max(peak_rss_kib, peak_rss_kib_of(str(pid)))
        waited, status, usage = os.wait4(pid, os.WNOHANG)
        if waited == pid:
            break
        if stopping.is_set() and not terminated:
            terminated = True
            log.info("job_child_stopping", job=job, pid=pid)
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        stopping.wait(POLL_SECONDS) if not stopping.is_set() else time.sleep(POLL_SECONDS)
    exit_code = os.waitstatus_to_exitcode(status)
    try:
        with open(result_path, "r", encoding="utf-8") as handle:
            result = json.load(handle)
    except (OSError, ValueError) as exc:
        result = None
        missing = f"{type(exc).__name__}: {exc}"
    finally:
        try:
            os.unlink(result_path)
        except OSError:
            pass
    if isinstance(result, dict) and isinstance(result.get("peak_rss_kib"), int):
        peak_rss_kib = max(peak_rss_kib, result.pop("peak_rss_kib"))
    # Delivery's routine runs (about one a minute) would fill the journal: their clean exits are debug lines.
    level = log.debug if job == "deliver" and exit_code == 0 else log.info
    level("job_child_exited", job=job, pid=pid, exit_code=exit_code, max_rss_kib=peak_rss_kib,
          cpu_seconds=round(usage.ru_utime + usage.ru_stime, 3), duration_seconds=round(time.monotonic() - started, 3))
    if terminated and exit_code == -signal.SIGTERM:  # stopped before it could set up its own SIGTERM handling
        raise Interrupted(f"job child {job}: stopped by the daemon's shutdown")
    if exit_code < 0:
        raise ChildJobFailed(job, f"killed by {signal.Signals(-exit_code).name}")
    if exit_code != 0:
        raise ChildJobFailed(job, f"exited {exit_code}")
    if not isinstance(result, dict):
        raise ChildJobFailed(job, f"no result ({missing})" if result is None else "result is not an object")
    return result


def peak_rss_kib_of(pid: str = "self") -> int:
    """VmHWM of a process in KiB (0 when it is gone or shows none)."""
    try:
        with open(f"/proc/{pid}/status", "r", encoding="ascii", errors="replace") as handle:
            for line in handle:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return 0


def _spawn(command: Sequence[str]) -> int:
    """posix_spawn the child: stdin and stdout /dev/null, stderr shared, default signal handling."""
    devnull = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
    try:
        return os.posix_spawn(command[0], list(command), child_env(),
                              file_actions=[(os.POSIX_SPAWN_DUP2, devnull, 0), (os.POSIX_SPAWN_DUP2, devnull, 1)],
                              setsigdef=(signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1,
                                         signal.SIGCHLD, signal.SIGPIPE),
                              setsigmask=())
    finally:
        os.close(devnull)


def job_request(runtime: Any, reason: str, **extra: Any) -> Dict[str, Any]:
    """What every child needs from the daemon's memory: the settings in force (a SIGHUP-reloaded file, or the old
    one kept after an invalid reload), the host id and name events are stamped with, the reason."""
    return {"settings": runtime.settings.model_dump(mode="json"), "host_id": runtime.emitter.host_id,
            "hostname": runtime.emitter.hostname, "reason": reason, "daemon_pid": os.getpid(), **extra}


class SnapshotInChild:
    """The snapshot job's body run in a child; the child hands back what the daemon shows of the stored snapshot.

    At start, when a snapshot is stored, a first child (``stored_only``) reads it back, reporting a damaged file, and
    hands back its facts and pairing: the daemon itself never loads a snapshot (issue #17)."""

    def __init__(self, runtime: Any, config_path: str, on_stack_changed: Callable[[str], None]) -> None:
        self.runtime = runtime
        self.config_path = config_path
        self.on_stack_changed = on_stack_changed
        state = runtime.state
        if state.snapshot_facts is None and os.path.lexists(runtime.paths.last_snapshot):
            try:
                result = run_child("snapshot", config_path, str(runtime.host.root),
                                   job_request(runtime, "start", stored_only=True), runtime.state_dir,
                                   runtime.stopping)
            except ChildJobFailed as exc:  # the first snapshot run (right after start) tells the same
                log.warning("snapshot_read_back_failed", error=str(exc))
                return
            self._keep(result)
            if result.get("events"):
                runtime.emitter.on_enqueued()

    def run(self, reason: str = "interval") -> None:
        rt = self.runtime
        result = run_child("snapshot", self.config_path, str(rt.host.root),
                           job_request(rt, reason, violated_rules=sorted(rt.state.violated_rules)),
                           rt.state_dir, rt.stopping)
        self._keep(result)
        with rt.state.lock:
            rt.state.compliant = result.get("compliant")
            rt.state.violated_rules = frozenset(result.get("violated_rules") or ())
        if result.get("hostname"):
            rt.emitter.hostname = str(result["hostname"])
        if result.get("events"):
            rt.emitter.on_enqueued()
        if result.get("stack_changed"):
            self.on_stack_changed(str(result["stack_changed"]))

    def _keep(self, result: Dict[str, Any]) -> None:
        """The stored snapshot's facts and pairing from a child's result (None: no snapshot is stored)."""
        from agent.snapshot.pairing import Pairing

        facts, pairing = result.get("snapshot"), result.get("pairing")
        state = self.runtime.state
        with state.lock:
            state.snapshot_facts = SnapshotFacts.from_json(facts) if isinstance(facts, dict) else None
            state.pairing = Pairing.model_validate(pairing) if isinstance(pairing, dict) else None


class HealthInChild:
    """The health job's body run in a child (skipped, as in-process, when disabled or under another root)."""

    def __init__(self, runtime: Any, config_path: str, hooks: Any) -> None:
        from agent.daemon_jobs.health import HealthJob

        self.runtime = runtime
        self.config_path = config_path
        self._skip = HealthJob(runtime, hooks)  # restores the last status; its skip rules, logged once

    def run(self, reason: str = "interval", mode: Optional[str] = None,
            after_change: bool = False) -> Optional[Dict[str, Any]]:
        rt = self.runtime
        if not rt.settings.daemon.health_enabled or not rt.host.is_live:
            return self._skip.run(reason)
        result = run_child("health", self.config_path, str(rt.host.root),
                           job_request(rt, reason, mode=mode, after_change=after_change), rt.state_dir, rt.stopping)
        with rt.state.lock:
            rt.state.last_health_status = result.get("status")
            rt.state.last_health_at_seconds = result.get("at_seconds")
        if result.get("events"):
            rt.emitter.on_enqueued()
        return result if result.get("ran", True) and result.get("status") is not None else None


class DeliveryInChild:
    """The delivery job's drain in a child, as DeliveryJob's ``drain``: what the child got through, or its failure."""

    def __init__(self, runtime: Any, config_path: str) -> None:
        self.runtime = runtime
        self.config_path = config_path

    def __call__(self, reason: str) -> Drained:
        rt = self.runtime
        result = run_child("deliver", self.config_path, str(rt.host.root), job_request(rt, reason), rt.state_dir,
                           rt.stopping)
        drained = result.get("drained")
        if not isinstance(drained, dict):
            raise ChildJobFailed("deliver", "result holds no drain")
        return Drained.from_json(drained)


class GuardCheckInChild:
    """``check_and_rollback`` in a child, as the guard job's ``check`` callable: its result, or its error raised."""

    def __init__(self, runtime: Any, config_path: str) -> None:
        self.runtime = runtime
        self.config_path = config_path

    def __call__(self, host: Any, settings: Any) -> Any:
        from types import SimpleNamespace

        rt = self.runtime
        reply = run_child("guard_check", self.config_path, str(host.root), job_request(rt, "guard_check"),
                          rt.state_dir, rt.stopping)
        if "interrupted" in reply:
            raise Interrupted(str(reply["interrupted"]))
        if "error" in reply:
            raise ChildJobFailed("guard_check", str(reply["error"]))
        result = reply.get("result")
        return None if result is None else SimpleNamespace(**result)
