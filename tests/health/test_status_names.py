"""Every health status is known where it is shown: the dashboard's levels, `gpuguard status`, report events."""

from __future__ import annotations

import datetime as dt

import pytest

from agent.health.events import payloads_for
from agent.health.model import STATUS_EXIT_CODES, HealthResult
from agent.hub.dashboard.render import HEALTH_LEVELS, health_badge
from agent.status.assess import _health
from agent.status.facts import HealthFacts, StatusFacts
from agent.wire import FAILED_HEALTH_STATUSES as FAILED_HEALTH

NOW = dt.datetime(2026, 12, 3, 12, 0, tzinfo=dt.timezone.utc)


def test_every_status_has_a_dashboard_level_and_its_own_exit_code() -> None:
    """The dashboard knows each status; exit codes are distinct, and the old ones kept theirs."""
    assert set(HEALTH_LEVELS) == set(STATUS_EXIT_CODES)
    assert len(set(STATUS_EXIT_CODES.values())) == len(STATUS_EXIT_CODES)
    assert {k: STATUS_EXIT_CODES[k] for k in ("pass", "regression", "cpu_fallback", "failed", "timeout",
                                              "skipped")} == {"pass": 0, "regression": 20, "cpu_fallback": 21,
                                                              "failed": 22, "timeout": 23, "skipped": 24}
    assert (STATUS_EXIT_CODES["busy"], STATUS_EXIT_CODES["deferred"]) == (25, 26)
    assert 'class="badge ok"' in health_badge("busy") and 'class="badge warn"' in health_badge("deferred")


@pytest.mark.parametrize("status, state", [("busy", "ok"), ("deferred", "info"), ("regression", "fail"),
                                           ("pass", "ok")])
def test_status_command_busy_is_ok_and_deferred_is_visible(status: str, state: str) -> None:
    """`gpuguard status`: busy is not a failure, deferred is shown as info, never as failing."""
    facts = StatusFacts.model_construct(health=HealthFacts(status=status, finished_at=NOW), health_enabled=False,
                                        health_interval_seconds=21600)
    check = _health(facts, NOW)
    assert check.state == state and status in check.summary
    assert ("busy" in FAILED_HEALTH, "deferred" in FAILED_HEALTH) == (False, False)


def test_busy_and_deferred_raise_no_regression_or_fallback_event() -> None:
    """A busy or deferred result raises no health_regression (its speed was not judged) and no cpu_fallback."""
    for status in ("busy", "deferred"):
        result = HealthResult(status=status, summary=status, started_at=NOW, wall_seconds=1.0)
        assert payloads_for(result) == []
