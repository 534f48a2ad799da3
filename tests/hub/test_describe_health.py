"""The dashboard's one-line descriptions of the health job's deferral and health-gated rollback events."""

from __future__ import annotations

import datetime as dt

from agent.hub.dashboard.render import describe
from agent.report.events import HealthDeferred, Rollback


def test_health_deferred_names_window_attempts_and_tenants() -> None:
    payload = HealthDeferred(deferred_since=dt.datetime(2026, 12, 3, tzinfo=dt.timezone.utc), window_seconds=21600,
                             attempts=7, last_status="deferred", tenants=["gpu 0: pid 4242 (python3, 71.2 GiB)"])
    text = describe({"payload": payload.model_dump(mode="json")})
    assert text == "health check deferred: GPUs busy for 6 h, 7 attempts (gpu 0: pid 4242 (python3, 71.2 GiB))"


def test_health_rollback_names_the_status_that_asked_for_it() -> None:
    payload = Rollback(reason="health", health_status="cpu_fallback", from_versions={"rocm-core": "6.3"},
                       to_versions={"rocm-core": "6.2"}, succeeded=True)
    assert describe({"payload": payload.model_dump(mode="json")}).startswith("rolled back (health: cpu_fallback): ")
