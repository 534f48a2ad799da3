"""A small fleet for the dashboard and /metrics tests, written through the hub's real store (SQLiteStore.ingest):
compliant hosts, a violating one, a regressed one, a stale one, and one whose agent sends hostile text."""

from __future__ import annotations

import datetime as dt
from typing import Dict, List

from agent.hub.store import make_store
from agent.report.events import Event
from agent.snapshot.diff import Change
from agent.snapshot.pairing import Pairing
from tests.hub.factories import CUDA_12, ROCM_62, ROCM_63, event

# A fixed time, long past: every hub these tests seed reads it from an injected clock, never from the wall clock,
# so a slow run cannot age the heartbeats (issue 38), and a page that read the real clock would show it.
NOW = dt.datetime(2025, 6, 2, 12, 0, tzinfo=dt.timezone.utc)
HOSTILE_HOSTNAME = "evil<b>bold</b>&amp;"
HOSTILE_VERSION = "<img src=x onerror=alert(1)>"
REGRESSED_HEALTH = ["pass", "pass", "pass", "regression", "regression", "pass", "cpu_fallback"]
# host_id -> what the pages must show
EXPECTED = {"host_count": 8, "compliant": 5, "violating": 1, "unknown": 2, "stale": 1}


def _heartbeats(host_id: str, start: dt.datetime, statuses: List[str], pairing: Pairing, compliant: bool,
                hostname: str) -> List[Event]:
    out = []
    for i, status in enumerate(statuses):
        ev = event(host_id, "heartbeat", at=start + dt.timedelta(minutes=10 * i), pairing=pairing,
                   compliant=compliant, hostname=hostname)
        out.append(ev.model_copy(update={"payload": ev.payload.model_copy(update={"last_health_status": status})}))
    return out


def fleet_events(now: dt.datetime = NOW) -> Dict[str, List[Event]]:
    """Per host, its events (all recent except the stale host's)."""
    hour = dt.timedelta(hours=1)
    fleet: Dict[str, List[Event]] = {}
    for n in (1, 2, 3):
        host_id = f"gpu-ok-{n:02d}"
        fleet[host_id] = _heartbeats(host_id, now - hour, ["pass"] * 3, ROCM_62, True, f"{host_id}.dc1")
    bad = "gpu-bad-01"
    fleet[bad] = _heartbeats(bad, now - 2 * hour, ["pass"] * 2, ROCM_63, False, f"{bad}.dc1") + [
        event(bad, "policy_violation", at=now - 90 * dt.timedelta(minutes=1), hostname=f"{bad}.dc1")
        .model_copy(update={"severity": "critical"})]
    reg = "gpu-regressed-01"
    changed = event(reg, "snapshot_changed", at=now - 3 * hour, hostname=f"{reg}.dc2", pairing=CUDA_12)
    changed = changed.model_copy(update={"severity": "warning", "payload": changed.payload.model_copy(update={
        "changes": [Change(section="packages", path="nvidia-driver", old="535.183.01", new="550.90.07")]})})
    fleet[reg] = [changed, *_heartbeats(reg, now - 2 * hour, REGRESSED_HEALTH, CUDA_12, True, f"{reg}.dc2"),
                  event(reg, "health_regression", at=now - 80 * dt.timedelta(minutes=1), hostname=f"{reg}.dc2")
                  .model_copy(update={"severity": "warning"}),
                  event(reg, "cpu_fallback", at=now - 45 * dt.timedelta(minutes=1), hostname=f"{reg}.dc2")
                  .model_copy(update={"severity": "critical"})]
    stale = "gpu-stale-01"
    fleet[stale] = _heartbeats(stale, now - 50 * hour, ["pass"], ROCM_62, True, f"{stale}.dc1")
    hostile = "gpu-odd-01"
    odd_pairing = ROCM_62.model_copy(update={"rocm": HOSTILE_VERSION})
    fleet[hostile] = [event(hostile, "snapshot_changed", at=now - hour, hostname=HOSTILE_HOSTNAME,
                            pairing=odd_pairing)]
    newcomer = "gpu-new-01"
    fleet[newcomer] = [event(newcomer, "cpu_fallback", at=now - hour, hostname=f"{newcomer}.dc3")
                       .model_copy(update={"severity": "critical"})]
    return fleet


def seed(database_url: str, now: dt.datetime = NOW) -> Dict[str, List[Event]]:
    """Store the fleet, each event received at the time it carries (the hub orders and ages events by receipt); the
    stale host was last heard from two days ago, the others just now (their newest event resent: heard, not new)."""
    store = make_store(database_url)
    store.open()
    fleet = fleet_events(now)
    try:
        for host_id, events in fleet.items():
            ordered = sorted(events, key=lambda e: e.occurred_at)
            for one in ordered:
                store.ingest([[one]], received_at=one.occurred_at)
            if host_id != "gpu-stale-01":
                store.ingest([ordered[-1:]], received_at=now)
    finally:
        store.close()
    return fleet
