"""What the daemon's jobs share: the Host, the current Settings, the outbox, state kept between runs, the emitter.

Settings are swapped as a whole on SIGHUP (jobs read ``runtime.settings`` at the start of each run); the state,
the outbox and the sender's backoff survive a reload.
"""

from __future__ import annotations

import datetime as dt
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Dict, FrozenSet, List, Optional

from agent.config import Settings
from agent.errors import InputFileError
from agent.files import move_aside
from agent.host import Host
from agent.log import get_logger
from agent.report.events import Event, Payload, Severity, StateFileDamaged
from agent.report.outbox import Outbox
from agent.snapshot.model import Snapshot
from agent.snapshot.pairing import Pairing

if TYPE_CHECKING:  # pragma: no cover
    from agent.report.sender import Sender

LAST_SNAPSHOT_FILENAME = "last-snapshot.json"
# Damage reports kept in memory while the outbox cannot take them (a full disk); the newest are kept.
MAX_HELD_DAMAGE_REPORTS = 100

log = get_logger("runtime")


@dataclass
class AgentState:
    """What the daemon knows between job runs; the last snapshot is also on disk and read back at start."""

    started_at_seconds: float = field(default_factory=time.time)
    started_monotonic: float = field(default_factory=time.monotonic)
    last_snapshot: Optional[Snapshot] = None
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

    def state_path(self, name: str) -> str:
        return f"{self.state_dir.rstrip('/')}/{name}"

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


def load_last_snapshot(runtime: Runtime, report_damage: bool = True) -> Optional[Snapshot]:
    """The snapshot stored by the previous run, or None: first start, or a damaged file (moved aside and reported,
    unless ``report_damage`` is False because a job child already reported it)."""
    from agent.snapshot.io import load_snapshot

    path = runtime.state_path(LAST_SNAPSHOT_FILENAME)
    try:
        return load_snapshot(path)
    except InputFileError as exc:
        if exc.reason != "no such file" and report_damage:
            runtime.report_damaged_file(path, exc.reason, "starting without a previous snapshot")
        return None
