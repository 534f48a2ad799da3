"""The report event schema (version 1): what a host tells the central endpoint.

Every event carries an ``event_id`` that is its idempotency key at the receiver, and a per-host ``sequence``
assigned by the outbox so the receiver can see order and gaps. The JSON schema published in ``schemas/`` is
generated from these models (``gpuguard schema``).
"""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Annotated, Dict, List, Literal, Optional, Tuple, Union, get_args

from pydantic import Field, field_validator

from agent.jsonrecord import JsonObject
from agent.models import FrozenModel
from agent.report.plain import EVENT_SCHEMA_VERSION, RefusalKind, Severity
from agent.snapshot.diff import Change
from agent.snapshot.pairing import Pairing
from agent.wire import (
    HEALTH_STATUSES,
    MAX_HEARTBEAT_UNKNOWN_VERSIONS,
    MAX_HEARTBEAT_WORKLOADS,
    MAX_STACK_TEXT_CHARS,
    MAX_STORED_INT,
    MAX_UNKNOWN_VERSION_CHARS,
    MAX_WORKLOAD_NAME_CHARS,
    POLICY_ATTENTION,
    STACK_ID_CHARS,
    UNKNOWN_COMPONENTS,
    UNKNOWN_TABLES,
    stack_id_ok,
    workload_name_ok,
)

# A count or size the hub stores: a whole number in 0..MAX_STORED_INT (a signed 64-bit column).
Count = Annotated[int, Field(ge=0, le=MAX_STORED_INT)]


class PayloadModel(FrozenModel):
    """A payload's JSON as the outbox stores it (agent.report.plain.ReportPayload)."""

    def to_json(self) -> JsonObject:
        return self.model_dump(mode="json")


class SnapshotChanged(PayloadModel):
    """The host's snapshot content hash moved; ``changes`` says component by component how."""

    kind: Literal["snapshot_changed"] = "snapshot_changed"
    old_hash: Optional[str] = None
    new_hash: str
    changes: List[Change] = []
    pairing: Pairing


class PolicyViolation(PayloadModel):
    """The installed set violates the pinned pairing policy."""

    kind: Literal["policy_violation"] = "policy_violation"
    rule: str
    message: str
    packages: Dict[str, str] = {}
    action: Literal["warn", "block", "rollback"] = "warn"


class TransactionBlocked(PayloadModel):
    """apt/dnf/zypper was stopped before changing anything."""

    kind: Literal["transaction_blocked"] = "transaction_blocked"
    tool: Literal["apt", "dnf", "dnf5", "zypper", "dpkg", "rpm"]
    rule: str
    message: str
    packages: Dict[str, str] = {}
    command_line: Optional[str] = None


class Rollback(PayloadModel):
    """gpuguard put packages back to the last known-good versions (or tried to)."""

    kind: Literal["rollback"] = "rollback"
    reason: str
    from_versions: Dict[str, str]
    to_versions: Dict[str, str]
    succeeded: bool
    reboot_required: bool = False
    detail: Optional[str] = None
    # reason "health": the post-change health status that asked for it (cpu_fallback, failed, regression).
    health_status: Optional[str] = None
    # how: "packages" (the package manager put versions back) or "repoint" (update-alternatives pointed a side-by-side
    # ROCm tree back: from/to_versions then map "alternatives:<name>" to the trees; no package changed)
    method: Literal["packages", "repoint"] = "packages"


class DependenciesBroken(PayloadModel):
    """A change of the guarded packages left the package database inconsistent (a bypass such as ``dpkg -i
    --force-depends`` broke dependencies): the set was not recorded as known-good. ``action`` is what the guard
    did: ``rollback`` (a Rollback event follows) or ``reported`` (rollback off, an override window open, or no
    known-good set to go back to)."""

    kind: Literal["dependencies_broken"] = "dependencies_broken"
    message: str = Field(max_length=2000)
    from_versions: Dict[str, str] = {}
    to_versions: Dict[str, str] = {}
    action: Literal["rollback", "reported"]


class OverriddenViolation(FrozenModel):
    """One rule an override window let a transaction break."""

    rule: str
    action: Literal["warn", "block", "rollback"]
    message: str
    packages: Dict[str, str] = {}


class OverrideUsed(PayloadModel):
    """An open override window let through a package transaction the policy would have refused."""

    kind: Literal["override_used"] = "override_used"
    window_id: str
    reason: str
    opened_by: str
    expires_at: dt.datetime
    command_line: Optional[str] = None
    violations: List[OverriddenViolation] = []


class HealthRegression(PayloadModel):
    """A health-check figure dropped beyond the noise band against the previous fingerprint's baseline."""

    kind: Literal["health_regression"] = "health_regression"
    metric: str
    baseline_value: float
    current_value: float
    drop_fraction: float
    threshold_fraction: float
    fingerprint: str
    baseline_fingerprint: str
    gpu: Optional[str] = None
    # Found while a maintenance hand-off held the node (issue 33): the hold's reason ("rollout R stage 2"); the
    # event is then "warning", not a fault of a node in service. Optional: absent from agents before it.
    maintenance: Optional[str] = Field(None, max_length=300)


class CpuFallback(PayloadModel):
    """The health workload did not really run on the GPU."""

    kind: Literal["cpu_fallback"] = "cpu_fallback"
    reason: str
    fingerprint: str
    detail: Optional[str] = None
    # As HealthRegression.maintenance: the hold's reason when found during a maintenance hand-off ("warning").
    maintenance: Optional[str] = Field(None, max_length=300)


class HealthFailed(PayloadModel):
    """The health check failed (``failed``: the probe or a check broke) or ran out of time (``timeout``): an event of
    its own, as cpu_fallback has (issue 43), so a failure between two heartbeats reaches the hub even when the next
    check passes before the next heartbeat."""

    kind: Literal["health_failed"] = "health_failed"
    status: Literal["failed", "timeout"]
    summary: str = Field(max_length=2000)
    fingerprint: str
    failures: List[Annotated[str, Field(max_length=500)]] = Field([], max_length=20)
    # As HealthRegression.maintenance: the hold's reason when found during a maintenance hand-off ("warning").
    maintenance: Optional[str] = Field(None, max_length=300)


class HealthDeferred(PayloadModel):
    """The GPUs stayed busy for the whole deferral window: the full health check (speed judged) could not run."""

    kind: Literal["health_deferred"] = "health_deferred"
    deferred_since: dt.datetime
    window_seconds: float
    attempts: Count
    # agent.health.model.HealthStatus of the last attempt (busy or deferred).
    last_status: str
    # True when the check that could not run was the one after a package change.
    after_change: bool = False
    # The other jobs on the GPUs at the last attempt, as ``gpu 0: pid 4242 (python3, 71.2 GiB)``.
    tenants: List[str] = []
    detail: Optional[str] = None


class RollbackCoverage(FrozenModel):
    """How many guarded packages a rollback can restore, and from what (the agent's rollback-coverage.json)."""

    guarded: Count
    restorable: Count
    # source ("archive cache", "repository", "rebuilt") -> packages restorable from it
    by_source: Dict[str, Count] = {}
    not_restorable: List[str] = Field([], max_length=200)  # package keys no file could be kept for
    inexact: List[str] = Field([], max_length=200)  # package keys whose rebuilt file differs from what was installed


StackText = Optional[Annotated[str, Field(max_length=MAX_STACK_TEXT_CHARS)]]


class WorkloadStackReport(FrozenModel):
    """The stack a registered workload ran on (agent.health.model.WorkloadStack), each part capped."""

    gpu_models: StackText = None
    driver: StackText = None
    gpu_stack: StackText = None
    framework: StackText = None
    image: StackText = None


class WorkloadReport(FrozenModel):
    """A registered workload's last result (issue 44): its verdict, whether it gates, and the stack it ran on."""

    name: str = Field(min_length=1, max_length=MAX_WORKLOAD_NAME_CHARS)
    # agent.health.model.WorkloadStatus: one of the health statuses but skipped.
    status: str = Field(max_length=20)
    gates: bool
    stack_id: Optional[str] = Field(None, min_length=STACK_ID_CHARS, max_length=STACK_ID_CHARS)
    stack: Optional[WorkloadStackReport] = None

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not workload_name_ok(value):
            raise ValueError("1-64 of a-z 0-9 _ . - starting with a letter or digit")
        return value

    @field_validator("status")
    @classmethod
    def _status(cls, value: str) -> str:
        if value not in HEALTH_STATUSES or value == "skipped":
            raise ValueError(f"one of {', '.join(s for s in HEALTH_STATUSES if s != 'skipped')}")
        return value

    @field_validator("stack_id")
    @classmethod
    def _stack_id(cls, value: Optional[str]) -> Optional[str]:
        if value is not None and not stack_id_ok(value):
            raise ValueError(f"{STACK_ID_CHARS} lower-case hex digits")
        return value


UnknownText = Annotated[str, Field(min_length=1, max_length=MAX_UNKNOWN_VERSION_CHARS)]


class UnknownVersionReport(FrozenModel):
    """A version newer than the newest row of a compatibility table of gpuguard's (agent/policy/table_unknown.py):
    the table, what the version is of, the version, the table's newest row for it and the table's date."""

    table: Literal[UNKNOWN_TABLES]  # type: ignore[valid-type]  # built from the tuple at run time
    component: Literal[UNKNOWN_COMPONENTS]  # type: ignore[valid-type]
    version: UnknownText
    newest: UnknownText
    dated: UnknownText


class Heartbeat(PayloadModel):
    """The agent is alive; carries the current pairing and outbox depth."""

    kind: Literal["heartbeat"] = "heartbeat"
    agent_version: str
    uptime_seconds: float
    content_hash: Optional[str] = None
    outbox_depth: Count = 0
    pairing: Optional[Pairing] = None
    compliant: Optional[bool] = None
    # agent.health.model.HealthStatus: pass, busy, deferred, skipped, regression, cpu_fallback, failed, timeout.
    last_health_status: Optional[str] = None
    rollback_coverage: Optional[RollbackCoverage] = None
    # Signed policy bundles (issue 32); all optional, so a heartbeat of an older agent still validates.
    # The host's labels ([report] labels): the hub matches a bundle's scope "labels" selector against them.
    labels: Optional[Dict[str, str]] = None
    # Which policy is in force: the local policy.d files, or an installed bundle.
    policy_source: Optional[Literal["local", "bundle"]] = None
    # The serial of the bundle in force (None with policy_source "local" and no bundle installed).
    policy_serial: Optional[int] = Field(None, ge=1, le=MAX_STORED_INT)
    # The last bundle this host refused, and the one-line reason (signature, serial rollback, scope, compile).
    policy_refused_serial: Optional[int] = Field(None, ge=1, le=MAX_STORED_INT)
    policy_refused_reason: Optional[str] = Field(None, max_length=2000)
    # Why (agent/wire.py's REFUSAL_KINDS): what the hub counts and shows; the reason is for people.
    policy_refused_kind: Optional[RefusalKind] = None
    # Staged rollouts (issue 33), optional too: when the last health check (last_health_status) finished, and
    # whether it was the check after a package change. The hub counts a pass as a rollout's evidence only when it
    # finished after the host's admission and, when the flag is sent, was a post-change check.
    last_health_at: Optional[dt.datetime] = None
    last_health_after_change: Optional[bool] = None
    # The registered workloads of the last health check (issue 44): the hub's verified-stack matrix and a rollout's
    # evidence. Optional: absent from agents before it and from a host that registers none.
    workloads: Optional[List[WorkloadReport]] = Field(None, max_length=MAX_HEARTBEAT_WORKLOADS)
    # Signed policy under a root (issue 42): what asks for attention although the policy in force keeps guarding:
    # "expired" (the bundle in force is past its expires), "freshness" (the hub's freshness statement is stale or
    # names a newer serial this host does not get: a freeze).
    policy_attention: Optional[Tuple[str, ...]] = Field(None, max_length=len(POLICY_ATTENTION))
    # Versions newer than a compatibility table of gpuguard's knows (issue 42: AMD's matrix, the TheRock release
    # table, the dcgm-exporter table), from the last snapshot's unknown_to_table findings; the hub counts hosts per
    # table. Optional: absent from agents before it.
    unknown_versions: Optional[List[UnknownVersionReport]] = Field(None, max_length=MAX_HEARTBEAT_UNKNOWN_VERSIONS)

    @field_validator("policy_attention")
    @classmethod
    def _attention_words(cls, value: Optional[Tuple[str, ...]]) -> Optional[Tuple[str, ...]]:
        if value is not None and not set(value) <= set(POLICY_ATTENTION):
            raise ValueError(f"only {', '.join(POLICY_ATTENTION)}")
        return value


class StateFileDamaged(PayloadModel):
    """A state file or the outbox was unreadable or damaged; it was moved aside and the agent carried on."""

    kind: Literal["state_file_damaged"] = "state_file_damaged"
    path: str = Field(max_length=4096)
    problem: str = Field(max_length=2000)
    moved_to: Optional[str] = Field(None, max_length=4096)
    action: str = Field(max_length=500)
    salvaged_events: Optional[Count] = None
    lost_events: Optional[Count] = None


Payload = Annotated[Union[SnapshotChanged, PolicyViolation, TransactionBlocked, Rollback, OverrideUsed,
                          HealthRegression, CpuFallback, HealthFailed, HealthDeferred, Heartbeat, StateFileDamaged,
                          DependenciesBroken],
                    Field(discriminator="kind")]
# Every payload kind, in schema order (the hub's query filter and docs derive from this, so a new kind is one edit).
PAYLOAD_KINDS = tuple(model.model_fields["kind"].default for model in get_args(get_args(Payload)[0]))


class Event(FrozenModel):
    """One report event from one host."""

    schema_version: Literal[1] = EVENT_SCHEMA_VERSION
    event_id: str = Field(default_factory=lambda: uuid.uuid4().hex, min_length=8, max_length=64)
    host_id: str = Field(min_length=1, max_length=128)
    hostname: str = Field(min_length=1, max_length=255)
    sequence: int = Field(0, ge=0, le=MAX_STORED_INT)
    occurred_at: dt.datetime
    severity: Severity = "info"
    payload: Payload

    @property
    def kind(self) -> str:
        return self.payload.kind

    def with_sequence(self, sequence: int) -> Event:
        """The event as the outbox stored it (agent.report.outbox.OutboxEvent)."""
        return self.model_copy(update={"sequence": sequence})

    def to_json_text(self) -> str:
        return self.model_dump_json()


class EventBatch(FrozenModel):
    """What the sender POSTs: events of one host, in sequence order."""

    schema_version: Literal[1] = EVENT_SCHEMA_VERSION
    events: List[Event] = Field(min_length=1, max_length=500)
