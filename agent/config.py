"""Agent settings: one frozen model per area, composed here, loaded from /etc/gpuguard/agent.toml.

Every problem in the file is reported at once as ``file: section -> field: message``; a missing file means
defaults. Each area (snapshot, health, report) owns its own settings model next to its code.
"""

from __future__ import annotations

from typing import Dict, Literal, Optional

from pydantic import Field

from agent.configfile import parse_toml_model, read_config_text
from agent.defaults import DEFAULT_CONFIG_PATH, DEFAULT_STATE_DIR
from agent.guard.settings import GuardSettings
from agent.health.settings import HealthSettings
from agent.integrations.settings import IntegrationsSettings
from agent.models import FrozenModel
from agent.report.settings import ReportSettings
from agent.snapshot.settings import SnapshotSettings

__all__ = ["DEFAULT_CONFIG_PATH", "DEFAULT_STATE_DIR", "AgentSettings", "DaemonSettings", "Settings",
           "SnapshotSettings", "load_settings", "parse_settings", "parse_toml_model"]


class AgentSettings(FrozenModel):
    """Where state lives and how the agent logs."""

    state_dir: str = DEFAULT_STATE_DIR
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    host_id: Optional[str] = None
    # Labels of this host (rack, role, ...): sent in the heartbeat, matched by a policy bundle's scope.
    labels: Dict[str, str] = Field(default_factory=dict)


class DaemonSettings(FrozenModel):
    """How often ``gpuguard run`` looks for package changes and runs the health check."""

    package_watch_interval_seconds: float = Field(2.0, gt=0)
    health_enabled: bool = True
    health_interval_seconds: float = Field(21600.0, gt=0)
    # First health check this long after start (a baseline on a new host); None waits one full interval.
    health_first_run_seconds: Optional[float] = Field(60.0, ge=0)


class Settings(FrozenModel):
    """The whole agent configuration."""

    agent: AgentSettings = AgentSettings()
    snapshot: SnapshotSettings = SnapshotSettings()
    daemon: DaemonSettings = DaemonSettings()
    report: ReportSettings = ReportSettings()
    guard: GuardSettings = GuardSettings()
    health: HealthSettings = HealthSettings()
    integrations: IntegrationsSettings = IntegrationsSettings()


def parse_settings(text: str, path: str = "<string>") -> Settings:
    """Parse TOML text into Settings; ConfigError lists every problem."""
    return parse_toml_model(text, path, Settings)


def load_settings(path: str = DEFAULT_CONFIG_PATH, required: bool = False) -> Settings:
    """Read the config file; defaults when it does not exist (unless ``required``)."""
    text = read_config_text(path, required)
    return Settings() if text is None else parse_settings(text, path)
