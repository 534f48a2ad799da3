"""What the resident daemon and its job children say to each other: one request and one result record per job.

    job           request            result
    config        ConfigRequest      ConfigResult       the settings validated (start, SIGHUP), the policy compiled
    restore       JobRequest         RestoreResult      what the previous run stored: the snapshot's facts, the health
    snapshot      SnapshotRequest    SnapshotResult     compliance, a stack change, the stored snapshot's facts
    guard_check   JobRequest         GuardCheckResult   check_and_rollback's status, or its error / interruption
    guard_events  JobRequest         ForwardResult      guard-events.jsonl lines forwarded to the outbox
    health        HealthRequest      HealthChildResult  what the check found (HealthSummary), the last status
    deliver       JobRequest         DeliverResult      how far the drain got (delivery.Drained); the lean child's plan
    policy_fetch  JobRequest         PolicyFetchResult  the hub's policy bundle for this host: unchanged, installed,
                                                        refused (why) or the fetch failed; the next probe's plan
    lean          LeanRequest        LeanResult         the policy probe (HubProbePlan -> {outcome, digest}), the lean
                                                        delivery (LeanDeliveryRequest -> {outcome, drained}) or both
                                                        (not agent code: agent/daemon_jobs/lean_child.py, stdlib only)

The request travels as JSON on the child's command line (``--request``), the result as a JSON file the child writes
(``--result``), wrapped in a :class:`ChildReply` with the child's peak RSS. Both are :class:`JsonRecord` s, read back
checked field by field: a result that is not what its record says (a field missing, of another type, unknown) is a
failed child (``ChildJobFailed`` naming the field, agent/daemon_jobs/children.py), never a KeyError in the daemon.
Every result of a job that writes to the outbox says how many ``events`` it committed, so the daemon wakes delivery.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Optional, Tuple

from agent.bundle.rollout_fields import RolloutFields
from agent.bundle.state import RefusalKind
from agent.daemon_jobs.delivery import Drained
from agent.daemon_jobs.resident_settings import ConfigProblem, ResidentSettings, SettingsInForce
from agent.daemon_jobs.runtime import SnapshotFacts
from agent.errors import ConfigError
from agent.jsonrecord import JsonObject, JsonRecord
from agent.report.plain import PlainPairing, PlainWorkload

if TYPE_CHECKING:  # pragma: no cover
    from agent.guard.rollback.core import GuardResult

# The health modes the daemon's schedule asks for (None: the configured mode).
AskedMode = Literal["functional", "full"]


@dataclass(frozen=True)
class ChildContext(JsonRecord):
    """What every job child needs from the daemon's memory: the settings in force (the validated JSON of the config
    child: a reload it refused keeps the old ones), the host id and name events are stamped with, the daemon's pid."""

    settings: JsonObject
    host_id: str
    hostname: str
    daemon_pid: Optional[int] = None  # None: run by hand (no stop on the daemon's death)


@dataclass(frozen=True)
class JobRequest(JsonRecord):
    """A job's request: the context and why it runs (``interval``, ``package_change``, ...)."""

    context: ChildContext
    reason: str


@dataclass(frozen=True)
class SnapshotRequest(JobRequest):
    """The snapshot job's: also the rules already reported as violated (each violation is reported once)."""

    violated_rules: Tuple[str, ...] = ()


@dataclass(frozen=True)
class HealthRequest(JobRequest):
    """The health job's: the mode the schedule asks for, and whether a package change is being judged."""

    mode: Optional[AskedMode] = None
    after_change: bool = False


@dataclass(frozen=True)
class ConfigRequest(JsonRecord):
    """The config job's: the settings in force (None at start), and whether to compile the policy (SIGHUP)."""

    in_force: Optional[JsonObject] = None
    compile_policy: bool = False
    daemon_pid: Optional[int] = None


@dataclass(frozen=True)
class ChildReply(JsonRecord):
    """What a child writes to its result file: its job's result and its own peak RSS (VmHWM)."""

    peak_rss_kib: int
    result: JsonObject


@dataclass(frozen=True)
class ConfigResult(JsonRecord):
    """The config file validated: the resident's view and the whole as JSON, or why it cannot be used."""

    view: Optional[ResidentSettings] = None
    dump: Optional[JsonObject] = None
    problem: Optional[ConfigProblem] = None

    def __post_init__(self) -> None:
        if (self.problem is None) == (self.view is None or self.dump is None):
            raise ValueError("a config result holds either the settings (view and dump) or a problem")

    def in_force(self) -> SettingsInForce:
        """The settings to run with; ConfigError with every problem of a file that cannot be used."""
        if self.problem is not None:
            raise ConfigError(self.problem.path, self.problem.problems)
        assert self.view is not None and self.dump is not None  # __post_init__
        return SettingsInForce(self.view, self.dump)


@dataclass(frozen=True)
class HealthSeen(JsonRecord):
    """A health result's status, when the check started (Unix time), whether it followed a package change (None:
    not known), and its registered workloads' verdicts (None: none ran)."""

    status: str
    at_seconds: Optional[float] = None
    after_change: Optional[bool] = None
    workloads: Optional[Tuple[PlainWorkload, ...]] = None


@dataclass(frozen=True)
class RestoreResult(JsonRecord):
    """What the previous run stored, read back for the daemon at its start (a damaged file reported by the child)."""

    events: int
    snapshot: Optional[SnapshotFacts] = None
    pairing: Optional[PlainPairing] = None
    health: Optional[HealthSeen] = None


@dataclass(frozen=True)
class SnapshotResult(JsonRecord):
    """One snapshot run: compliance, the rules violated now, a stack change, the stored snapshot's facts."""

    events: int
    compliant: Optional[bool]
    violated_rules: Tuple[str, ...]
    stack_changed: Optional[str]  # the reason the health check is asked with, None: the stack did not move
    hostname: str
    snapshot: Optional[SnapshotFacts] = None
    pairing: Optional[PlainPairing] = None


@dataclass(frozen=True)
class GuardChecked(JsonRecord):
    """What one ``check_and_rollback`` found and did (agent.guard.rollback.core.GuardResult, as the daemon logs it)."""

    status: str
    detail: str = ""
    reboot_required: bool = False

    @classmethod
    def of(cls, result: GuardResult) -> GuardChecked:
        return cls(status=result.status, detail=result.detail, reboot_required=result.reboot_required)


@dataclass(frozen=True)
class GuardCheckResult(JsonRecord):
    """The guard check child's outcome: checked, failed (``expected``: a known error, no traceback) or interrupted."""

    checked: Optional[GuardChecked] = None
    error: Optional[str] = None
    expected: bool = False
    interrupted: Optional[str] = None


@dataclass(frozen=True)
class ForwardResult(JsonRecord):
    """guard-events.jsonl forwarded: how many lines became events (``events`` also counts quarantine reports)."""

    events: int
    forwarded: int


@dataclass(frozen=True)
class HealthSummary(JsonRecord):
    """What one health check found: its status, when, in which mode, whether other jobs were on the GPUs, and what
    the gate did (a rollback and its recheck, a check due after a change that came during it)."""

    status: str
    at_seconds: Optional[float]
    mode: Optional[str] = None
    busy: bool = False
    tenants: Tuple[str, ...] = ()
    rollback: Optional[str] = None
    reboot_required: bool = False
    recheck_status: Optional[str] = None
    # The health gate (agent/guard/rollback/health_gate.py): a change came during the check, so a check after it is
    # due; and the package changes since the last pass that the verdict covers (for people).
    again: bool = False
    covers: str = ""


@dataclass(frozen=True)
class HealthChildResult(JsonRecord):
    """The health child's outcome: the check's summary (None: none ran) and the last status it knows."""

    events: int
    summary: Optional[HealthSummary] = None
    last: Optional[HealthSeen] = None


@dataclass(frozen=True)
class DeliveryPlan(JsonRecord):
    """How the full delivery child sends, for the stdlib-only one (agent/daemon_jobs/lean_delivery.py): the URL it
    POSTs to, its token file, the CA file requests verified with (and its hashed copy), its timeouts, batch size,
    User-Agent and batch schema version, and the outbox file."""

    ingest_url: str
    token_file: Optional[str]
    ca_file: Optional[str]
    connect_timeout_seconds: float
    read_timeout_seconds: float
    batch_size: int
    user_agent: str
    schema_version: int
    outbox_path: str
    # The CA file's hashed copy and the file's stamp it was built from (agent/report/tls_anchors.py): the lean child
    # verifies through the directory while the file's stat still matches. None: it loads the whole file.
    ca_anchor_dir: Optional[str] = None
    ca_file_stamp: Optional[Tuple[int, int, int, int]] = None


@dataclass(frozen=True)
class DeliverResult(JsonRecord):
    """The delivery child's drain, and the lean child's plan (None: requests would send otherwise, a proxy say)."""

    events: int
    drained: Drained
    plan: Optional[DeliveryPlan] = None


@dataclass(frozen=True)
class LeanDeliveryRequest(JsonRecord):
    """The lean delivery child's request: the plan, and the host id the events must carry (else the full child)."""

    plan: DeliveryPlan
    host_id: str
    daemon_pid: Optional[int] = None  # None: run by hand (no stop on the daemon's death)


@dataclass(frozen=True)
class SentBatch(JsonRecord):
    """One batch the lean delivery child got acknowledged (the daemon logs it as ``delivery_batch_sent``)."""

    events: int
    accepted: int
    duplicates: int
    first_sequence: int
    last_sequence: int


@dataclass(frozen=True)
class LeanDeliveryResult(JsonRecord):
    """The lean delivery child's answer: ``delivered`` (the outbox emptied), ``down`` (``drained.failure`` says how:
    no HTTP answer, or 502/503/504) or ``unsure`` (anything else: the full child decides); ``drained`` also says
    when a batch was last acknowledged, ``batches`` what was sent."""

    outcome: Literal["delivered", "down", "unsure"]
    drained: Drained
    detail: str = ""
    batches: Tuple[SentBatch, ...] = ()  # the first MAX_BATCHES_LISTED (agent/daemon_jobs/lean_delivery.py)
    trust: str = ""  # why the CA file's anchor directory was given up for the whole file (hub_probe.py's Trust)


@dataclass(frozen=True)
class HubProbePlan(JsonRecord):
    """What the stdlib-only probe asks next time (agent/daemon_jobs/hub_probe.py): the full fetch's requests, in its
    order (path with query, the If-None-Match sent or None), its token file, the CA file requests verified with (and
    its hashed copy), its timeouts and the largest answer any of them reads."""

    endpoint_url: str
    token_file: Optional[str]
    ca_file: Optional[str]
    connect_timeout_seconds: float
    read_timeout_seconds: float
    deadline_seconds: float
    max_bytes: int
    paths: Tuple[Tuple[str, Optional[str]], ...]
    ca_anchor_dir: Optional[str] = None  # as DeliveryPlan's
    ca_file_stamp: Optional[Tuple[int, int, int, int]] = None


@dataclass(frozen=True)
class HubProbeResult(JsonRecord):
    """The probe's answer: ``down`` (no HTTP answer to the first request, or only 502/503/504), ``answered`` (the
    answers' ``digest``) or ``unsure`` (anything else: the full fetch decides)."""

    outcome: Literal["down", "answered", "unsure"]
    digest: str = ""
    detail: str = ""
    trust: str = ""  # as LeanDeliveryResult's


@dataclass(frozen=True)
class PolicyFetchResult(JsonRecord):
    """The policy fetch child's outcome (agent/daemon_jobs/policy_fetch.py): ``off`` (no hub configured),
    ``unchanged`` (304, or the bundle in force), ``none`` (204), ``installed``, ``refused`` (with its ``kind``) or
    ``failed``. ``serial`` is never a refused answer's claim: the bundle's own once verified, else None."""

    outcome: Literal["off", "unchanged", "none", "installed", "refused", "failed"]
    serial: Optional[int] = None
    detail: str = ""
    rollout: Optional[str] = None  # the hub's staged-rollout notice, display text (agent/bundle/rollout.py)
    rollout_fields: Optional[RolloutFields] = None  # what the hand-off decides on (agent/bundle/rollout_fields.py)
    trust: str = ""  # why a newer root or the freshness statement was not taken (agent/bundle/channel.py)
    kind: Optional[RefusalKind] = None  # why a bundle was refused (agent/wire.py's REFUSAL_KINDS)
    # What the stdlib-only probe asks before the next full fetch; None: always a full fetch (a proxy, no hub).
    probe: Optional[HubProbePlan] = None


@dataclass(frozen=True)
class LeanRequest(JsonRecord):
    """The lean child's parts (agent/daemon_jobs/lean_child.py): the policy probe's plan, the lean delivery's
    request, or both (on a heartbeat)."""

    probe: Optional[HubProbePlan] = None
    deliver: Optional[LeanDeliveryRequest] = None


@dataclass(frozen=True)
class LeanResult(JsonRecord):
    """The lean child's answer to each part it was asked for (None for a part not asked)."""

    probe: Optional[HubProbeResult] = None
    deliver: Optional[LeanDeliveryResult] = None
