"""What the hub's store answers: typed rows (a batch's result, a host's state, drift counts, stored events, policy
bundles and audit entries), the filters of an event query, and the one rule for times in them (aware, UTC)."""

from __future__ import annotations

import datetime as dt
from typing import Any, Dict, List, NamedTuple, Optional, Tuple

from pydantic import computed_field

from agent.models import FrozenModel
from agent.report.events import UnknownVersionReport
from agent.snapshot.pairing import Pairing
from agent.wire import CLOCK_SKEW_BOUND_SECONDS

# Kinds that count as drift in the fleet API: the stack moved, a check regressed, or policy had to act.
DRIFT_KINDS = ("snapshot_changed", "health_regression", "cpu_fallback", "health_failed", "policy_violation",
               "rollback")


def utc(value: dt.datetime) -> dt.datetime:
    """An aware UTC datetime; a naive one is taken as UTC."""
    if value.tzinfo is None:
        return value.replace(tzinfo=dt.timezone.utc)
    return value.astimezone(dt.timezone.utc)


def utc_now() -> dt.datetime:
    """The hub's clock: now, aware, in UTC."""
    return dt.datetime.now(dt.timezone.utc)


class BatchResult(FrozenModel):
    """Per batch: event_ids stored now, and event_ids that were already stored (or repeated in the batch)."""

    accepted: List[str]
    duplicates: List[str]


class HostRow(FrozenModel):
    """What the hub knows of one host."""

    host_id: str
    hostname: str
    first_seen_at: dt.datetime
    last_seen_at: dt.datetime
    last_event_at: dt.datetime
    last_sequence: int
    pairing: Optional[Pairing] = None
    pairing_at: Optional[dt.datetime] = None
    content_hash: Optional[str] = None
    compliant: Optional[bool] = None
    agent_version: Optional[str] = None
    last_health_status: Optional[str] = None
    heartbeat_at: Optional[dt.datetime] = None
    # From the newest heartbeat (None from an agent that does not send them): labels, the policy in force, and
    # the last bundle the host refused with why.
    labels: Optional[Dict[str, str]] = None
    policy_source: Optional[str] = None
    policy_serial: Optional[int] = None
    policy_refused_serial: Optional[int] = None
    policy_refused_reason: Optional[str] = None
    policy_refused_kind: Optional[str] = None  # why (agent/wire.py's REFUSAL_KINDS; schema version 6)
    # What asks for attention though the policy keeps guarding (agent/wire.py's POLICY_ATTENTION: "expired",
    # "freshness"; schema version 8); None from an agent that does not send it.
    policy_attention: Optional[Tuple[str, ...]] = None
    # Versions newer than a compatibility table of gpuguard's knows (agent/wire.py's UNKNOWN_TABLES; schema version
    # 9); None from an agent that does not send them.
    unknown_versions: Optional[Tuple[UnknownVersionReport, ...]] = None
    # When the last health check finished and whether it followed a change (schema version 3; None from older agents).
    last_health_at: Optional[dt.datetime] = None
    last_health_after_change: Optional[bool] = None
    # When the hub received the newest heartbeat (schema version 9; None for a row not updated since): what decides
    # "after admission", and with ``heartbeat_at`` (the agent's clock) the host's clock skew.
    heartbeat_received_at: Optional[dt.datetime] = None
    # The agent's clock minus the hub's, from the newest heartbeat: its time less its receipt (a heartbeat held in
    # the outbox reads as a clock behind); None without one received since schema version 9.
    clock_skew_seconds: Optional[float] = None

    @computed_field  # type: ignore[prop-decorator]
    @property
    def clock_skewed(self) -> bool:
        """The clock skew is beyond agent/wire.py's CLOCK_SKEW_BOUND_SECONDS either way."""
        return skew_beyond_bound(self.clock_skew_seconds)

    def health_checked_on_hub_clock(self) -> Optional[dt.datetime]:
        """When the last health check finished, on the hub's clock (:func:`checked_on_hub_clock`)."""
        return checked_on_hub_clock(self.last_health_at, self.heartbeat_at, self.heartbeat_received_at)


def skew_beyond_bound(clock_skew_seconds: Optional[float]) -> bool:
    """A host's clock skew is beyond agent/wire.py's CLOCK_SKEW_BOUND_SECONDS either way (None: not known)."""
    return clock_skew_seconds is not None and abs(clock_skew_seconds) > CLOCK_SKEW_BOUND_SECONDS


def checked_on_hub_clock(last_health_at: Optional[dt.datetime], heartbeat_at: Optional[dt.datetime],
                         heartbeat_received_at: Optional[dt.datetime]) -> Optional[dt.datetime]:
    """When a host's last health check finished, on the hub's clock: the heartbeat's receipt less how long before
    the heartbeat (both on the agent's clock) the check finished, so a steady skew cancels out. None without the
    agent's times or the receipt."""
    if last_health_at is None or heartbeat_at is None or heartbeat_received_at is None:
        return None
    return heartbeat_received_at - (heartbeat_at - last_health_at)


class DriftRow(FrozenModel):
    """Events of one drift kind on one host the hub received since a time: when it received the first and the last
    (its clock, which orders them), the times the agent gave them (its clock, shown as data) and the host's clock
    skew from its newest heartbeat (None before one)."""

    host_id: str
    hostname: str
    kind: str
    event_count: int
    first_received_at: dt.datetime
    last_received_at: dt.datetime
    first_occurred_at: dt.datetime
    last_occurred_at: dt.datetime
    clock_skew_seconds: Optional[float] = None


class EventQuery(FrozenModel):
    """Filters of GET /v1/events; ``since`` and the order are the hub's receipt (its clock)."""

    host_id: Optional[str] = None
    kind: Optional[str] = None
    since: Optional[dt.datetime] = None
    limit: int = 100
    newest_first: bool = True


class StoredEvent(FrozenModel):
    """An event as stored: its canonical JSON and when the hub received it."""

    body: str
    received_at: dt.datetime


class BundleSummary(FrozenModel):
    """A stored bundle without its bytes: what list and show answer."""

    serial: int
    sha256: str
    bundle_bytes: int
    scope: Dict[str, Any]
    matrix_version: Optional[str] = None
    created_at: str
    created_by: str
    pushed_at: dt.datetime
    pushed_by: str
    withdrawn_at: Optional[dt.datetime] = None
    withdrawn_by: Optional[str] = None
    staged: bool = False  # offered only through a staged rollout until it is done


class AuditEntry(FrozenModel):
    """One push, refused push or withdrawal."""

    at: dt.datetime
    actor: str
    role: str
    action: str
    serial: Optional[int] = None
    detail: str


class ControlRow(NamedTuple):
    """A host not admitted, as its rollout's control reads it (the same names as ``HostRow``'s)."""

    host_id: str
    last_seen_at: dt.datetime
    last_health_status: Optional[str]
    last_health_at: Optional[dt.datetime]
    heartbeat_at: Optional[dt.datetime]
    heartbeat_received_at: Optional[dt.datetime]

    def health_checked_on_hub_clock(self) -> Optional[dt.datetime]:
        """When the last health check finished, on the hub's clock (:func:`checked_on_hub_clock`)."""
        return checked_on_hub_clock(self.last_health_at, self.heartbeat_at, self.heartbeat_received_at)
