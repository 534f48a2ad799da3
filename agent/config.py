"""Agent settings: one frozen model per area, composed here, loaded from /etc/gpuguard/agent.toml.

Every problem in the file is reported at once as ``file: section -> field: message``; a missing file means
defaults. Each area (snapshot, health, report) owns its own settings model next to its code.
"""

from __future__ import annotations

import sys
from typing import List, Literal, Optional, Type, TypeVar

from pydantic import Field, ValidationError

from agent.collectors.packages import DEFAULT_WATCHED_PATTERNS
from agent.errors import ConfigError, InputFileError
from agent.files import MAX_NESTING_DEPTH, FileMissing, decode_text, nesting_depth, read_bytes_bounded
from agent.guard.settings import GuardSettings
from agent.health.settings import HealthSettings
from agent.models import FrozenModel, validation_problems
from agent.report.settings import ReportSettings

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python < 3.11 hosts
    import tomli as tomllib

M = TypeVar("M", bound=FrozenModel)

DEFAULT_CONFIG_PATH = "/etc/gpuguard/agent.toml"
DEFAULT_STATE_DIR = "/var/lib/gpuguard"


class AgentSettings(FrozenModel):
    """Where state lives and how the agent logs."""

    state_dir: str = DEFAULT_STATE_DIR
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    host_id: Optional[str] = None


class SnapshotSettings(FrozenModel):
    """What to watch and how often to snapshot."""

    interval_seconds: float = Field(300.0, gt=0)
    watched_packages: List[str] = list(DEFAULT_WATCHED_PATTERNS)
    extra_watched_packages: List[str] = []

    @property
    def all_watched_packages(self) -> List[str]:
        return [*self.watched_packages, *self.extra_watched_packages]


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


def parse_toml_model(text: str, path: str, model: Type[M]) -> M:
    """Parse TOML text into a settings model; ConfigError lists every problem (bad TOML or every bad field)."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(path, [f"not valid TOML: {exc}"]) from None
    except RecursionError:
        raise ConfigError(path, ["not valid TOML: nested too deeply"]) from None
    if nesting_depth(data) > MAX_NESTING_DEPTH:
        raise ConfigError(path, [f"not valid TOML: nested deeper than {MAX_NESTING_DEPTH} levels"])
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(path, validation_problems(exc.errors())) from None


def parse_settings(text: str, path: str = "<string>") -> Settings:
    """Parse TOML text into Settings; ConfigError lists every problem."""
    return parse_toml_model(text, path, Settings)


def load_settings(path: str = DEFAULT_CONFIG_PATH, required: bool = False) -> Settings:
    """Read the config file; defaults when it does not exist (unless ``required``)."""
    try:
        raw = read_bytes_bounded(path)
    except FileMissing:
        if required:
            raise ConfigError(path, ["no such file"]) from None
        return Settings()
    except InputFileError as exc:
        raise ConfigError(path, [exc.reason]) from None
    try:
        text = decode_text(path, raw)
    except InputFileError as exc:
        raise ConfigError(path, [exc.reason]) from None
    return parse_settings(text, path)
