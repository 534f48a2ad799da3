"""The hub and the health job's deferral and health-gated rollback events: accepted, listed, described."""

from __future__ import annotations

import datetime as dt
from typing import Dict

from fastapi.testclient import TestClient

from agent.hub.dashboard.render import describe
from agent.report.events import Event, HealthDeferred, Rollback
from tests.hub.conftest import READER, bearer
from tests.hub.factories import T0, batch_json


def test_health_deferred_names_window_attempts_and_tenants() -> None:
    """A health_deferred event is described with how long the GPUs were busy, the attempts and the tenants."""
    payload = HealthDeferred(deferred_since=dt.datetime(2026, 12, 3, tzinfo=dt.timezone.utc), window_seconds=21600,
                             attempts=7, last_status="deferred", tenants=["gpu 0: pid 4242 (python3, 71.2 GiB)"])
    text = describe({"payload": payload.model_dump(mode="json")})
    assert text == "health check deferred: GPUs busy for 6 h, 7 attempts (gpu 0: pid 4242 (python3, 71.2 GiB))"


def test_health_rollback_names_the_status_that_asked_for_it() -> None:
    """A rollback for health is described with the health status that asked for it."""
    payload = Rollback(reason="health", health_status="cpu_fallback", from_versions={"rocm-core": "6.3"},
                       to_versions={"rocm-core": "6.2"}, succeeded=True)
    assert describe({"payload": payload.model_dump(mode="json")}).startswith("rolled back (health: cpu_fallback): ")


def test_the_hub_accepts_lists_and_filters_health_deferred(client: TestClient, tokens: Dict[str, str]) -> None:
    """A health_deferred event is stored, listed and found by its kind, as every other kind."""
    payload = HealthDeferred(deferred_since=T0, window_seconds=21600, attempts=7, last_status="busy",
                             after_change=True, tenants=["gpu 0: pid 4242 (python3)"])
    deferred = Event(event_id="evdeferred0001", host_id="host-a", hostname="host-a.lab", sequence=1,
                     occurred_at=T0, severity="warning", payload=payload)
    response = client.post("/v1/events", content=batch_json([deferred]),
                           headers={**bearer(tokens["host-a"]), "Content-Type": "application/json"})
    assert response.status_code == 200 and response.json()["accepted"] == ["evdeferred0001"]
    listed = client.get("/v1/events", params={"kind": "health_deferred"}, headers=bearer(tokens[READER])).json()
    [row] = listed["events"]
    assert row["event"]["payload"]["tenants"] == ["gpu 0: pid 4242 (python3)"]
