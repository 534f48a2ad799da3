"""The first heartbeat's random phase: one interval plus at most startup_jitter_seconds (capped at one interval)."""

from __future__ import annotations

import random

import pytest

from agent.config import Settings
from agent.daemon_jobs.heartbeat import first_heartbeat_in_seconds
from agent.daemon_jobs.resident_settings import ResidentSettings
from agent.report.settings import ReportSettings


def view(**report: float) -> ResidentSettings:
    return ResidentSettings.of(Settings(report=ReportSettings(**report)))


@pytest.mark.parametrize("interval, jitter, low, high", [
    (60.0, 60.0, 60.0, 120.0),
    (60.0, 10.0, 60.0, 70.0),
    (600.0, 60.0, 600.0, 660.0),
    (0.2, 60.0, 0.2, 0.4),  # capped at one interval
    (60.0, 0.0, 60.0, 60.0),  # 0: no jitter, the first heartbeat after exactly one interval
])
def test_first_heartbeat_falls_in_its_window(interval: float, jitter: float, low: float, high: float) -> None:
    """Every draw lies in [interval, interval + min(interval, jitter)]."""
    settings = view(heartbeat_interval_seconds=interval, startup_jitter_seconds=jitter)
    rng = random.Random(7)
    draws = [first_heartbeat_in_seconds(settings, rng) for _ in range(2000)]
    assert low <= min(draws) and max(draws) <= high


def test_a_fleet_started_together_spreads_over_the_interval() -> None:
    """10,000 hosts started at once at the defaults (60 s, 60 s): no one-second slot gets more than 2x its share."""
    settings = view()
    rng = random.Random(1)
    slots = [0] * 60
    for _ in range(10_000):
        slots[int(first_heartbeat_in_seconds(settings, rng) - settings.heartbeat_interval_seconds) % 60] += 1
    assert max(slots) < 2 * 10_000 / 60 and min(slots) > 0.5 * 10_000 / 60


def test_startup_jitter_is_an_agent_toml_setting() -> None:
    """[report] startup_jitter_seconds parses, defaults to 60 and refuses negatives."""
    from agent.config import parse_settings
    from agent.errors import ConfigError

    assert ReportSettings().startup_jitter_seconds == 60.0
    assert parse_settings("[report]\nstartup_jitter_seconds = 5\n").report.startup_jitter_seconds == 5.0
    with pytest.raises(ConfigError, match="startup_jitter_seconds"):
        parse_settings("[report]\nstartup_jitter_seconds = -1\n")
