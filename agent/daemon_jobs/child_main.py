"""The child side of agent/daemon_jobs/children.py: ``gpuguard _job NAME`` runs one job body and writes its result.

    config       load and validate the config file (pydantic), check the token file and CA bundle; on SIGHUP also
                 keep the running state directory and compile the policy for the apt hook (the new settings', or the
                 old ones' when the file is refused); result: the resident's view and the whole as JSON, or why not
    restore      at the daemon's start: the stored snapshot read back (a damaged file moved aside and reported), its
                 facts and pairing, the last health result's status
    snapshot     SnapshotJob.run: events into the outbox, last-snapshot.json; result: compliance, violated rules,
                 a stack change (the daemon then asks for a health check), the stored snapshot's facts and pairing
    guard_check  check_and_rollback (its records go to guard-events.jsonl, which guard_events forwards);
                 result: status, detail, reboot_required, or the error / the interruption
    guard_events GuardEventForwarder.run: new guard-events.jsonl lines validated and committed to the outbox
    health       HealthJob.run in the mode asked (the after-change gate and its rollback included): events into
                 the outbox; after a change, the maintenance hand-off's verdict (daemon_jobs/handoff.py); result:
                 its summary, the last status
    deliver      drain_outbox with a Sender built here (the token file read again): acknowledged batches leave the
                 outbox; result: when the last batch was taken, the failure that ended the drain (the daemon backs
                 off); an unusable token file or CA bundle is an ``auth`` failure
    policy_fetch the hub's policy bundle for this host fetched (conditional GET) and installed as policy install
                 does (agent/daemon_jobs/policy_fetch.py), a new one beginning the maintenance hand-off, any
                 other outcome looking once more at a hold still draining (handoff.poll_drain); result:
                 unchanged, installed, refused (why) or failed

Requests and results are the records of agent/daemon_jobs/protocol.py; a request that is not its job's record is a
usage error (one line, exit 2). The request carries what the daemon's memory holds: the settings in force, the host
id and name the events are stamped with, the rules already reported as violated. The outbox is opened as it is
(damage is the daemon's to salvage).
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import threading
from typing import TYPE_CHECKING, Dict, Optional, Type, TypeVar

from agent.daemon_jobs.protocol import (
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
    HealthSeen,
    JobRequest,
    RestoreResult,
    SnapshotRequest,
    SnapshotResult,
)
from agent.errors import UsageError
from agent.files import write_atomically
from agent.host import Host
from agent.jsonrecord import JsonObject, JsonRecord, RecordError

if TYPE_CHECKING:  # pragma: no cover
    from agent.config import Settings
    from agent.daemon_jobs.runtime import Runtime
    from agent.report.settings import ReportSettings

PR_SET_PDEATHSIG = 1  # prctl(2) option number in linux/prctl.h
Q = TypeVar("Q", bound=JsonRecord)


def run_job(job: str, config_path: str, host: Host, request: JsonObject, result_path: str) -> int:
    """Run ``job`` once as the daemon would, write its result (JSON) to ``result_path``; returns the exit code."""
    from agent.log import configure

    stopping = threading.Event()
    _stop_on_sigterm(stopping)
    result: JsonRecord
    if job == "config":
        asked = _request(ConfigRequest, request)
        _stop_with_the_daemon(asked.daemon_pid, stopping)
        result = load_config(config_path, host, asked)
    else:
        job_request: JobRequest = _request(_REQUESTS.get(job, JobRequest), request)
        settings = _settings_in_force(job_request)
        configure(level=settings.agent.log_level)
        _stop_with_the_daemon(job_request.context.daemon_pid, stopping)
        if job == "guard_check":
            result = _guard_check(host, settings, stopping)
        elif job == "policy_fetch":
            from agent.daemon_jobs.handoff import after_fetch
            from agent.daemon_jobs.policy_fetch import fetch_and_install

            fetched = fetch_and_install(host, settings, job_request.context.host_id)
            # admitted by a rollout: the host is about to change, so the hand-off begins; else a hold begun by an
            # earlier fetch may be waiting for Slurm to drain the node
            after_fetch(host, settings, fetched.outcome, fetched.rollout_fields, fetched.serial)
            result = fetched
        else:
            result = _with_outbox(job, host, settings, job_request, stopping)
    from agent.daemon_jobs.procstatus import peak_rss_kib

    # This process's own peak, for the daemon's job_child_exited.
    reply = ChildReply(peak_rss_kib=peak_rss_kib(), result=result.to_json())
    write_atomically(result_path, json.dumps(reply.to_json(), sort_keys=True) + "\n", mode=0o600)
    return 0


# The jobs whose request says more than JobRequest.
_REQUESTS: Dict[str, Type[JobRequest]] = {"snapshot": SnapshotRequest, "health": HealthRequest}


def _request(kind: Type[Q], request: JsonObject) -> Q:
    try:
        return kind.from_json(request, ("--request",))
    except RecordError as exc:
        raise UsageError(str(exc)) from None


def _settings_in_force(request: JobRequest) -> Settings:
    from agent.config import Settings

    return Settings.model_validate(request.context.settings)


def load_config(config_path: str, host: Host, request: ConfigRequest) -> ConfigResult:
    """The config file validated, the token file and CA bundle checked; on a reload (``in_force``: the settings the
    daemon runs with) the state directory kept and, with ``compile_policy``, the policy compiled for the apt hook with
    the settings that stand. Runs in the ``config`` child (and in-process when the daemon runs its bodies there)."""
    from agent.config import Settings, load_settings
    from agent.daemon_jobs.guard import recompile_policy
    from agent.daemon_jobs.resident_settings import ConfigProblem, ResidentSettings
    from agent.errors import ConfigError
    from agent.log import get_logger
    from agent.report.credentials import read_credentials

    in_force = None if request.in_force is None else Settings.model_validate(request.in_force)
    try:
        new = load_settings(config_path)
        if new.report.endpoint_url is not None:
            read_credentials(new.report)  # a bad token file or CA bundle refuses the start or the reload
    except ConfigError as exc:
        if request.compile_policy and in_force is not None:
            recompile_policy(host, in_force)
        return ConfigResult(problem=ConfigProblem(exc.path, tuple(exc.problems)))
    if in_force is not None and new.agent.state_dir != in_force.agent.state_dir:
        get_logger("daemon").warning("config_reload_partial", ignored="agent.state_dir",
                                     reason="takes effect on restart")
        new = new.model_copy(update={"agent": new.agent.model_copy(update={"state_dir": in_force.agent.state_dir})})
    if request.compile_policy:
        recompile_policy(host, new)  # the apt hook reads only the compiled file
    return ConfigResult(view=ResidentSettings.of(new), dump=new.model_dump(mode="json"))


def _stop_on_sigterm(stopping: threading.Event) -> None:
    """SIGTERM sets ``stopping``, from a thread that reads the signal's wakeup pipe, never from the handler.

    A handler that called ``stopping.set()`` deadlocked this process for ever: the Event's lock is not reentrant, and
    a second SIGTERM ran the handler again while the first was inside ``set()`` (or while this thread held the lock in
    ``stopping.wait()``). Several come when the daemon is killed: the kernel sends PR_SET_PDEATHSIG each time this
    child is handed from a dying daemon thread to the next. The pipe is close-on-exec (nothing this job starts keeps
    it), and its writing end non-blocking, as ``signal.set_wakeup_fd`` asks.
    """
    read_fd, write_fd = os.pipe2(os.O_CLOEXEC)
    os.set_blocking(write_fd, False)
    signal.signal(signal.SIGTERM, _no_op)
    signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)

    def watch() -> None:
        while not stopping.is_set():
            if signal.SIGTERM in os.read(read_fd, 64):
                stopping.set()

    threading.Thread(target=watch, name="sigterm", daemon=True).start()


def _no_op(signum: int, frame: object) -> None:
    """The Python-level SIGTERM handler: the C handler already wrote the signal number to the wakeup pipe."""


def _stop_with_the_daemon(daemon_pid: Optional[int], stopping: threading.Event) -> None:
    """SIGTERM to this child when the daemon dies (SIGKILL, the OOM killer): it stops as at the daemon's shutdown
    instead of running on, orphaned, beside the next daemon. systemd kills the whole unit anyway; this covers
    hosts without it. Already orphaned (the daemon died before this line): stop at once. The kernel's "parent" is
    the thread that spawned the child: a job's thread (agent/daemon_jobs/scheduler.py) ends only after the child it
    waits for, and the main thread lives as long as the daemon."""
    if daemon_pid is None:
        return  # run by hand
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux, or no prctl: the parent check below still holds
        pass
    if os.getppid() != daemon_pid:
        stopping.set()


def _guard_check(host: Host, settings: Settings, stopping: threading.Event) -> GuardCheckResult:
    from agent.daemon_jobs.guard import _default_check
    from agent.errors import GpuguardError, Interrupted

    try:
        result = _default_check(host, settings, stopping)
    except Interrupted as exc:
        return GuardCheckResult(interrupted=str(exc))
    except Exception as exc:  # noqa: BLE001 - reported by the daemon's guard job as a failed check
        return GuardCheckResult(error=f"{type(exc).__name__}: {exc}",
                                expected=isinstance(exc, (GpuguardError, OSError)))
    return GuardCheckResult(checked=GuardChecked.of(result))


def _with_outbox(job: str, host: Host, settings: Settings, request: JobRequest,
                 stopping: threading.Event) -> JsonRecord:
    """Run a job that commits events, beside the resident's outbox; its result with the count of events committed."""
    from agent.daemon_jobs.resident_settings import SettingsInForce
    from agent.daemon_jobs.runtime import EventEmitter, Runtime
    from agent.report.outbox import Outbox
    from agent.statepaths import StatePaths

    state_dir = settings.agent.state_dir
    outbox = Outbox(StatePaths(state_dir).outbox, settings.report.max_events)
    emitted = [0]

    def count() -> None:
        emitted[0] += 1

    context = request.context
    emitter = EventEmitter(outbox, context.host_id, context.hostname, host.clock, on_enqueued=count)
    rt = Runtime(host=host, in_force=SettingsInForce.of(settings), state_dir=state_dir, outbox=outbox,
                 emitter=emitter, stopping=stopping)
    try:
        result: JsonRecord
        if job == "snapshot" and isinstance(request, SnapshotRequest):
            result = _snapshot(rt, request)
        elif job == "health" and isinstance(request, HealthRequest):
            result = _health(rt, request)
        elif job == "restore":
            result = _restore(rt)
        elif job == "guard_events":
            result = _guard_events(rt, request)
        elif job == "deliver":
            result = _deliver(rt)
        else:
            raise UsageError(f"unknown job {job!r}")
        rt.report_held_damage()
    finally:
        outbox.close()
    return dataclasses.replace(result, events=emitted[0])


def _stored(rt: Runtime) -> RestoreResult:
    """What the daemon shows of the snapshot this process took or read back."""
    state = rt.state
    return RestoreResult(events=0, snapshot=state.snapshot_facts, pairing=state.pairing)


def _restore(rt: Runtime) -> RestoreResult:
    from agent.daemon_jobs.health import HealthJob
    from agent.daemon_jobs.hooks import Hooks
    from agent.daemon_jobs.snapshot import SnapshotJob
    from agent.health.last import load_last_result

    SnapshotJob(rt, None)  # reads the stored snapshot back (a damaged file is moved aside and reported)
    HealthJob(rt, Hooks(health_last=load_last_result))  # restores the last status (an unreadable one: logged)
    state = rt.state
    health = None if state.last_health_status is None else HealthSeen(state.last_health_status,
                                                                       state.last_health_at_seconds,
                                                                       workloads=state.last_workloads)
    return dataclasses.replace(_stored(rt), health=health)


def _snapshot(rt: Runtime, request: SnapshotRequest) -> SnapshotResult:
    from agent.daemon_jobs.hooks import default_hooks
    from agent.daemon_jobs.snapshot import SnapshotJob

    rt.state.violated_rules = frozenset(request.violated_rules)
    asked: list[str] = []
    SnapshotJob(rt, default_hooks().policy_check, on_stack_changed=asked.append).run(request.reason)
    stored = _stored(rt)
    return SnapshotResult(events=0, compliant=rt.state.compliant, violated_rules=tuple(sorted(rt.state.violated_rules)),
                          stack_changed=asked[0] if asked else None, hostname=rt.emitter.hostname,
                          snapshot=stored.snapshot, pairing=stored.pairing)


def _health(rt: Runtime, request: HealthRequest) -> HealthChildResult:
    from agent.daemon_jobs.health import HealthJob
    from agent.daemon_jobs.hooks import default_hooks
    from agent.daemon_jobs.runtime import load_last_snapshot

    rt.state.last_snapshot = load_last_snapshot(rt)
    summary = HealthJob(rt, default_hooks()).run(request.reason, mode=request.mode, after_change=request.after_change)
    if summary is not None and request.after_change:  # the post-change check: give the node back, or keep it out
        from agent.daemon_jobs.handoff import end_after_check

        end_after_check(rt.host, rt.job_settings(), summary.status)
    state = rt.state
    last = None if state.last_health_status is None else HealthSeen(state.last_health_status,
                                                                    state.last_health_at_seconds,
                                                                    state.last_health_after_change,
                                                                    state.last_workloads)
    return HealthChildResult(events=0, summary=summary, last=last)


def _guard_events(rt: Runtime, request: JobRequest) -> ForwardResult:
    from agent.daemon_jobs.guard_events import GuardEventForwarder, guard_events_path

    return ForwardResult(events=0, forwarded=GuardEventForwarder(rt, guard_events_path(rt)).run(request.reason))


def _deliver(rt: Runtime) -> DeliverResult:
    from agent.daemon_jobs.delivery import DeliveryFailure, Drained, drain_outbox
    from agent.errors import ConfigError, DeliveryError
    from agent.report.sender import sender_for

    report = rt.job_settings().report
    try:
        sender = sender_for(report)
    except ConfigError as exc:  # changed since the daemon checked it; the daemon logs it loudly and backs off
        failure = DeliveryFailure.of(DeliveryError(str(report.ingest_url), "auth", str(exc)))
        return DeliverResult(events=0, drained=Drained(failure=failure))
    if sender is None:
        return DeliverResult(events=0, drained=Drained())
    try:
        return DeliverResult(events=0, drained=drain_outbox(rt, sender), plan=lean_delivery_plan(report,
                                                                                                 rt.outbox.path,
                                                                                                 rt.state_dir))
    finally:
        sender.close()


def lean_delivery_plan(report: ReportSettings, outbox_path: str, state_dir: str) -> Optional[DeliveryPlan]:
    """How the Sender (agent/report/sender.py) sends now, for the stdlib-only delivery child
    (agent/daemon_jobs/lean_delivery.py), with the CA file's hashed copy under ``state_dir`` made sure of; None
    where that child could not send as requests does: a proxy or a .netrc from the environment for this URL."""
    import requests
    from requests.utils import DEFAULT_CA_BUNDLE_PATH, get_netrc_auth

    from agent.report.plain import EVENT_SCHEMA_VERSION
    from agent.report.sender import USER_AGENT
    from agent.report.tls_anchors import plan_anchors

    url = report.ingest_url
    if url is None:
        return None
    session = requests.Session()
    try:  # what Sender's post merges in from the environment (trust_env): proxies, REQUESTS_CA_BUNDLE
        merged = session.merge_environment_settings(url, {}, None, report.ca_bundle or True, None)
    finally:
        session.close()
    if merged.get("proxies") or get_netrc_auth(url) is not None:
        return None
    verify = merged.get("verify")
    ca_file = verify if isinstance(verify, str) else DEFAULT_CA_BUNDLE_PATH  # True: requests' own bundle
    anchor_dir, stamp = plan_anchors(url, ca_file, state_dir)
    return DeliveryPlan(ingest_url=url, token_file=report.token_file, ca_file=ca_file,
                        ca_anchor_dir=anchor_dir, ca_file_stamp=stamp,
                        connect_timeout_seconds=report.connect_timeout_seconds,
                        read_timeout_seconds=report.read_timeout_seconds, batch_size=report.batch_size,
                        user_agent=USER_AGENT, schema_version=EVENT_SCHEMA_VERSION, outbox_path=outbox_path)


def parse_request(text: Optional[str]) -> JsonObject:
    """The --request JSON object (read as its job's request record by :func:`run_job`)."""
    try:
        value = json.loads(text or "{}")
    except ValueError as exc:
        raise UsageError(f"--request: not JSON ({exc})") from None
    if not isinstance(value, dict):
        raise UsageError("--request must be a JSON object")
    return value
