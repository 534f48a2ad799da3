"""Hub settings: one frozen model, loaded from /etc/gpuguard/hub.toml; every problem reported at once.

Read through agent/configfile.py, as every settings file is, and not agent/config.py, which composes the agent's
settings models (guard, health, report, ...): the hub loads its own model only (tests/hub/test_settings.py).
"""

from __future__ import annotations

from typing import List, Literal, Optional

from pydantic import Field, field_validator

from agent.configfile import parse_toml_model, read_config_text
from agent.defaults import DEFAULT_HUB_CONFIG_PATH, DEFAULT_KEYS_DIR, DEFAULT_STATE_DIR
from agent.hub.alert_settings import AlertWebhook
from agent.models import FrozenModel

DEFAULT_DATABASE_URL = f"sqlite:///{DEFAULT_STATE_DIR}/hub.db"
DEFAULT_TOKENS_FILE = "/etc/gpuguard/hub-tokens.json"
MIB = 1024 * 1024


class HubSettings(FrozenModel):
    """Where the hub listens, where it stores, whom it trusts and how much it accepts."""

    listen_host: str = "127.0.0.1"
    listen_port: int = Field(8470, ge=0, le=65535)
    database_url: str = DEFAULT_DATABASE_URL
    tokens_file: str = DEFAULT_TOKENS_FILE
    # The keyrings (*.gpg, binary) whose keys may sign policy bundles: a push is verified against them before it is
    # stored or offered (agent/hub/bundles.py); none there, every push is refused.
    policy_keys_dir: str = DEFAULT_KEYS_DIR
    max_body_bytes: int = Field(MIB, ge=1024, le=64 * MIB)
    # The fleet API (GET /v1/...) wants a reader token; turn off only on a hub reachable from trusted hosts alone.
    fleet_api_requires_token: bool = True
    # "full" fsyncs every group commit, so an acknowledged event survives power loss; "normal" only app crashes.
    sqlite_synchronous: Literal["full", "normal"] = "full"
    # Concurrent batches waiting for the writer; past this the hub answers 503 and the agent retries later.
    max_pending_batches: int = Field(10_000, ge=1)
    max_events_per_commit: int = Field(5_000, ge=1)
    write_timeout_seconds: float = Field(30.0, gt=0)
    tokens_reload_seconds: float = Field(2.0, ge=0)
    shutdown_timeout_seconds: float = Field(10.0, ge=0)
    # A client whose request headers, or whose body, take longer than this is cut off (408 for a slow body).
    header_timeout_seconds: float = Field(10.0, gt=0)
    body_timeout_seconds: float = Field(30.0, gt=0)
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    # Hub processes sharing the listening socket (each with its own event loop and writer); over PostgreSQL
    # several hubs (workers or machines) share one database. See docs/hub.md, "Scale out".
    workers: int = Field(1, ge=1, le=64)
    # Retention (agent/hub/retention.py): 0 keeps a kind forever; each host's newest event of each kind and the
    # hosts table are never deleted.
    retention_heartbeat_hours: float = Field(6.0, ge=0)
    retention_event_days: float = Field(90.0, ge=0)
    retention_interval_seconds: float = Field(600.0, ge=1)
    retention_batch_rows: int = Field(2000, ge=1, le=100_000)
    # Staged rollouts (agent/hub/rollouts.py): every hub process evaluates the running rollout this often.
    rollout_tick_seconds: float = Field(10.0, ge=0.05, le=3600)
    # Dashboard (agent/hub/dashboard/) and /metrics: a host not heard from this long is stale.
    stale_after_seconds: float = Field(900.0, gt=0)
    dashboard_session_seconds: float = Field(8 * 3600.0, ge=60, le=30 * 86400)
    # Alert webhooks (agent/hub/alerts.py): delivered at least once from a queue in the database, retried with
    # exponential backoff, dead-lettered after alert_max_attempts.
    alert_webhooks: List[AlertWebhook] = []
    alert_max_attempts: int = Field(12, ge=1, le=1000)
    alert_retry_initial_seconds: float = Field(5.0, gt=0)
    alert_retry_max_seconds: float = Field(900.0, gt=0)
    alert_timeout_seconds: float = Field(10.0, gt=0, le=300)
    alert_poll_seconds: float = Field(2.0, gt=0, le=300)
    # Signed policy under a root (agent/hub/trust.py): the directory of the roots the hub serves (N.root.json and
    # N.root.json.sig), and the gpg home and key (fingerprint) of its online freshness key with the lifetime of a
    # statement in hours (python-tuf's timestamp default is a day). Unset: the hub serves neither.
    root_dir: Optional[str] = None
    freshness_gnupg_home: Optional[str] = None
    freshness_key: Optional[str] = None
    freshness_hours: float = Field(24.0, gt=0, le=168)

    @field_validator("database_url")
    @classmethod
    def _known_scheme(cls, value: str) -> str:
        if not value.startswith(("sqlite:///", "postgresql://", "postgres://")):
            raise ValueError("must start with sqlite:/// or postgresql://")
        return value


def parse_hub_settings(text: str, path: str = "<string>") -> HubSettings:
    """Parse TOML text (flat keys) into HubSettings; ConfigError lists every problem."""
    return parse_toml_model(text, path, HubSettings)


def load_hub_settings(path: str = DEFAULT_HUB_CONFIG_PATH, required: bool = False) -> HubSettings:
    """Read the hub config file; defaults when it does not exist (unless ``required``)."""
    text = read_config_text(path, required)
    return HubSettings() if text is None else parse_hub_settings(text, path)
