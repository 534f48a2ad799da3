"""The child side of agent/daemon_jobs/children.py: ``gpuguard _job NAME`` runs one job body and writes its result.

    snapshot     SnapshotJob.run: events into the outbox, last-snapshot.json; result: compliance, violated rules,
                 a stack change (the daemon then asks for a health check), the stored snapshot's facts and pairing
                 (with ``stored_only``, at the daemon's start: only those of the snapshot already stored)
    guard_check  check_and_rollback (its records go to guard-events.jsonl, which the daemon forwards);
                 result: status, detail, reboot_required, or the error / the interruption
    health       HealthJob.run in the mode asked (the after-change gate and its rollback included): events into
                 the outbox; result: status, when, busy, tenants, the rollback's status
    deliver      drain_outbox with a Sender built here (the token file read again): acknowledged batches leave the
                 outbox; result: when the last batch was taken, the failure that ended the drain (the daemon backs
                 off); an unusable token file or CA bundle is an ``auth`` failure

The request (argv JSON) carries what the daemon's memory holds: the host id and name the events are stamped with,
the rules already reported as violated. The outbox is opened as it is (damage is the daemon's to salvage).
"""

from __future__ import annotations

import json
import os
import signal
import threading
from typing import Any, Dict, Optional

from agent.files import write_atomically
from agent.host import Host

PR_SET_PDEATHSIG = 1  # prctl(2) option number in linux/prctl.h


def run_job(job: str, config_path: str, host: Host, request: Dict[str, Any], result_path: str) -> int:
    """Run ``job`` once as the daemon would, write its result (JSON) to ``result_path``; returns the exit code."""
    from agent.config import Settings, load_settings
    from agent.log import configure

    # The daemon's settings in force (a reload it refused keeps the old ones); the file only when run by hand.
    settings = Settings.model_validate(request["settings"]) if "settings" in request else load_settings(config_path)
    configure(level=settings.agent.log_level)
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda signum, frame: stopping.set())
    _stop_with_the_daemon(request.get("daemon_pid"), stopping)
    if job == "guard_check":
        result = _guard_check(host, settings, stopping)
    else:
        result = _with_outbox(job, host, settings, request, stopping)
    from agent.daemon_jobs.children import peak_rss_kib_of

    result["peak_rss_kib"] = peak_rss_kib_of()  # this process's own peak, for the daemon's job_child_exited
    write_atomically(result_path, json.dumps(result, sort_keys=True) + "\n", mode=0o600)
    return 0


def _stop_with_the_daemon(daemon_pid: Any, stopping: threading.Event) -> None:
    """SIGTERM to this child when the daemon dies (SIGKILL, the OOM killer): it stops as at the daemon's shutdown
    instead of running on, orphaned, beside the next daemon. systemd kills the whole unit anyway; this covers
    hosts without it. Already orphaned (the daemon died before this line): stop at once. The kernel's "parent" is
    the thread that spawned the child: the scheduler's pool threads, and the main thread, live as long as the daemon."""
    if not isinstance(daemon_pid, int):
        return  # run by hand
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux, or no prctl: the parent check below still holds
        pass
    if os.getppid() != daemon_pid:
        stopping.set()


def _guard_check(host: Host, settings: Any, stopping: threading.Event) -> Dict[str, Any]:
    from agent.daemon_jobs.guard import _default_check
    from agent.errors import GpuguardError, Interrupted

    try:
        result = _default_check(host, settings, stopping)
    except Interrupted as exc:
        return {"interrupted": str(exc)}
    except Exception as exc:  # noqa: BLE001 - reported by the daemon's guard job as a failed check
        return {"error": f"{type(exc).__name__}: {exc}", "expected": isinstance(exc, (GpuguardError, OSError))}
    if result is None:
        return {"result": None}
    return {"result": {"status": getattr(result, "status", None), "detail": str(getattr(result, "detail", "")),
                       "reboot_required": bool(getattr(result, "reboot_required", False))}}


def _with_outbox(job: str, host: Host, settings: Any, request: Dict[str, Any],
                 stopping: threading.Event) -> Dict[str, Any]:
    from agent.daemon_jobs.runtime import EventEmitter, Runtime
    from agent.report.outbox import Outbox
    from agent.statepaths import StatePaths

    state_dir = settings.agent.state_dir
    outbox = Outbox(StatePaths(state_dir).outbox, settings.report.max_events)
    emitted = [0]

    def count() -> None:
        emitted[0] += 1

    emitter = EventEmitter(outbox, str(request["host_id"]), str(request["hostname"]), host.clock, on_enqueued=count)
    rt = Runtime(host=host, settings=settings, state_dir=state_dir, outbox=outbox, emitter=emitter,
                 stopping=stopping)
    try:
        if job == "snapshot":
            result = _snapshot(rt, request)
        elif job == "health":
            result = _health(rt, request)
        elif job == "deliver":
            result = _deliver(rt)
        else:
            raise ValueError(f"unknown job {job!r}")
        rt.report_held_damage()
    finally:
        outbox.close()
    result["events"] = emitted[0]
    return result


def _snapshot(rt: Any, request: Dict[str, Any]) -> Dict[str, Any]:
    from agent.daemon_jobs.hooks import default_hooks
    from agent.daemon_jobs.snapshot import SnapshotJob

    rt.state.violated_rules = frozenset(request.get("violated_rules") or ())
    asked: list = []
    stored_only = bool(request.get("stored_only"))
    # Reads the stored snapshot back (a damaged file is moved aside and reported).
    job = SnapshotJob(rt, None if stored_only else default_hooks().policy_check, on_stack_changed=asked.append)
    result: Dict[str, Any] = {}
    if not stored_only:
        job.run(str(request.get("reason")))
        result = {"compliant": rt.state.compliant, "violated_rules": sorted(rt.state.violated_rules),
                  "stack_changed": asked[0] if asked else None, "hostname": rt.emitter.hostname}
    state = rt.state
    result["snapshot"] = state.snapshot_facts.to_json() if state.snapshot_facts is not None else None
    result["pairing"] = state.pairing.model_dump(mode="json") if state.pairing is not None else None
    return result


def _health(rt: Any, request: Dict[str, Any]) -> Dict[str, Any]:
    from agent.daemon_jobs.health import HealthJob
    from agent.daemon_jobs.hooks import default_hooks
    from agent.daemon_jobs.runtime import load_last_snapshot

    rt.state.last_snapshot = load_last_snapshot(rt)
    mode = request.get("mode")
    summary = HealthJob(rt, default_hooks()).run(str(request.get("reason")), mode=str(mode) if mode else None,
                                                 after_change=bool(request.get("after_change")))
    if summary is None:  # no check ran: the last status stands
        return {"status": rt.state.last_health_status, "at_seconds": rt.state.last_health_at_seconds, "ran": False}
    return summary


def _deliver(rt: Any) -> Dict[str, Any]:
    from agent.daemon_jobs.delivery import Drained, drain_outbox
    from agent.errors import ConfigError, DeliveryError
    from agent.report.sender import sender_for

    report = rt.settings.report
    try:
        sender = sender_for(report)
    except ConfigError as exc:  # changed since the daemon checked it; the daemon logs it loudly and backs off
        return {"drained": Drained(failure=DeliveryError(str(report.ingest_url), "auth", str(exc))).to_json()}
    if sender is None:
        return {"drained": Drained().to_json()}
    try:
        return {"drained": drain_outbox(rt, sender).to_json()}
    finally:
        sender.close()


def parse_request(text: Optional[str]) -> Dict[str, Any]:
    """The --request JSON object."""
    value = json.loads(text or "{}")
    if not isinstance(value, dict):
        raise ValueError("--request must be a JSON object")
    return value
