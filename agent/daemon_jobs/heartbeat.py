"""The heartbeat job: one "alive" event with the pairing, compliance, last health result and outbox depth."""

from __future__ import annotations

from agent import __version__
from agent.daemon_jobs.runtime import Runtime
from agent.report.events import Heartbeat


class HeartbeatJob:
    """Commits a Heartbeat event (dropped first when the outbox is full)."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime

    def run(self, reason: str = "interval") -> None:
        rt = self.runtime
        rt.report_held_damage()
        state = rt.state
        with state.lock:
            snap, pairing = state.last_snapshot, state.pairing
            compliant, health = state.compliant, state.last_health_status
        rt.emitter.emit(Heartbeat(agent_version=__version__, uptime_seconds=round(state.uptime_seconds(), 3),
                                  content_hash=snap.content_hash if snap else None,
                                  outbox_depth=rt.outbox.depth(), pairing=pairing, compliant=compliant,
                                  last_health_status=health))
