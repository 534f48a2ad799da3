"""The settings as the resident daemon holds them: validated by pydantic in a child, read here as a plain record.

agent/config.py's pydantic models are the one source of the settings: their fields, defaults and rules. The resident
``gpuguard run`` never imports them (issue #28: pydantic alone held about 8 MiB of the resident's RSS). A ``config``
job child (agent/daemon_jobs/child_main.py, at start and on SIGHUP) loads and validates the file, checks the token
file and CA bundle, and hands back two things:

- :class:`ResidentSettings`, the values the resident's own jobs read (intervals, backoff, the outbox bound, where the
  metrics and NFD files go), each taken from the validated model by :meth:`ResidentSettings.of`, so a renamed or
  retyped setting fails the type check there, and derived values (the metrics path) come from the model's methods;
- the validated settings as JSON (``model_dump``), which the resident passes on to every job child unread, so each
  child works with exactly the settings in force (a reload the child refused keeps the old ones).

:class:`SettingsInForce` holds both; job bodies that run in a child (or in-process in tests) get the whole model
from it (:meth:`SettingsInForce.model`), validated once, there.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Dict, Optional, Tuple

from agent.jsonrecord import JsonObject, JsonRecord

if TYPE_CHECKING:  # pragma: no cover - the pydantic models only where they are validated (a child, tests)
    from agent.config import Settings


@dataclass(frozen=True)
class ResidentSettings(JsonRecord):
    """What the resident daemon's own jobs read of the settings in force."""

    state_dir: str
    log_level: str
    host_id: Optional[str]
    endpoint_url: Optional[str]
    delivery_interval_seconds: float
    backoff_base_seconds: float
    backoff_cap_seconds: float
    max_events: int
    heartbeat_interval_seconds: float
    startup_jitter_seconds: float
    metrics_path: Optional[str]
    nfd_path: Optional[str]
    nfd_lifetime_seconds: float
    snapshot_interval_seconds: float
    package_watch_interval_seconds: float
    health_enabled: bool
    health_interval_seconds: float
    health_first_run_seconds: Optional[float]
    defer_first_retry_seconds: float
    defer_max_retry_seconds: float
    defer_window_seconds: float
    # The heartbeat carries these (agent/daemon_jobs/heartbeat.py); defaults for a view written before they existed.
    labels: Dict[str, str] = field(default_factory=dict)
    policy_source: str = "local"

    @classmethod
    def of(cls, settings: Settings) -> ResidentSettings:
        """The resident's values of validated settings (called where pydantic is loaded: the config child, tests)."""
        agent, report, daemon, health = settings.agent, settings.report, settings.daemon, settings.health
        return cls(state_dir=agent.state_dir, log_level=agent.log_level, host_id=agent.host_id,
                   endpoint_url=report.endpoint_url, delivery_interval_seconds=report.delivery_interval_seconds,
                   backoff_base_seconds=report.backoff_base_seconds, backoff_cap_seconds=report.backoff_cap_seconds,
                   max_events=report.max_events, heartbeat_interval_seconds=report.heartbeat_interval_seconds,
                   startup_jitter_seconds=report.startup_jitter_seconds,
                   metrics_path=report.metrics_path(agent.state_dir), nfd_path=report.nfd_path(),
                   nfd_lifetime_seconds=report.nfd_lifetime_seconds,
                   snapshot_interval_seconds=settings.snapshot.interval_seconds,
                   package_watch_interval_seconds=daemon.package_watch_interval_seconds,
                   health_enabled=daemon.health_enabled, health_interval_seconds=daemon.health_interval_seconds,
                   health_first_run_seconds=daemon.health_first_run_seconds,
                   defer_first_retry_seconds=health.defer_first_retry_seconds,
                   defer_max_retry_seconds=health.defer_max_retry_seconds,
                   defer_window_seconds=health.defer_window_seconds, labels=dict(agent.labels),
                   policy_source=settings.guard.policy_source)

    def intervals(self) -> Dict[str, float]:
        """Seconds between runs of each scheduled job whose interval is a setting, by job id."""
        return {"deliver": self.delivery_interval_seconds, "heartbeat": self.heartbeat_interval_seconds,
                "snapshot": self.snapshot_interval_seconds, "guard": self.snapshot_interval_seconds,
                "health": self.health_interval_seconds, "package_watch": self.package_watch_interval_seconds,
                "policy_fetch": self.heartbeat_interval_seconds}


@dataclass(frozen=True)
class ConfigProblem(JsonRecord):
    """A config file that cannot be used: its path and every problem (agent.errors.ConfigError's)."""

    path: str
    problems: Tuple[str, ...]


class SettingsInForce:
    """The settings the daemon runs with: the resident's view and the validated whole, as the config child gave them.

    ``dump`` is ``Settings.model_dump(mode="json")``; :meth:`model` validates it again (once) for bodies that need the
    whole model, which only job children and in-process tests run. Replaced as a whole on SIGHUP."""

    __slots__ = ("view", "dump", "_model", "_lock")

    def __init__(self, view: ResidentSettings, dump: JsonObject, model: Optional[Settings] = None) -> None:
        self.view = view
        self.dump = dump
        self._model = model
        self._lock = threading.Lock()

    @classmethod
    def of(cls, settings: Settings) -> SettingsInForce:
        """From a validated model (the config child, tests): its view, its JSON, and the model itself."""
        return cls(ResidentSettings.of(settings), settings.model_dump(mode="json"), settings)

    def model(self) -> Settings:
        """The whole pydantic settings model (imports pydantic: never called in the resident daemon)."""
        with self._lock:
            if self._model is None:
                from agent.config import Settings

                self._model = Settings.model_validate(self.dump)
            return self._model
