"""Settings of drift reporting: where events go, how they are authenticated, retried, bounded and exported.

The ``[report]`` section of /etc/gpuguard/agent.toml. Without ``endpoint_url`` events stay queued in the outbox
(bounded by ``max_events``) and the agent says so once in its log.
"""

from __future__ import annotations

import ipaddress
from typing import Optional
from urllib.parse import urlsplit

from pydantic import Field, field_validator, model_validator

from agent.models import FrozenModel
from agent.statepaths import StatePaths
from agent.wire import INGEST_PATH

DEFAULT_TOKEN_FILE = "/etc/gpuguard/token"
# EventBatch accepts at most this many events per request.
MAX_BATCH_SIZE = 500
# node-feature-discovery's local source reads this directory (docs/integrations.md).
DEFAULT_NFD_FEATURES_FILE = "/etc/kubernetes/node-feature-discovery/features.d/gpuguard"


def is_loopback_host(hostname: str) -> bool:
    """True for localhost and loopback addresses: plain HTTP there never leaves the machine."""
    if hostname == "localhost":
        return True
    try:
        return ipaddress.ip_address(hostname).is_loopback
    except ValueError:
        return False


class ReportSettings(FrozenModel):
    """Endpoint, credentials, TLS, timeouts, batching, outbox bound, retry backoff and metrics output."""

    endpoint_url: Optional[str] = None
    token_file: Optional[str] = DEFAULT_TOKEN_FILE
    ca_bundle: Optional[str] = None
    allow_plain_http: bool = False
    connect_timeout_seconds: float = Field(5.0, gt=0, le=300)
    read_timeout_seconds: float = Field(30.0, gt=0, le=600)
    batch_size: int = Field(100, ge=1, le=MAX_BATCH_SIZE)
    max_events: int = Field(10000, ge=10)
    backoff_base_seconds: float = Field(1.0, gt=0)
    backoff_cap_seconds: float = Field(300.0, gt=0)
    delivery_interval_seconds: float = Field(30.0, gt=0)
    heartbeat_interval_seconds: float = Field(60.0, gt=0)
    # The first heartbeat waits one interval plus a random 0 to this (at most one interval), so hosts started
    # together (a fleet reboot, a package push) keep a random phase instead of reporting in lockstep.
    startup_jitter_seconds: float = Field(60.0, ge=0, le=86400)
    metrics_enabled: bool = True
    metrics_textfile: Optional[str] = None
    # The NFD features file, written only where its directory exists; "" turns it off. Its labels expire after
    # nfd_lifetime_seconds unless rewritten (the daemon refreshes them every half lifetime, checked each minute).
    nfd_features_file: str = DEFAULT_NFD_FEATURES_FILE
    nfd_lifetime_seconds: float = Field(3600.0, ge=300, le=30 * 86400)

    @field_validator("endpoint_url")
    @classmethod
    def _endpoint_is_http_url(cls, value: Optional[str]) -> Optional[str]:
        if value is None:
            return None
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("must be an http:// or https:// URL with a host name")
        if parts.query or parts.fragment:
            raise ValueError("must not have a query or fragment")
        value = value.rstrip("/")
        # The hub's base URL is wanted; the full ingest URL (what an operator copies from the hub's docs or its
        # log) means the same hub, so accept it rather than POSTing to .../v1/events/v1/events (seen on the H200).
        if value.endswith(INGEST_PATH):
            value = value[: -len(INGEST_PATH)]
        return value

    @field_validator("nfd_features_file")
    @classmethod
    def _nfd_file_is_absolute(cls, value: str) -> str:
        if value and not value.startswith("/"):
            raise ValueError("must be an absolute path (or \"\" to turn the NFD features file off)")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> "ReportSettings":
        problems = []
        if self.backoff_cap_seconds < self.backoff_base_seconds:
            problems.append("backoff_cap_seconds must be at least backoff_base_seconds")
        if self.endpoint_url is not None:
            parts = urlsplit(self.endpoint_url)
            if parts.scheme == "http" and not self.allow_plain_http and not is_loopback_host(parts.hostname or ""):
                problems.append("endpoint_url uses plain http to a remote host, which would send the token in the "
                                "clear; use https or set allow_plain_http = true")
        if problems:
            raise ValueError("; ".join(problems))
        return self

    @property
    def ingest_url(self) -> Optional[str]:
        """The full URL events are POSTed to, or None without an endpoint."""
        return None if self.endpoint_url is None else self.endpoint_url + INGEST_PATH

    def nfd_path(self) -> Optional[str]:
        """Where the NFD features file goes, or None when it is turned off."""
        return self.nfd_features_file or None

    def metrics_path(self, state_dir: str) -> Optional[str]:
        """Where the node_exporter textfile goes, or None when metrics are off."""
        if not self.metrics_enabled:
            return None
        return self.metrics_textfile or StatePaths(state_dir).metrics_textfile
