"""Heavy job bodies in short-lived child processes, so the resident daemon stays small.

The snapshot (collectors, GPU libraries, the policy engine), the guard's ``check_and_rollback`` (apt/dnf tooling), the
health check, delivery's sending (requests, urllib3, the trust store), the guard-events forwarding and the settings'
validation (pydantic, issue #28) load far more code and native memory than scheduling needs. The daemon runs each of
them as ``gpuguard _job NAME`` (a hidden subcommand; ``child_argv``), which does the one run and exits; its memory goes
with it.

    resident (gpuguard run)                          child (gpuguard _job NAME)
    request record (agent/daemon_jobs/protocol.py)   argv --request JSON
      the settings in force, host id and name, ...   runs the body once; events straight into the outbox
                                                     (SQLite, BEGIN IMMEDIATE: safe beside the resident)
    reads the result record, updates its state  <--  --result FILE (JSON), exit 0

The child inherits stderr (its log lines go where the daemon's go), not the daemon's signal handlers, nor
$NOTIFY_SOCKET / $WATCHDOG_*. SIGTERM to the child sets its ``stopping`` event, exactly what SIGTERM to the daemon
does to an in-process body (a lock wait gives up, a running step finishes); the daemon sends it when it is
stopping and waits for the child, and the kernel sends it when the daemon dies (``PR_SET_PDEATHSIG``). A child
that fails, crashes, is killed, outlives its timeout (the SIGHUP's config child: SIGKILL, ``job_child_timed_out``), or
writes a result that is not its job's record raises :class:`ChildJobFailed` in the daemon (exit status or signal,
or the field that is wrong): the job runner logs it and the next run tries again.
Each exit is logged as ``job_child_exited`` (debug for the clean exits of delivery's and the config's routine runs)
with the child's CPU time (``wait4``) and peak RSS: VmHWM, which the child reports in its result and the daemon reads
from /proc while it waits (for a child that leaves no result). Not ``ru_maxrss``: after posix_spawn's vfork it
includes the daemon's own peak, the memory the child shared until its exec.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import signal
import sys
import threading
import time
from typing import TYPE_CHECKING, Callable, Dict, List, Optional, Sequence, Tuple, Type, TypeVar

from agent.daemon_jobs.delivery import DeliveryJob, Drained
from agent.daemon_jobs.health import HealthSkips
from agent.daemon_jobs.procstatus import peak_rss_kib
from agent.daemon_jobs.protocol import (
    AskedMode,
    ChildContext,
    ChildReply,
    ConfigRequest,
    ConfigResult,
    DeliverResult,
    DeliveryPlan,
    ForwardResult,
    GuardChecked,
    GuardCheckResult,
    HealthChildResult,
    HealthRequest,
    HealthSummary,
    HubProbePlan,
    HubProbeResult,
    JobRequest,
    LeanDeliveryRequest,
    LeanDeliveryResult,
    LeanRequest,
    LeanResult,
    PolicyFetchResult,
    RestoreResult,
    SnapshotRequest,
    SnapshotResult,
)
from agent.daemon_jobs.runtime import Runtime
from agent.daemon_jobs.snapshot_stamp import FORCED_SNAPSHOT_SECONDS, Stamp, snapshot_input_stamp
from agent.errors import GpuguardError, Interrupted
from agent.files import make_private_directory, open_regular_file, remove_flat_directory
from agent.jsonrecord import JsonRecord, RecordError
from agent.log import get_logger
from agent.statepaths import StatePaths

if TYPE_CHECKING:  # pragma: no cover
    from agent.daemon_jobs.guard_events import GuardEventForwarder

log = get_logger("job_child")
delivery_log = get_logger("delivery")

# How often the daemon looks at a running child (and at its own stopping flag) while it waits.
POLL_SECONDS = 0.05
_ENV_DROPPED = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID", "LISTEN_FDS", "LISTEN_PID", "LISTEN_FDNAMES")
# Jobs whose clean exits are routine (delivery and the lean child of the policy probe about once a minute, the
# config at every start and reload).
_QUIET_JOBS = frozenset({"deliver", "lean", "config"})
_RUNS = itertools.count(1)  # this daemon's children, for their result files' names

R = TypeVar("R", bound=JsonRecord)
# (job, config path, root, request JSON, result path) -> the child's command line; tests hand in their own.
ArgvFunction = Callable[[str, str, str, str, str], Sequence[str]]


class ChildJobFailed(GpuguardError):
    """A job child exited non-zero, was killed, or left no result (or not its job's)."""

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


def run_child(job: str, config_path: str, root: str, request: JsonRecord, result_type: Type[R], result_dir: str,
              stopping: threading.Event, argv: Optional[ArgvFunction] = None,
              timeout_seconds: Optional[float] = None) -> R:
    """Run one job child to its end and return its result, checked as ``result_type``; raises ChildJobFailed.

    The result file goes to ``result_dir`` (the state directory). When ``stopping`` is set while the child runs, it
    gets SIGTERM once and is waited for. A child still running ``timeout_seconds`` after its start (None: no limit)
    gets SIGKILL and fails.
    """
    result_path = StatePaths(result_dir).job_result(job, f"{os.getpid()}.{next(_RUNS)}")
    try:
        os.unlink(result_path)  # a leftover of a daemon that had this pid before
    except FileNotFoundError:
        pass
    request_json = json.dumps(request.to_json(), sort_keys=True)
    command = list((argv or child_argv)(job, config_path, root, request_json, result_path))
    started = time.monotonic()
    pid = _spawn(command)
    terminated = timed_out = False
    peak_kib = 0
    while True:
        peak_kib = max(peak_kib, peak_rss_kib(str(pid)))
        waited, status, usage = os.wait4(pid, os.WNOHANG)
        if waited == pid:
            break
        if timeout_seconds is not None and not timed_out and time.monotonic() - started > timeout_seconds:
            timed_out = True
            log.error("job_child_timed_out", job=job, pid=pid, timeout_seconds=timeout_seconds)
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if stopping.is_set() and not terminated:
            terminated = True
            log.info("job_child_stopping", job=job, pid=pid)
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        stopping.wait(POLL_SECONDS) if not stopping.is_set() else time.sleep(POLL_SECONDS)
    exit_code = os.waitstatus_to_exitcode(status)
    reply: Optional[ChildReply] = None
    unusable = "no result"
    try:
        with open_regular_file(result_path, nofollow=True) as handle:  # never blocks on a FIFO put there
            reply = ChildReply.from_json(json.loads(handle.read().decode("utf-8")))
    except (OSError, ValueError) as exc:  # RecordError is a ValueError
        unusable = f"no result ({type(exc).__name__}: {exc})" if not isinstance(exc, RecordError) \
            else f"result is not a child's reply ({exc})"
    finally:
        try:
            os.unlink(result_path)
        except OSError:
            pass
    if reply is not None:
        peak_kib = max(peak_kib, reply.peak_rss_kib)
    level = log.debug if job in _QUIET_JOBS and exit_code == 0 else log.info
    level("job_child_exited", job=job, pid=pid, exit_code=exit_code, max_rss_kib=peak_kib,
          cpu_seconds=round(usage.ru_utime + usage.ru_stime, 3), duration_seconds=round(time.monotonic() - started, 3))
    if timed_out and exit_code == -signal.SIGKILL:
        raise ChildJobFailed(job, f"no result within {timeout_seconds:g} s: killed")
    if terminated and exit_code == -signal.SIGTERM:  # stopped before it could set up its own SIGTERM handling
        raise Interrupted(f"job child {job}: stopped by the daemon's shutdown")
    if exit_code < 0:
        raise ChildJobFailed(job, f"killed by {signal.Signals(-exit_code).name}")
    if exit_code != 0:
        raise ChildJobFailed(job, f"exited {exit_code}")
    if reply is None:
        raise ChildJobFailed(job, unusable)
    try:
        return result_type.from_json(reply.result, ("result",))
    except RecordError as exc:
        raise ChildJobFailed(job, f"malformed result: {exc}") from None


def remove_leftover_results(state_dir: str) -> int:
    """Remove the result files a daemon killed while its children ran left behind (each run's file has its own
    name, so none is ever reused); how many. Called at the daemon's start, before any child."""
    removed = 0
    paths = StatePaths(state_dir)
    try:
        names = os.listdir(state_dir)
    except OSError:
        return 0
    for name in names:
        if name.startswith(paths.JOB_RESULT_PREFIX) and name.endswith(paths.JOB_RESULT_SUFFIX):
            try:
                os.unlink(os.path.join(state_dir, name))
                removed += 1
            except OSError:
                pass
    return removed


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


def child_context(runtime: Runtime) -> ChildContext:
    """What every child needs from the daemon's memory: the settings in force (a SIGHUP-reloaded file, or the old
    one kept after an invalid reload), the host id and name events are stamped with, this daemon's pid."""
    return ChildContext(settings=runtime.in_force.dump, host_id=runtime.emitter.host_id,
                        hostname=runtime.emitter.hostname, daemon_pid=os.getpid())


def load_config_in_child(config_path: str, root: str, request: ConfigRequest, state_dir: Optional[str],
                         stopping: threading.Event, argv: Optional[ArgvFunction] = None,
                         timeout_seconds: Optional[float] = None) -> ConfigResult:
    """The config file validated in a ``config`` child (pydantic never loads in the resident); ``state_dir`` None
    (the first load, which is what names it) puts the result file in a private temporary directory."""
    if state_dir is not None:
        return run_child("config", config_path, root, request, ConfigResult, state_dir, stopping, argv,
                         timeout_seconds)
    scratch = make_private_directory("gpuguard-config-")
    try:
        return run_child("config", config_path, root, request, ConfigResult, scratch, stopping, argv,
                         timeout_seconds)
    finally:
        remove_flat_directory(scratch)


def restore_in_child(runtime: Runtime, config_path: str) -> None:
    """At start: what the previous run stored (the snapshot's facts and pairing, the last health status), read back
    by a ``restore`` child into the daemon's state; nothing to do when neither file exists. A failed child is logged,
    and the first snapshot and health runs tell the same."""
    paths = runtime.paths
    if not any(os.path.lexists(path) for path in (paths.last_snapshot, paths.health_last_result)):
        return
    try:
        result = run_child("restore", config_path, str(runtime.host.root),
                           JobRequest(context=child_context(runtime), reason="start"), RestoreResult,
                           runtime.state_dir, runtime.stopping)
    except ChildJobFailed as exc:
        log.warning("state_read_back_failed", error=str(exc))
        return
    state = runtime.state
    with state.lock:
        state.snapshot_facts, state.pairing = result.snapshot, result.pairing
        if result.health is not None:
            state.last_health_status, state.last_health_at_seconds = result.health.status, result.health.at_seconds
            state.last_health_after_change = result.health.after_change
            state.last_workloads = result.health.workloads
    if result.events:
        runtime.emitter.on_enqueued()


class SnapshotInChild:
    """The snapshot job's body run in a child; the child hands back what the daemon shows of the stored snapshot.

    An interval run whose inputs' stamp (agent/daemon_jobs/snapshot_stamp.py) is the one of the last child's run
    starts no child, unless FORCED_SNAPSHOT_SECONDS passed since; every other reason runs one. ``argv`` replaces the
    child's command line (tests count the spawns)."""

    def __init__(self, runtime: Runtime, config_path: str, on_stack_changed: Callable[[str], None],
                 argv: Optional[ArgvFunction] = None) -> None:
        self.runtime = runtime
        self.config_path = config_path
        self.on_stack_changed = on_stack_changed
        self.argv = argv
        self._stamp: Optional[Stamp] = None
        self._ran_at = 0.0

    def run(self, reason: str = "interval") -> None:
        rt = self.runtime
        paths = StatePaths(rt.settings.state_dir)
        stamp = snapshot_input_stamp(rt.host, (paths.compiled_policy, paths.overrides))
        if reason == "interval" and stamp == self._stamp and time.monotonic() - self._ran_at < FORCED_SNAPSHOT_SECONDS:
            log.debug("snapshot_skipped", why="inputs unchanged")
            return
        request = SnapshotRequest(context=child_context(rt), reason=reason,
                                  violated_rules=tuple(sorted(rt.state.violated_rules)))
        result = run_child("snapshot", self.config_path, str(rt.host.root), request, SnapshotResult, rt.state_dir,
                           rt.stopping, self.argv)
        # Taken before the child: a change while it ran makes the next interval run again.
        self._stamp, self._ran_at = stamp, time.monotonic()
        with rt.state.lock:
            rt.state.snapshot_facts, rt.state.pairing = result.snapshot, result.pairing
            rt.state.compliant = result.compliant
            rt.state.violated_rules = frozenset(result.violated_rules)
        if result.hostname:
            rt.emitter.hostname = result.hostname
        if result.events:
            rt.emitter.on_enqueued()
        if result.stack_changed:
            self.on_stack_changed(result.stack_changed)


class HealthInChild:
    """The health job's body run in a child (skipped, as in-process, when disabled or under another root)."""

    def __init__(self, runtime: Runtime, config_path: str) -> None:
        self.runtime = runtime
        self.config_path = config_path
        self._skips = HealthSkips(runtime)

    def run(self, reason: str = "interval", mode: Optional[AskedMode] = None,
            after_change: bool = False) -> Optional[HealthSummary]:
        rt = self.runtime
        if self._skips.skipped():
            return None
        request = HealthRequest(context=child_context(rt), reason=reason, mode=mode, after_change=after_change)
        result = run_child("health", self.config_path, str(rt.host.root), request, HealthChildResult, rt.state_dir,
                           rt.stopping)
        if result.last is not None:
            with rt.state.lock:
                rt.state.last_health_status = result.last.status
                rt.state.last_health_at_seconds = result.last.at_seconds
                rt.state.last_health_after_change = result.last.after_change
                rt.state.last_workloads = result.last.workloads
        if result.events:
            rt.emitter.on_enqueued()
        return result.summary


class DeliveryInChild:
    """The delivery job's drain in a child, as DeliveryJob's ``drain``: what the child got through, or its failure.

    Once a full child (``gpuguard _job deliver``) has handed back its plan, the stdlib-only lean child
    (agent/daemon_jobs/lean_child.py, about a fifth of the full child's CPU) drains first, while the settings in
    force are the ones the plan was made with: ``delivered`` and ``down`` end there (down: its failure, the daemon
    backs off as before); ``unsure``, or a lean child that failed, starts the full child, which hands back the next
    plan. On a heartbeat the lean child also probes the hub (:class:`LeanRound`). ``argv`` and ``lean`` replace the
    two command lines (tests count the spawns)."""

    def __init__(self, runtime: Runtime, config_path: str, argv: Optional[ArgvFunction] = None,
                 lean: Optional[ArgvFunction] = None) -> None:
        self.runtime = runtime
        self.config_path = config_path
        self.argv = argv
        self.lean = LeanChild(runtime, config_path, lean)
        self._plan: Optional[Tuple[object, DeliveryPlan]] = None  # (the settings it was made with, the plan)

    def lean_request(self) -> Optional[LeanDeliveryRequest]:
        """The lean delivery's request while the plan is the one of the settings in force, else None."""
        rt = self.runtime
        if self._plan is None or self._plan[0] is not rt.in_force:
            return None
        return LeanDeliveryRequest(plan=self._plan[1], host_id=rt.emitter.host_id, daemon_pid=os.getpid())

    def __call__(self, reason: str) -> Drained:
        request = self.lean_request()
        return self.finish(reason, request, None if request is None else self.lean.run(None, request).deliver)

    def finish(self, reason: str, request: Optional[LeanDeliveryRequest],
               lean: Optional[LeanDeliveryResult]) -> Drained:
        """After the lean child's part (``request`` None: none was asked; ``lean`` None: it failed): its drain, or
        the full child's."""
        rt = self.runtime
        acknowledged_at: Optional[float] = None
        if request is not None and lean is not None:
            for batch in lean.batches:  # as drain_outbox logs the full child's
                delivery_log.debug("delivery_batch_sent", events=batch.events, accepted=batch.accepted,
                                   duplicates=batch.duplicates, first_sequence=batch.first_sequence,
                                   last_sequence=batch.last_sequence, lean=True)
            if lean.outcome != "unsure" or rt.stopping.is_set():
                return lean.drained  # stopping: no full child now, the next daemon drains the rest
            log.debug("delivery_lean_unsure", detail=lean.detail, then="the full delivery child")
            acknowledged_at = lean.drained.acknowledged_at_seconds
        result = run_child("deliver", self.config_path, str(rt.host.root),
                           JobRequest(context=child_context(rt), reason=reason), DeliverResult, rt.state_dir,
                           rt.stopping, self.argv)
        self._plan = None if result.plan is None else (rt.in_force, result.plan)
        drained = result.drained
        if drained.acknowledged_at_seconds is None and acknowledged_at is not None:
            drained = dataclasses.replace(drained, acknowledged_at_seconds=acknowledged_at)
        return drained


class GuardCheckInChild:
    """``check_and_rollback`` in a child, as the guard job's ``check``: its result, or its error raised."""

    def __init__(self, runtime: Runtime, config_path: str) -> None:
        self.runtime = runtime
        self.config_path = config_path

    def __call__(self) -> Optional[GuardChecked]:
        rt = self.runtime
        reply = run_child("guard_check", self.config_path, str(rt.host.root),
                          JobRequest(context=child_context(rt), reason="guard_check"), GuardCheckResult,
                          rt.state_dir, rt.stopping)
        if reply.interrupted is not None:
            raise Interrupted(reply.interrupted)
        if reply.error is not None:
            raise ChildJobFailed("guard_check", reply.error)
        return reply.checked


class GuardEventsInChild:
    """The guard-events forwarding in a child, as the guard job's ``forward``; started only when the file has lines
    past the stored position (a stat and a small read here)."""

    def __init__(self, runtime: Runtime, config_path: str, forwarder: GuardEventForwarder) -> None:
        self.runtime = runtime
        self.config_path = config_path
        self.forwarder = forwarder

    def __call__(self, reason: str) -> int:
        if not self.forwarder.has_new_lines():
            return 0
        rt = self.runtime
        result = run_child("guard_events", self.config_path, str(rt.host.root),
                           JobRequest(context=child_context(rt), reason=reason), ForwardResult, rt.state_dir,
                           rt.stopping)
        if result.events:
            rt.emitter.on_enqueued()
        return result.forwarded


def lean_argv(job: str, config_path: str, root: str, request_json: str, result_path: str) -> List[str]:
    """The lean child's command line: this interpreter, isolated and without site (``-I -S``: nothing of the host's
    Python environment), the agent package first on sys.path, agent/daemon_jobs/lean_child.py's main."""
    paths = [p for p in sys.path if p and os.path.isabs(p)]
    boot = (f"import sys; sys.path[:0] = {paths!r}; from agent.daemon_jobs.lean_child import main; "
            "sys.exit(main(sys.argv[1:]))")
    return [sys.executable, "-I", "-S", "-c", boot, request_json, result_path]


# The lean child's limits: the probe's deadline and each POST's timeouts are the plans'; these kill one that hangs
# past them all (then the full children decide).
PROBE_TIMEOUT_SECONDS = 240.0
LEAN_DELIVERY_TIMEOUT_SECONDS = 600.0
# The reason the policy fetch is asked with right after each heartbeat (the daemon's wiring): its probe carries the
# heartbeat's delivery (LeanRound).
HEARTBEAT_REASON = "heartbeat"


class LeanChild:
    """Starts the lean child (agent/daemon_jobs/lean_child.py) for the parts asked; a part it did not answer (the
    child failed, was killed, or left no answer for it) is None: the full child decides. ``argv`` replaces its
    command line (tests count the spawns)."""

    def __init__(self, runtime: Runtime, config_path: str, argv: Optional[ArgvFunction] = None) -> None:
        self.runtime = runtime
        self.config_path = config_path
        self.argv = argv or lean_argv

    def run(self, probe: Optional[HubProbePlan], deliver: Optional[LeanDeliveryRequest]) -> LeanResult:
        rt = self.runtime
        parts = [name for name, part in (("probe", probe), ("deliver", deliver)) if part is not None]
        try:
            result = run_child("lean", self.config_path, str(rt.host.root), LeanRequest(probe=probe, deliver=deliver),
                               LeanResult, rt.state_dir, rt.stopping, self.argv,
                               LEAN_DELIVERY_TIMEOUT_SECONDS if deliver is not None else PROBE_TIMEOUT_SECONDS)
        except ChildJobFailed as exc:
            log.info("lean_child_failed", parts=parts, error=str(exc), then="the full children")
            return LeanResult()
        if (probe is not None and result.probe is None) or (deliver is not None and result.deliver is None):
            log.info("lean_child_failed", parts=parts, error="a part asked for has no answer", then="the full children")
            return LeanResult()
        log.debug("lean_child_answered", parts=parts, probe=result.probe.outcome if result.probe else None,
                  deliver=result.deliver.outcome if result.deliver else None)
        given_up: Dict[str, List[str]] = {}  # both parts share one trust in the child: one line for both
        for part, answer in (("probe", result.probe), ("deliver", result.deliver)):
            if answer is not None and answer.trust:
                given_up.setdefault(answer.trust, []).append(part)
        for detail, given_parts in given_up.items():
            log.warning("lean_tls_anchors_given_up", parts=given_parts, detail=detail)
        return result


class LeanRound:
    """On a heartbeat, the policy probe and the heartbeat's delivery in one lean child (issue #45).

    The daemon commits the heartbeat without waking the delivery job and then asks the policy fetch, with
    HEARTBEAT_REASON. When the fetch probes, :meth:`probe` runs the delivery job once (its backoff, its outbox depth,
    its bookkeeping) with a drain that asks the lean child for the delivery's part beside the probe's; a delivery
    with nothing to send, backing off, or without a lean plan yet adds no part (without a plan its full child runs
    after, as today). When the delivery job is running already, or the fetch runs no probe (:meth:`release`: the full
    fetch, no plan, no hub), the delivery job is woken as any committed event wakes it; so it is when the full
    delivery child run after the lean part fails: that failure is the delivery job's to log and back off from, and
    the probe's answer still counts."""

    def __init__(self, delivery: DeliveryJob, drain: DeliveryInChild, wake_delivery: Callable[[str], None],
                 retry_delivery_in: Callable[[float], None]) -> None:
        self.delivery = delivery
        self.drain = drain
        self.wake_delivery = wake_delivery
        self.retry_delivery_in = retry_delivery_in

    def probe(self, plan: HubProbePlan) -> Optional[HubProbeResult]:
        """The probe's answer (None: the child failed), the heartbeat's delivery carried along."""
        answers: List[LeanResult] = []

        def drain(reason: str) -> Drained:
            request = self.drain.lean_request()
            answer = self.drain.lean.run(plan, request)
            answers.append(answer)
            return self.drain.finish(reason, request, answer.deliver)

        try:
            ran, retry_in = self.delivery.run_with(HEARTBEAT_REASON, drain)
        except Interrupted:
            raise
        except Exception as exc:  # noqa: BLE001 - the full delivery child after the lean part: the delivery's failure
            # is the delivery job's to log and back off from (it runs again on its own), never the fetch's.
            log.info("delivery_carried_failed", error=f"{type(exc).__name__}: {exc}", then="the delivery job")
            ran, retry_in = False, None
        if not ran:
            self.wake_delivery("event_enqueued")  # it loops once more when it ends, for the heartbeat's event
        elif retry_in is not None:
            self.retry_delivery_in(retry_in)
        if answers:
            return answers[0].probe
        return self.drain.lean.run(plan, None).probe

    def release(self) -> None:
        """The fetch probed nothing on this heartbeat: the delivery job sends the heartbeat on its own."""
        self.wake_delivery("event_enqueued")


# A full fetch at least this often even when every probe matched: what the full fetch decides by the clock (a
# freshness statement or bundle expiring) and the host facts of the newest statement are looked at again.
FULL_FETCH_EVERY_SECONDS = 3600.0
# A full fetch that failed on the same answers this many times in a row is tried again on them only this often
# (any other answer, a push say, starts it at once; a hub that is down never does).
SAME_FAILURE_RETRIES = 3
SAME_FAILURE_RETRY_SECONDS = 600.0


class _Seen:
    """What the last full fetch started from: its plan, the digest of the probe's answers before it when it took them
    all (else ""), the same answers when it failed on them (with how many times in a row and its detail), the stamps
    of the policy-bundle state it left, the settings and snapshot hash it ran with, and when it ended."""

    def __init__(self, plan: HubProbePlan, digest: str, stamp: Tuple[object, ...], ended_at: float,
                 failed_digest: str = "", failures: int = 0, failed_detail: str = "") -> None:
        self.plan = plan
        self.digest = digest
        self.stamp = stamp
        self.ended_at = ended_at
        self.failed_digest = failed_digest
        self.failures = failures
        self.failed_detail = failed_detail


class PolicyFetchInChild:
    """The daemon's policy fetch (agent/daemon_jobs/policy_fetch.py) in a child, or in process (tests, ``in_child``
    False); logs the outcome and, when a bundle was installed or refused, calls ``on_changed``.

    In a child, a stdlib-only probe (agent/daemon_jobs/hub_probe.py, about a tenth of the full child's CPU) runs
    first once a full fetch has handed back its plan: a hub that is down is logged as the full fetch's failure would
    be, and answers with the same digest as those before the last full fetch start no full child, unless the
    policy-bundle state, the settings or the snapshot's hash changed since, or FULL_FETCH_EVERY_SECONDS passed.
    Answers a full fetch failed on SAME_FAILURE_RETRIES times in a row are logged as that failure again and tried
    every SAME_FAILURE_RETRY_SECONDS only. Asked with HEARTBEAT_REASON, the probe carries the heartbeat's delivery
    (``lean_round``, :class:`LeanRound`). ``argv`` and ``probe`` replace the two command lines (tests count the
    spawns)."""

    def __init__(self, runtime: Runtime, config_path: str, on_changed: Callable[[str], None],
                 in_child: bool = True, argv: Optional[ArgvFunction] = None,
                 probe: Optional[ArgvFunction] = None, lean_round: Optional[LeanRound] = None) -> None:
        self.runtime = runtime
        self.config_path = config_path
        self.on_changed = on_changed
        self.in_child = in_child
        self.argv = argv
        self.lean = LeanChild(runtime, config_path, probe)
        self.round = lean_round
        self._seen: Optional[_Seen] = None

    def _stamp(self) -> Tuple[object, ...]:
        """What a full fetch's answer depends on besides the hub: the bundle state and trusted root files (a local
        ``policy install`` changes them), the settings in force, the stored snapshot's content hash."""
        rt = self.runtime
        files: List[Optional[Tuple[int, int, int]]] = []
        paths = StatePaths(rt.settings.state_dir)  # under the root, as the fetch's BundleInstaller reads them
        for path in (paths.policy_bundle_state, paths.policy_root, paths.compiled_policy):
            try:
                info = os.stat(rt.host.file(path))
                files.append((info.st_ino, info.st_size, info.st_mtime_ns))
            except OSError:
                files.append(None)
        with rt.state.lock:
            facts = rt.state.snapshot_facts
        return (tuple(files), id(rt.in_force), facts.content_hash if facts is not None else None)

    def run(self, reason: str = "interval") -> None:
        carried: List[bool] = []
        try:
            self._run(reason, carried)
        finally:
            if reason == HEARTBEAT_REASON and self.round is not None and not carried:
                self.round.release()

    def _run(self, reason: str, carried: List[bool]) -> None:
        rt = self.runtime
        if rt.settings.endpoint_url is None:
            return
        probed: Optional[HubProbeResult] = None
        seen = self._seen
        if self.in_child and seen is not None and time.monotonic() - seen.ended_at < FULL_FETCH_EVERY_SECONDS \
                and seen.stamp == self._stamp():
            if reason == HEARTBEAT_REASON and self.round is not None:
                carried.append(True)
                probed = self.round.probe(seen.plan)
            else:
                probed = self.lean.run(seen.plan, None).probe
            if probed is not None and probed.outcome == "down":
                log.warning("policy_fetch_failed", detail=probed.detail, kept="the policy in force", probe=True)
                return
            if probed is not None and probed.outcome == "answered" and probed.digest == seen.digest:
                log.debug("policy_fetch_done", outcome="unchanged", probe=True)
                return
            if probed is not None and probed.outcome == "answered" and probed.digest == seen.failed_digest \
                    and seen.failures >= SAME_FAILURE_RETRIES \
                    and time.monotonic() - seen.ended_at < SAME_FAILURE_RETRY_SECONDS:
                # The answers the full fetch failed on, again (an endpoint that serves no policy, a token it
                # refuses): the same failure, logged as such; other answers (a push) start the full fetch at once.
                log.warning("policy_fetch_failed", detail=seen.failed_detail, kept="the policy in force", probe=True)
                return
        if self.in_child:
            result = run_child("policy_fetch", self.config_path, str(rt.host.root),
                               JobRequest(context=child_context(rt), reason=reason), PolicyFetchResult, rt.state_dir,
                               rt.stopping, self.argv)
        else:
            from agent.daemon_jobs.policy_fetch import fetch_and_install

            result = fetch_and_install(rt.host, rt.job_settings(), rt.emitter.host_id)
        self._remember(result, seen, probed.digest if probed is not None and probed.outcome == "answered" else "")
        if result.trust:
            log.warning("policy_trust_not_refreshed", detail=result.trust, kept="the root and statement taken last")
        if result.outcome == "installed":
            log.info("policy_bundle_installed", serial=result.serial, detail=result.detail)
        elif result.outcome == "refused":
            log.warning("policy_bundle_refused", serial=result.serial, kind=result.kind, reason=result.detail,
                        kept="the policy in force")
        elif result.outcome == "failed":
            log.warning("policy_fetch_failed", detail=result.detail, kept="the policy in force")
        else:
            log.debug("policy_fetch_done", outcome=result.outcome, serial=result.serial)
        if result.outcome in ("installed", "refused"):
            self.on_changed(f"policy_bundle_{result.outcome}")

    def _remember(self, result: PolicyFetchResult, seen: Optional[_Seen], digest: str) -> None:
        """Keep what the next probe is compared with. A fetch that took every answer keeps their digest; one that
        failed keeps none (the next answered probe starts a full fetch again), only the answers it failed on."""
        if result.probe is None:
            self._seen = None
            return
        if seen is not None and result.probe != seen.plan:
            digest = ""  # a new plan: its answers are not the ones the digest covers
        failed = result.outcome == "failed" or bool(result.trust)
        if not failed:
            self._seen = _Seen(result.probe, digest, self._stamp(), time.monotonic())
            return
        again = seen is not None and digest != "" and digest == seen.failed_digest
        self._seen = _Seen(result.probe, "", self._stamp(), time.monotonic(), failed_digest=digest,
                           failures=(seen.failures + 1) if again and seen is not None else 1,
                           failed_detail=result.detail or result.trust)
