"""The heartbeat job: one "alive" event with the pairing, compliance, last health result, rollback coverage and
outbox depth."""

from __future__ import annotations

import random
from typing import Optional

from agent import __version__
from agent.daemon_jobs.resident_settings import ResidentSettings
from agent.daemon_jobs.runtime import Runtime
from agent.report.plain import PlainHeartbeat, PlainRollbackCoverage
from agent.rollback_coverage import read_coverage
from agent.statepaths import StatePaths


def first_heartbeat_in_seconds(settings: ResidentSettings, rng: Optional[random.Random] = None) -> float:
    """Seconds from start to the first heartbeat: one interval plus a random phase of at most
    ``startup_jitter_seconds`` (and at most one interval). Later heartbeats keep that phase."""
    interval = settings.heartbeat_interval_seconds
    return interval + (rng or random.Random()).uniform(0.0, min(interval, settings.startup_jitter_seconds))


class HeartbeatJob:
    """Commits a Heartbeat event (dropped first when the outbox is full)."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime

    def run(self, reason: str = "interval") -> None:
        rt = self.runtime
        rt.report_held_damage()
        state = rt.state
        with state.lock:
            facts, pairing = state.snapshot_facts, state.pairing
            compliant, health = state.compliant, state.last_health_status
        rt.emitter.emit(PlainHeartbeat(agent_version=__version__, uptime_seconds=round(state.uptime_seconds(), 3),
                                       content_hash=facts.content_hash if facts else None,
                                       outbox_depth=rt.outbox.depth(), pairing=pairing, compliant=compliant,
                                       last_health_status=health, rollback_coverage=rollback_coverage(rt)))


def rollback_coverage(rt: Runtime) -> Optional[PlainRollbackCoverage]:
    """The rollback coverage the last known-good recording wrote (each kept file checked), None before any."""
    path = rt.host.path(StatePaths(rt.settings.state_dir).rollback_coverage)
    coverage = read_coverage(str(path), str(rt.host.root))
    if coverage is None:
        return None
    return PlainRollbackCoverage(guarded=coverage.guarded, restorable=coverage.restorable,
                                 by_source=dict(coverage.by_source), not_restorable=coverage.not_restorable[:200],
                                 inexact=tuple(sorted(coverage.inexact))[:200])
