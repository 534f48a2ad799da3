"""The heartbeat job: one "alive" event with the pairing, compliance, last health result, rollback coverage and
outbox depth.

The last health result comes with when the daemon saw it finish (``last_health_at``; after a restart, when the
stored check started) and whether it was the check after a package change (``last_health_after_change``; not
sent when the daemon does not know, e.g. after a restart): a staged rollout counts a pass as evidence only when it
finished after the host's admission (docs/hub.md, "Staged rollouts"). The registered workloads' verdicts of that
check, with the stack each ran on, feed the hub's verified-stack matrix (docs/hub.md, "Verified stacks")."""

from __future__ import annotations

import datetime as dt
import random
from typing import Any, Dict, Optional

from agent import __version__
from agent.bundle.state import read_bundle_state
from agent.daemon_jobs.resident_settings import ResidentSettings
from agent.daemon_jobs.runtime import Runtime
from agent.errors import GpuguardError
from agent.log import get_logger
from agent.report.plain import PlainHeartbeat, PlainRollbackCoverage
from agent.rollback_coverage import read_coverage
from agent.statepaths import StatePaths

log = get_logger("daemon.heartbeat")


def first_heartbeat_in_seconds(settings: ResidentSettings, rng: Optional[random.Random] = None) -> float:
    """Seconds from start to the first heartbeat: one interval plus a random phase of at most
    ``startup_jitter_seconds`` (and at most one interval). Later heartbeats keep that phase."""
    interval = settings.heartbeat_interval_seconds
    return interval + (rng or random.Random()).uniform(0.0, min(interval, settings.startup_jitter_seconds))


def first_policy_fetch_in_seconds(settings: ResidentSettings, rng: Optional[random.Random] = None) -> float:
    """Seconds from start to the first policy fetch: a random phase of at most ``startup_jitter_seconds`` (and at
    most one heartbeat interval), so a fleet restarted at once does not ask the hub at once."""
    interval = settings.heartbeat_interval_seconds
    return (rng or random.Random()).uniform(0.0, min(interval, settings.startup_jitter_seconds))


class HeartbeatJob:
    """Commits a Heartbeat event (dropped first when the outbox is full); ``wake_delivery`` False: the daemon has it
    delivered with the policy probe (agent/daemon_jobs/children.py's LeanRound), not by waking the delivery job."""

    def __init__(self, runtime: Runtime, wake_delivery: bool = True) -> None:
        self.runtime = runtime
        self.wake_delivery = wake_delivery

    def run(self, reason: str = "interval") -> None:
        rt = self.runtime
        rt.report_held_damage()
        state = rt.state
        with state.lock:
            facts, pairing = state.snapshot_facts, state.pairing
            compliant, health = state.compliant, state.last_health_status
            health_at_seconds, after_change = state.last_health_at_seconds, state.last_health_after_change
            workloads = state.last_workloads
        settings = rt.settings
        policy = policy_fields(rt)
        rt.emitter.emit(PlainHeartbeat(agent_version=__version__, uptime_seconds=round(state.uptime_seconds(), 3),
                                       content_hash=facts.content_hash if facts else None,
                                       outbox_depth=rt.outbox.depth(), pairing=pairing, compliant=compliant,
                                       last_health_status=health, last_health_at=_utc(health_at_seconds),
                                       last_health_after_change=after_change if health else None,
                                       labels=dict(settings.labels) or None, workloads=workloads,
                                       unknown_versions=facts.unknown_versions or None if facts else None,
                                       rollback_coverage=rollback_coverage(rt), **policy),
                        wake_delivery=self.wake_delivery)


def _utc(seconds: Optional[float]) -> Optional[dt.datetime]:
    return None if seconds is None else dt.datetime.fromtimestamp(seconds, dt.timezone.utc)


def rollback_coverage(rt: Runtime) -> Optional[PlainRollbackCoverage]:
    """The rollback coverage the last known-good recording wrote (each kept file checked), None before any."""
    coverage = read_coverage(rt.host.file(StatePaths(rt.settings.state_dir).rollback_coverage), str(rt.host.root))
    if coverage is None:
        return None
    return PlainRollbackCoverage(guarded=coverage.guarded, restorable=coverage.restorable,
                                 by_source=dict(coverage.by_source), not_restorable=coverage.not_restorable[:200],
                                 inexact=tuple(sorted(coverage.inexact))[:200])


def policy_fields(rt: Runtime) -> Dict[str, Any]:
    """The heartbeat's policy fields: the source, the bundle serial in force, a refusal newer than it (from
    policy-bundle/state.json, agent/bundle/state.py); a damaged state file reports the source alone."""
    source = rt.settings.policy_source
    fields: Dict[str, Any] = {"policy_source": source if source in ("local", "bundle") else None}
    try:
        bundle = read_bundle_state(rt.host.file(rt.paths.policy_bundle_state))
    except GpuguardError as exc:
        log.warning("policy_bundle_state_unreadable", error=str(exc))
        return fields
    fields["policy_serial"] = bundle.serial
    if bundle.refusal_pending and bundle.refused is not None:
        fields["policy_refused_serial"] = bundle.refused.serial
        fields["policy_refused_reason"] = bundle.refused.reason[:2000]
        fields["policy_refused_kind"] = bundle.refused.kind
    attention = bundle.attention(rt.host.clock())
    if attention:
        fields["policy_attention"] = attention
    return fields
