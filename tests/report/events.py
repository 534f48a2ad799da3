"""Builders of report events for tests."""

from __future__ import annotations

import datetime as dt

from agent.report.events import Event, Heartbeat, PolicyViolation, Rollback, SnapshotChanged, TransactionBlocked
from agent.snapshot.pairing import Pairing

WHEN = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)


def event(kind: str = "heartbeat", event_id: str = None) -> Event:  # type: ignore[assignment]
    """One event of the given payload kind from host h1."""
    payloads = {
        "heartbeat": lambda: Heartbeat(agent_version="0.1.0", uptime_seconds=1.0),
        "snapshot_changed": lambda: SnapshotChanged(new_hash="sha256:00", pairing=Pairing()),
        "policy_violation": lambda: PolicyViolation(rule="rocm-pin", message="rocm moved"),
        "transaction_blocked": lambda: TransactionBlocked(tool="apt", rule="rocm-pin", message="blocked"),
        "rollback": lambda: Rollback(reason="health", from_versions={"a": "2"}, to_versions={"a": "1"},
                                     succeeded=True),
    }
    extra = {"event_id": event_id} if event_id else {}
    return Event(host_id="h1", hostname="host-1", occurred_at=WHEN, payload=payloads[kind](), **extra)
