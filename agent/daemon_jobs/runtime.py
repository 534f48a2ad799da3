"""What the daemon's jobs share: the Host, the current Settings, the outbox, state kept between runs, the emitter.

Settings are swapped as a whole on SIGHUP (jobs read ``runtime.settings`` at the start of each run); the state,
the outbox and the sender's backoff survive a reload.
"""

from __future__ import annotations

import datetime as dt
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Dict, FrozenSet, List, Optional, Tuple

from agent.config import Settings
from agent.errors import InputFileError
from agent.files import move_aside
from agent.host import Host
from agent.log import get_logger
from agent.report.events import Event, Payload, Severity, StateFileDamaged
from agent.report.outbox import Outbox
from agent.snapshot.pairing import Pairing
from agent.statepaths import StatePaths

if TYPE_CHECKING:  # pragma: no cover
    from agent.report.sender import Sender
    from agent.snapshot.model import Snapshot

# Damage reports kept in memory while the outbox cannot take them (a full disk); the newest are kept.
MAX_HELD_DAMAGE_REPORTS = 100

log = get_logger("runtime")


@dataclass(frozen=True)
class SnapshotFacts:
    """What the daemon shows of the last snapshot (heartbeat, metrics textfile, NFD labels).

    Small and plain, so that a snapshot child can hand it back in its JSON result: the resident daemon never reads a
    snapshot itself (issue #17: the snapshot's records and their pydantic validator stay out of it)."""

    content_hash: str
    taken_at_seconds: float
    findings_by_severity: Tuple[Tuple[str, int], ...] = ()  # in the order first seen, as collections.Counter counts
    finding_kinds: Tuple[str, ...] = ()  # sorted, distinct

    @classmethod
    def of(cls, snap: Snapshot) -> SnapshotFacts:
        severities: Dict[str, int] = {}
        for finding in snap.findings:
            severities[finding.severity] = severities.get(finding.severity, 0) + 1
        return cls(content_hash=snap.content_hash, taken_at_seconds=snap.taken_at.timestamp(),
                   findings_by_severity=tuple(severities.items()),
                   finding_kinds=tuple(sorted({f.kind for f in snap.findings})))

    def to_json(self) -> Dict[str, Any]:
        return {"content_hash": self.content_hash, "taken_at_seconds": self.taken_at_seconds,
                "findings_by_severity": [list(pair) for pair in self.findings_by_severity],
                "finding_kinds": list(self.finding_kinds)}

    @classmethod
    def from_json(cls, data: Dict[str, Any]) -> SnapshotFacts:
        return cls(content_hash=str(data["content_hash"]), taken_at_seconds=float(data["taken_at_seconds"]),
                   findings_by_severity=tuple((str(s), int(n)) for s, n in data.get("findings_by_severity") or ()),
                   finding_kinds=tuple(str(k) for k in data.get("finding_kinds") or ()))


@dataclass
class AgentState:
    """What the daemon knows between job runs; the last snapshot is also on disk and read back at start.

    ``last_snapshot`` is kept only where snapshots are taken in-process (a job child, tests); what the daemon shows of
    it is ``snapshot_facts`` and ``pairing``, which a snapshot child hands back (agent/daemon_jobs/children.py)."""

    started_at_seconds: float = field(default_factory=time.time)
    started_monotonic: float = field(default_factory=time.monotonic)
    last_snapshot: Optional[Snapshot] = None
    snapshot_facts: Optional[SnapshotFacts] = None
    pairing: Optional[Pairing] = None
    compliant: Optional[bool] = None
    violated_rules: FrozenSet[str] = frozenset()
    last_health_status: Optional[str] = None
    last_health_at_seconds: Optional[float] = None
    last_delivery_success_seconds: Optional[float] = None
    delivery_failures: Dict[str, int] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def uptime_seconds(self) -> float:
        return time.monotonic() - self.started_monotonic

    def keep_snapshot(self, snap: Optional[Snapshot], pairing: Optional[Pairing]) -> None:
        """The last snapshot taken or read back in this process (None: none), with its facts and its pairing."""
        with self.lock:
            self.last_snapshot = snap
            self.snapshot_facts = SnapshotFacts.of(snap) if snap is not None else None
            self.pairing = pairing

    def count_delivery_failure(self, category: str) -> None:
        with self.lock:
            self.delivery_failures[category] = self.delivery_failures.get(category, 0) + 1


def host_identity(host: Host, settings: Settings) -> str:
    """The host's stable id: configured ``agent.host_id``, else /etc/machine-id, else the host name."""
    if settings.agent.host_id:
        return settings.agent.host_id
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

    def emit(self, payload: Payload, severity: Severity = "info", event_id: Optional[str] = None,
             occurred_at: Optional[dt.datetime] = None) -> Event:
        """Commit one event; returns it as stored (with its sequence).

        ``event_id`` (default: a random one) makes a re-emitted fact the same event for the outbox and receiver;
        ``occurred_at`` (default: now) is when it happened, for facts recorded by another process.
        """
        extra = {"event_id": event_id} if event_id is not None else {}
        event = Event(host_id=self.host_id, hostname=self.hostname, occurred_at=occurred_at or self._clock(),
                      severity=severity, payload=payload, **extra)
        stored = self.outbox.enqueue(event)
        self.on_enqueued()
        return stored


@dataclass
class Runtime:
    """Everything a job body needs; built once by the daemon, ``settings`` and ``sender`` replaced on reload."""

    host: Host
    settings: Settings
    state_dir: str
    outbox: Outbox
    emitter: EventEmitter
    state: AgentState = field(default_factory=AgentState)
    sender: Optional["Sender"] = None
    stopping: threading.Event = field(default_factory=threading.Event)
    _held_damage: List[StateFileDamaged] = field(default_factory=list, repr=False)

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
        self._report_damage([StateFileDamaged(path=path, problem=problem[:2000], moved_to=moved_to,
                                              action=action[:500])])
        return moved_to

    def report_held_damage(self) -> None:
        """Commit damage reports held back because the outbox could not take them."""
        self._report_damage([])

    def _report_damage(self, reports: List[StateFileDamaged]) -> None:
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
