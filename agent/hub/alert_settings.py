"""One alert webhook as configured in hub.toml (``[[alert_webhooks]]``); delivery itself is in alerts.py."""

from __future__ import annotations

from typing import List, Literal

from pydantic import Field, field_validator

from agent.models import FrozenModel
from agent.report.events import PAYLOAD_KINDS

# Kinds that page someone by default: policy acted or was broken, packages were put back, the GPU stack regressed.
DEFAULT_ALERT_KINDS = ("policy_violation", "transaction_blocked", "rollback", "health_regression", "cpu_fallback",
                       "health_failed")
SEVERITY_RANK = {"info": 0, "warning": 1, "critical": 2}


class AlertWebhook(FrozenModel):
    """Where to POST alerts, in which shape, and for which events (kind in ``kinds`` and severity at least
    ``min_severity``)."""

    name: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    url: str = Field(max_length=2000)
    format: Literal["json", "slack"] = "json"
    kinds: List[str] = list(DEFAULT_ALERT_KINDS)
    min_severity: Literal["info", "warning", "critical"] = "warning"

    @field_validator("url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        if not value.startswith(("http://", "https://")):
            raise ValueError("must start with http:// or https://")
        return value

    @field_validator("kinds")
    @classmethod
    def _known_kinds(cls, value: List[str]) -> List[str]:
        unknown = sorted(set(value) - set(PAYLOAD_KINDS))
        if unknown:
            raise ValueError(f"unknown event kind(s) {', '.join(unknown)}; known: {', '.join(PAYLOAD_KINDS)}")
        return value

    def wants(self, kind: str, severity: str) -> bool:
        return kind in self.kinds and SEVERITY_RANK[severity] >= SEVERITY_RANK[self.min_severity]
