"""What the daemon's jobs share: the Host, the settings in force, the outbox, state kept between runs, the emitter.

The settings are swapped as a whole on SIGHUP (``runtime.in_force``; jobs read ``runtime.settings``, the resident's
plain view, at the start of each run, and bodies that run in a job child the whole model, ``job_settings()``); the
state, the outbox and the sender's backoff survive a reload. Nothing here imports pydantic (issue #28).
"""

from __future__ import annotations

import datetime as dt
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Dict, FrozenSet, List, Optional, Tuple

from agent.daemon_jobs.resident_settings import ResidentSettings, SettingsInForce
from agent.errors import InputFileError
from agent.files import move_aside
from agent.host import Host
from agent.jsonrecord import JsonRecord
from agent.log import get_logger
from agent.report.outbox import Outbox
from agent.report.plain import (
    PlainEvent,
    PlainPairing,
    PlainStateFileDamaged,
    PlainUnknownVersion,
    PlainWorkload,
    ReportPayload,
    Severity,
)
from agent.statepaths import StatePaths
from agent.wire import MAX_HEARTBEAT_UNKNOWN_VERSIONS

if TYPE_CHECKING:  # pragma: no cover
    from agent.config import Settings
    from agent.report.sender import Sender
    from agent.snapshot.model import Snapshot
    from agent.snapshot.pairing import Pairing

# Damage reports kept in memory while the outbox cannot take them (a full disk); the newest are kept.
MAX_HELD_DAMAGE_REPORTS = 100

log = get_logger("runtime")


@dataclass(frozen=True)
class SnapshotFacts(JsonRecord):
    """What the daemon shows of the last snapshot (heartbeat, metrics textfile, NFD labels).

    Small and plain, so that a snapshot child can hand it back in its JSON result: the resident daemon never reads a
    snapshot itself (issue #17: the snapshot's records and their pydantic validator stay out of it)."""

    content_hash: str
    taken_at_seconds: float
    findings_by_severity: Tuple[Tuple[str, int], ...] = ()  # in the order first seen, as collections.Counter counts
    finding_kinds: Tuple[str, ...] = ()  # sorted, distinct
    # its unknown_to_table findings (agent/policy/table_unknown.py), the heartbeat's unknown_versions: the first
    # MAX_HEARTBEAT_UNKNOWN_VERSIONS, distinct, in the snapshot's order
    unknown_versions: Tuple[PlainUnknownVersion, ...] = ()

    @classmethod
    def of(cls, snap: Snapshot) -> SnapshotFacts:
        severities: Dict[str, int] = {}
        for finding in snap.findings:
            severities[finding.severity] = severities.get(finding.severity, 0) + 1
        return cls(content_hash=snap.content_hash, taken_at_seconds=snap.taken_at.timestamp(),
                   findings_by_severity=tuple(severities.items()),
                   finding_kinds=tuple(sorted({f.kind for f in snap.findings})),
                   unknown_versions=unknown_versions(snap))


def unknown_versions(snap: Snapshot) -> Tuple[PlainUnknownVersion, ...]:
    """The snapshot's unknown_to_table findings as the heartbeat carries them; a finding whose details do not make
    a valid item (a stored snapshot of another agent) is left out, never sent."""
    out: List[PlainUnknownVersion] = []
    for finding in snap.findings:
        if finding.kind != "unknown_to_table":
            continue
        d = finding.details
        try:
            item = PlainUnknownVersion(table=d.get("table", ""), component=finding.component,
                                       version=d.get("version", ""), newest=d.get("newest", ""),
                                       dated=d.get("table_dated", ""))
        except ValueError:
            continue
        if item not in out:
            out.append(item)
    return tuple(out[:MAX_HEARTBEAT_UNKNOWN_VERSIONS])


@dataclass
class AgentState:
    """What the daemon knows between job runs; the last snapshot is also on disk and read back at start.

    ``last_snapshot`` is kept only where snapshots are taken in-process (a job child, tests); what the daemon shows of
    it is ``snapshot_facts`` and ``pairing``, which a snapshot child hands back (agent/daemon_jobs/children.py)."""

    started_at_seconds: float = field(default_factory=time.time)
    started_monotonic: float = field(default_factory=time.monotonic)
    last_snapshot: Optional[Snapshot] = None
    snapshot_facts: Optional[SnapshotFacts] = None
    pairing: Optional[PlainPairing] = None
    compliant: Optional[bool] = None
    violated_rules: FrozenSet[str] = frozenset()
    last_health_status: Optional[str] = None
    last_health_at_seconds: Optional[float] = None
    # Whether that check was the one after a package change (None: not known, e.g. read back after a restart).
    last_health_after_change: Optional[bool] = None
    # The registered workloads of that check (None: none ran or not known), for the heartbeat (issue 44).
    last_workloads: Optional[Tuple[PlainWorkload, ...]] = None
    last_delivery_success_seconds: Optional[float] = None
    delivery_failures: Dict[str, int] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def uptime_seconds(self) -> float:
        return time.monotonic() - self.started_monotonic

    def keep_snapshot(self, snap: Optional[Snapshot], pairing: Optional[Pairing]) -> None:
        """The last snapshot taken or read back in this process (None: none), with its facts and its pairing."""
        plain = None if pairing is None else PlainPairing.from_json(pairing.model_dump(mode="json"), ("pairing",))
        with self.lock:
            self.last_snapshot = snap
            self.snapshot_facts = SnapshotFacts.of(snap) if snap is not None else None
            self.pairing = plain

    def count_delivery_failure(self, category: str) -> None:
        with self.lock:
            self.delivery_failures[category] = self.delivery_failures.get(category, 0) + 1


def host_identity(host: Host, configured: Optional[str]) -> str:
    """The host's stable id: ``agent.host_id`` when configured, else /etc/machine-id, else the host name."""
    if configured:
        return configured
    machine_id = host.read_first_line("/etc/machine-id")
    return machine_id or host.hostname()


class EventEmitter:
    """Wraps payloads into Events of this host, commits them to the outbox and wakes delivery."""

    def __init__(self, outbox: Outbox, host_id: str, hostname: str,
                 clock: Callable[[], dt.datetime], on_enqueued: Callable[[], None] = lambda: None) -> None:
        self.outbox = outbox
        self.host_id = host_id
        self.hostname = hostname
        self._clock = clock
        self.on_enqueued = on_enqueued

    def emit(self, payload: ReportPayload, severity: Severity = "info", event_id: Optional[str] = None,
             occurred_at: Optional[dt.datetime] = None, wake_delivery: bool = True) -> PlainEvent:
        """Commit one event; returns it as stored (with its sequence).

        ``event_id`` (default: a random one) makes a re-emitted fact the same event for the outbox and receiver;
        ``occurred_at`` (default: now) is when it happened, for facts recorded by another process.
        ``wake_delivery`` False: the caller has the event delivered itself (the heartbeat's, with the policy probe).
        """
        event = PlainEvent.of(payload, self.host_id, self.hostname, occurred_at or self._clock(), severity, event_id)
        stored = self.outbox.enqueue(event)
        if wake_delivery:
            self.on_enqueued()
        return stored


@dataclass
class Runtime:
    """Everything a job body needs; built once by the daemon, ``in_force`` and ``sender`` replaced on reload."""

    host: Host
    in_force: SettingsInForce
    state_dir: str
    outbox: Outbox
    emitter: EventEmitter
    state: AgentState = field(default_factory=AgentState)
    sender: Optional["Sender"] = None
    stopping: threading.Event = field(default_factory=threading.Event)
    _held_damage: List[PlainStateFileDamaged] = field(default_factory=list, repr=False)

    @property
    def settings(self) -> ResidentSettings:
        """What the resident's jobs read of the settings in force."""
        return self.in_force.view

    def job_settings(self) -> Settings:
        """The whole settings model in force, for bodies that run in a job child (imports pydantic)."""
        return self.in_force.model()

    @property
    def paths(self) -> StatePaths:
        """The files of the daemon's state directory."""
        return StatePaths(self.state_dir)

    def check_outbox(self, reason: str = "interval") -> None:
        """Run the outbox's integrity check (a damaged file is salvaged) and report any damage found."""
        self.outbox.check()
        self.report_outbox_damage()

    def report_outbox_damage(self) -> None:
        """Commit one state_file_damaged event per damage the outbox found and survived (and any held back)."""
        self._report_damage(self.outbox.take_damage())

    def report_damaged_file(self, path: str, problem: str, action: str) -> Optional[str]:
        """Move a damaged state file aside (kept for inspection), log it and commit ``state_file_damaged``.

        Returns where the file went (None when it could not be moved). Never raises: the caller carries on from
        a safe default whatever happens here; a report that cannot be committed (the disk is full) is held in
        memory and committed by a later run (``report_held_damage``).
        """
        moved_to = move_aside(path)
        log.error("state_file_damaged", path=path, problem=problem, moved_to=moved_to, action=action)
        self._report_damage([PlainStateFileDamaged(path=path, problem=problem[:2000], moved_to=moved_to,
                                                   action=action[:500])])
        return moved_to

    def report_held_damage(self) -> None:
        """Commit damage reports held back because the outbox could not take them."""
        self._report_damage([])

    def _report_damage(self, reports: List[PlainStateFileDamaged]) -> None:
        with self.state.lock:
            pending = self._held_damage + reports
            self._held_damage = []
        for index, report in enumerate(pending):
            try:
                self.emitter.emit(report, severity="critical")
            except Exception as exc:  # noqa: BLE001 - held and retried; the log line stands meanwhile
                held = pending[index:][-MAX_HELD_DAMAGE_REPORTS:]
                with self.state.lock:
                    self._held_damage = held + self._held_damage
                log.warning("state_file_damaged_report_held", held=len(held), error=f"{type(exc).__name__}: {exc}")
                return


def load_last_snapshot(runtime: Runtime) -> Optional[Snapshot]:
    """The snapshot stored by the previous run, or None: first start, or a damaged file (moved aside and reported)."""
    from agent.snapshot.io import load_snapshot

    path = runtime.paths.last_snapshot
    try:
        return load_snapshot(path)
    except InputFileError as exc:
        if exc.reason != "no such file":
            runtime.report_damaged_file(path, exc.reason, "starting without a previous snapshot")
        return None
