"""The report events the resident daemon writes, as standard-library records: no pydantic in the long-running process.

The schema is the pydantic models' (agent/report/events.py, published as schemas/events-v1.json); what the resident
commits itself (heartbeats, damage reports, a failed rollback check, a health deferral) and the pairing a snapshot
child hands back are these records instead, and tests/report/test_plain.py holds every field and constraint of each
to its model and to the published schema. Job children, which load pydantic anyway, commit their payloads as the
models (SnapshotChanged, PolicyViolation, HealthRegression, ...): :class:`PlainEvent` takes either, both being a
:class:`ReportPayload`. The outbox stores the event's JSON; a delivery child reads it back as the pydantic ``Event``.
"""

from __future__ import annotations

import datetime as dt
import json
import uuid
from dataclasses import dataclass, field
from typing import ClassVar, Dict, Final, FrozenSet, Literal, Optional, Protocol, Tuple

from agent.jsonrecord import JsonObject, JsonRecord, iso_time
from agent.wire import (
    HEALTH_STATUSES,
    MAX_HEARTBEAT_UNKNOWN_VERSIONS,
    MAX_HEARTBEAT_WORKLOADS,
    MAX_STACK_TEXT_CHARS,
    MAX_STORED_INT,
    MAX_UNKNOWN_VERSION_CHARS,
    POLICY_ATTENTION,
    REFUSAL_KINDS,
    UNKNOWN_COMPONENTS,
    UNKNOWN_TABLES,
    stack_id_ok,
    workload_name_ok,
)

EVENT_SCHEMA_VERSION: Final = 1
Severity = Literal["info", "warning", "critical"]
RefusalKind = Literal[REFUSAL_KINDS]  # type: ignore[valid-type]  # built from the tuple at run time
# Events the outbox never drops, whatever its size bound (an override's use is part of the audit trail).
NEVER_DROPPED_KINDS: FrozenSet[str] = frozenset({"policy_violation", "transaction_blocked", "rollback",
                                                 "override_used", "state_file_damaged",
                                                 "dependencies_broken"})
# The envelope's bounds (agent.report.events.Event).
EVENT_ID_CHARS = (8, 64)
HOST_ID_CHARS = (1, 128)
HOSTNAME_CHARS = (1, 255)


class ReportPayload(Protocol):
    """What an event carries: a kind and its JSON (a record here, or a pydantic payload model in a child)."""

    @property
    def kind(self) -> str: ...

    def to_json(self) -> JsonObject: ...


class PlainPayload(JsonRecord):
    """A payload record: its JSON leads with its ``kind``."""

    kind: ClassVar[str]

    def to_json(self) -> JsonObject:
        return {"kind": self.kind, **super().to_json()}


def _bounded(name: str, value: Optional[str], most: int) -> None:
    if value is not None and len(value) > most:
        raise ValueError(f"{name}: at most {most} characters, got {len(value)}")


@dataclass(frozen=True)
class PlainPairing(JsonRecord):
    """Kernel, OS, driver and user-space versions, as loaded and as installed (agent.snapshot.pairing.Pairing)."""

    os_id: Optional[str] = None
    os_version_id: Optional[str] = None
    kernel_running: Optional[str] = None
    kernel_next_boot: Optional[str] = None
    amdgpu_loaded: Optional[str] = None
    amdgpu_dkms_package: Optional[str] = None
    rocm: Optional[str] = None
    rocm_core_package: Optional[str] = None
    rocm_releases: str = ""
    rocm_active_tree: Optional[str] = None
    nvidia_loaded: Optional[str] = None
    cuda_driver_api: Optional[str] = None
    gpu_count: int = 0
    gpu_models: str = ""


@dataclass(frozen=True)
class PlainRollbackCoverage(JsonRecord):
    """How many guarded packages a rollback can restore, and from what (agent.report.events.RollbackCoverage)."""

    guarded: int
    restorable: int
    by_source: Dict[str, int] = field(default_factory=dict)
    not_restorable: Tuple[str, ...] = ()
    inexact: Tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for name in ("not_restorable", "inexact"):
            if len(getattr(self, name)) > 200:
                raise ValueError(f"{name}: at most 200 items, got {len(getattr(self, name))}")


@dataclass(frozen=True)
class PlainWorkloadStack(JsonRecord):
    """The stack a registered workload ran on (agent.report.events.WorkloadStackReport)."""

    gpu_models: Optional[str] = None
    driver: Optional[str] = None
    gpu_stack: Optional[str] = None
    framework: Optional[str] = None
    image: Optional[str] = None

    def __post_init__(self) -> None:
        for spec in ("gpu_models", "driver", "gpu_stack", "framework", "image"):
            _bounded(spec, getattr(self, spec), MAX_STACK_TEXT_CHARS)


@dataclass(frozen=True)
class PlainWorkload(JsonRecord):
    """A registered workload's last result (agent.report.events.WorkloadReport)."""

    name: str
    status: str
    gates: bool
    stack_id: Optional[str] = None
    stack: Optional[PlainWorkloadStack] = None

    def __post_init__(self) -> None:
        if not workload_name_ok(self.name):
            raise ValueError(f"name: 1-64 of a-z 0-9 _ . - starting with a letter or digit, got {self.name!r}")
        if self.status not in HEALTH_STATUSES or self.status == "skipped":
            raise ValueError(f"status: a workload status, got {self.status!r}")
        if self.stack_id is not None and not stack_id_ok(self.stack_id):
            raise ValueError(f"stack_id: 16 lower-case hex digits, got {self.stack_id!r}")


@dataclass(frozen=True)
class PlainUnknownVersion(JsonRecord):
    """A version newer than a compatibility table of gpuguard's knows (agent.report.events.UnknownVersionReport)."""

    table: str
    component: str
    version: str
    newest: str
    dated: str

    def __post_init__(self) -> None:
        if self.table not in UNKNOWN_TABLES:
            raise ValueError(f"table: one of {', '.join(UNKNOWN_TABLES)}, got {self.table!r}")
        if self.component not in UNKNOWN_COMPONENTS:
            raise ValueError(f"component: one of {', '.join(UNKNOWN_COMPONENTS)}, got {self.component!r}")
        for name in ("version", "newest", "dated"):
            value = getattr(self, name)
            if not value:
                raise ValueError(f"{name}: empty")
            _bounded(name, value, MAX_UNKNOWN_VERSION_CHARS)


@dataclass(frozen=True)
class PlainHeartbeat(PlainPayload):
    """The agent is alive; carries the current pairing and outbox depth (agent.report.events.Heartbeat)."""

    kind: ClassVar[str] = "heartbeat"
    agent_version: str
    uptime_seconds: float
    content_hash: Optional[str] = None
    outbox_depth: int = 0
    pairing: Optional[PlainPairing] = None
    compliant: Optional[bool] = None
    last_health_status: Optional[str] = None
    rollback_coverage: Optional[PlainRollbackCoverage] = None
    labels: Optional[Dict[str, str]] = None
    policy_source: Optional[Literal["local", "bundle"]] = None
    policy_serial: Optional[int] = None
    policy_refused_serial: Optional[int] = None
    policy_refused_reason: Optional[str] = None
    policy_refused_kind: Optional[RefusalKind] = None
    last_health_at: Optional[dt.datetime] = None
    last_health_after_change: Optional[bool] = None
    policy_attention: Optional[Tuple[str, ...]] = None
    workloads: Optional[Tuple[PlainWorkload, ...]] = None
    unknown_versions: Optional[Tuple[PlainUnknownVersion, ...]] = None

    def __post_init__(self) -> None:
        if self.unknown_versions is not None and len(self.unknown_versions) > MAX_HEARTBEAT_UNKNOWN_VERSIONS:
            raise ValueError(f"unknown_versions: at most {MAX_HEARTBEAT_UNKNOWN_VERSIONS} items, got "
                             f"{len(self.unknown_versions)}")
        if self.policy_attention is not None and not set(self.policy_attention) <= set(POLICY_ATTENTION):
            raise ValueError(f"policy_attention: only {', '.join(POLICY_ATTENTION)}")
        if self.workloads is not None and len(self.workloads) > MAX_HEARTBEAT_WORKLOADS:
            raise ValueError(f"workloads: at most {MAX_HEARTBEAT_WORKLOADS} items, got {len(self.workloads)}")
        for name in ("policy_serial", "policy_refused_serial"):
            value = getattr(self, name)
            if value is not None and not 1 <= value <= MAX_STORED_INT:
                raise ValueError(f"{name}: 1..{MAX_STORED_INT}, got {value}")
        _bounded("policy_refused_reason", self.policy_refused_reason, 2000)


@dataclass(frozen=True)
class PlainStateFileDamaged(PlainPayload):
    """A state file or the outbox was damaged, moved aside, the agent carried on (events.StateFileDamaged)."""

    kind: ClassVar[str] = "state_file_damaged"
    path: str
    problem: str
    action: str
    moved_to: Optional[str] = None
    salvaged_events: Optional[int] = None
    lost_events: Optional[int] = None

    def __post_init__(self) -> None:
        _bounded("path", self.path, 4096)
        _bounded("problem", self.problem, 2000)
        _bounded("moved_to", self.moved_to, 4096)
        _bounded("action", self.action, 500)


@dataclass(frozen=True)
class PlainRollback(PlainPayload):
    """gpuguard put packages back to the last known-good versions, or tried to (agent.report.events.Rollback)."""

    kind: ClassVar[str] = "rollback"
    reason: str
    from_versions: Dict[str, str]
    to_versions: Dict[str, str]
    succeeded: bool
    reboot_required: bool = False
    detail: Optional[str] = None
    health_status: Optional[str] = None
    method: str = "packages"


@dataclass(frozen=True)
class PlainHealthDeferred(PlainPayload):
    """The GPUs stayed busy for the whole deferral window (agent.report.events.HealthDeferred)."""

    kind: ClassVar[str] = "health_deferred"
    deferred_since: dt.datetime
    window_seconds: float
    attempts: int
    last_status: str
    after_change: bool = False
    tenants: Tuple[str, ...] = ()
    detail: Optional[str] = None


@dataclass(frozen=True)
class PlainEvent:
    """One report event of this host as the outbox stores it (agent.report.events.Event): the envelope and the
    payload's JSON. The bounds are checked here, as the model checks them."""

    host_id: str
    hostname: str
    occurred_at: dt.datetime
    kind: str
    payload: JsonObject
    severity: Severity = "info"
    event_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    sequence: int = 0

    def __post_init__(self) -> None:
        for name, value, (least, most) in (("event_id", self.event_id, EVENT_ID_CHARS),
                                           ("host_id", self.host_id, HOST_ID_CHARS),
                                           ("hostname", self.hostname, HOSTNAME_CHARS)):
            if not least <= len(value) <= most:
                raise ValueError(f"{name}: {least} to {most} characters, got {len(value)}")
        if self.sequence < 0:
            raise ValueError(f"sequence: at least 0, got {self.sequence}")
        if self.severity not in ("info", "warning", "critical"):
            raise ValueError(f"severity: info, warning or critical, got {self.severity!r}")
        if self.occurred_at.tzinfo is None:
            raise ValueError("occurred_at: a time with a time zone")

    @classmethod
    def of(cls, payload: ReportPayload, host_id: str, hostname: str, occurred_at: dt.datetime,
           severity: Severity = "info", event_id: Optional[str] = None) -> PlainEvent:
        body = payload.to_json()
        if event_id is None:
            return cls(host_id, hostname, occurred_at, payload.kind, body, severity)
        return cls(host_id, hostname, occurred_at, payload.kind, body, severity, event_id)

    def with_sequence(self, sequence: int) -> PlainEvent:
        return PlainEvent(self.host_id, self.hostname, self.occurred_at, self.kind, self.payload, self.severity,
                          self.event_id, sequence)

    def to_json(self) -> JsonObject:
        return {"schema_version": EVENT_SCHEMA_VERSION, "event_id": self.event_id, "host_id": self.host_id,
                "hostname": self.hostname, "sequence": self.sequence, "occurred_at": iso_time(self.occurred_at),
                "severity": self.severity, "payload": self.payload}

    def to_json_text(self) -> str:
        return json.dumps(self.to_json(), ensure_ascii=False, separators=(",", ":"), allow_nan=False)
