"""Forward ``guard-events.jsonl`` (written by the apt hook and the rollback code) into the report outbox.

The hook is a short stdlib-only process that cannot reach the outbox, so it appends one JSON object per line to
``<state_dir>/guard-events.jsonl`` under the Host root. This forwarder reads the lines after the position it
last remembered, turns each into a report payload and commits it to the outbox, then stores the new position
(inode, byte offset, line number) atomically in ``<daemon state_dir>/guard-events.position.json``.

Delivery is at least once: a crash between the enqueue and the position write forwards those lines again. The
event id is a hash of the raw line, so the replay is the same event (a no-op in the outbox while it is queued, a
duplicate the receiver acknowledges once delivered). A file whose inode changed or that is shorter than the
offset (rotated or truncated) is read from its start. The outbox remembers acknowledged ids, so a line replayed
after its delivery keeps its first sequence (no gap, no duplicate at the receiver). A partial last line waits for
its end.

A line that is not a known guard record (bad JSON or UTF-8, nested too deeply, a field of the wrong type) is
quarantined: appended as it was to ``<daemon state_dir>/guard-events.quarantine.jsonl``, logged
(``guard_event_malformed``) and reported as a ``state_file_damaged`` event; forwarding moves on to the next line.
A failure to commit (the disk is full) stops the run at that line with the position of the lines before it stored.

Under ``gpuguard run`` the forwarding runs in a job child (``gpuguard _job guard_events``, which validates the lines
with the report models, pydantic); the resident only looks whether there is anything to forward
(:meth:`GuardEventForwarder.has_new_lines`: a stat and the stored position).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Dict, Optional, Tuple, Type, Union

from agent.daemon_jobs.runtime import Runtime
from agent.errors import InputFileError, StateWriteError
from agent.files import (
    FileMissing,
    decode_text,
    open_append_regular,
    open_regular_file,
    read_bytes_bounded,
    write_atomically,
)
from agent.log import get_logger
from agent.report.plain import PlainStateFileDamaged, Severity
from agent.strictjson import parse_json_text

if TYPE_CHECKING:  # pragma: no cover - the report models only where lines are decoded (the guard_events child)
    from agent.models import FrozenModel
    from agent.report.events import DependenciesBroken, OverrideUsed, PolicyViolation, Rollback, TransactionBlocked

    GuardPayload = Union[TransactionBlocked, PolicyViolation, Rollback, OverrideUsed, DependenciesBroken]

log = get_logger("guard_events")

POSITION_FORMAT = 1
POSITION_MAX_BYTES = 4096  # three integers and a format: anything larger is not ours
# Store the position every this many lines, so a crash during a long backlog replays little.
SAVE_EVERY_LINES = 200
READ_CHUNK_BYTES = 1 << 16
MAX_LINE_DEPTH = 16


class MalformedRecord(ValueError):
    """A guard-events line that is not a record the forwarder knows."""


@dataclass(frozen=True)
class Position:
    """How far the file was forwarded: its inode, the byte offset after the last whole line, that line's number."""

    inode: int = 0
    offset_bytes: int = 0
    line_number: int = 0


def guard_events_path(runtime: Runtime) -> str:
    """Where the guard-events file is: under the Host root, where the apt hook of that root writes it."""
    return runtime.host.file(runtime.paths.guard_events)


def event_id_for_line(raw_line: bytes) -> str:
    """The deterministic event id of one raw line (without its newline): a replay gives the same id."""
    return hashlib.sha256(b"gpuguard-guard-event\0" + raw_line).hexdigest()[:32]


def _fields(model: Type[FrozenModel], record: Dict[str, object]) -> Dict[str, object]:
    """The record's keys the model knows (a newer hook may add fields; they are not an error)."""
    return {k: v for k, v in record.items() if k in model.model_fields}


def payload_from_record(record: object) -> Tuple[GuardPayload, Severity, Optional[dt.datetime]]:
    """The report payload, severity and time of one decoded guard record; MalformedRecord says what is wrong."""
    from pydantic import ValidationError

    from agent.report.events import DependenciesBroken, OverrideUsed, PolicyViolation, Rollback, TransactionBlocked
    from agent.validation import validation_problems

    if not isinstance(record, dict):
        raise MalformedRecord("not a JSON object")
    kind = record.get("kind")
    occurred_at = _parse_time(record.get("occurred_at"))
    try:
        if kind == "transaction_blocked":
            return TransactionBlocked.model_validate(_fields(TransactionBlocked, record)), "critical", occurred_at
        if kind == "policy_violation":
            violation = PolicyViolation.model_validate(_fields(PolicyViolation, record))
            return violation, "warning" if violation.action == "warn" else "critical", occurred_at
        if kind == "rollback":
            rollback = Rollback.model_validate(_fields(Rollback, record))
            return rollback, "warning" if rollback.succeeded else "critical", occurred_at
        if kind == "dependencies_broken":
            return DependenciesBroken.model_validate(_fields(DependenciesBroken, record)), "critical", occurred_at
        if kind == "override_used":
            window = record.get("window")
            if not isinstance(window, dict):
                raise MalformedRecord("override_used without a window object")
            used = OverrideUsed.model_validate({
                "window_id": window.get("id"), "reason": window.get("reason"), "opened_by": window.get("opened_by"),
                "expires_at": window.get("expires_at"), "command_line": record.get("command_line"),
                "violations": [{k: v for k, v in item.items() if k in ("rule", "action", "message", "packages")}
                               for item in record.get("violations") or [] if isinstance(item, dict)]})
            return used, "warning", occurred_at
    except ValidationError as exc:
        problems = "; ".join(validation_problems(exc.errors(), top=str(kind)))
        raise MalformedRecord(f"{kind}: {problems}") from None
    raise MalformedRecord(f"unknown kind {kind!r}")


def _parse_time(value: object) -> Optional[dt.datetime]:
    if not isinstance(value, str):
        return None
    try:
        parsed = dt.datetime.fromisoformat(value)
    except ValueError:
        return None
    return parsed if parsed.tzinfo is not None else None


class GuardEventForwarder:
    """Moves new guard-events lines into the outbox; ``run`` returns how many events it committed."""

    def __init__(self, runtime: Runtime, events_path: str, position_path: Optional[str] = None) -> None:
        self.runtime = runtime
        self.events_path = events_path
        self.position_path = position_path or runtime.paths.guard_events_position
        self.quarantine_path = runtime.paths.guard_events_quarantine

    def has_new_lines(self) -> bool:
        """True when :meth:`run` would read anything: the file grew past the stored position, or was replaced or
        truncated and is not empty. A stat and the position file: what the resident daemon checks."""
        try:
            info = os.stat(self.events_path)
        except FileNotFoundError:
            return False
        position = self.load_position()
        if position.inode != info.st_ino or info.st_size < position.offset_bytes:
            return info.st_size > 0
        return info.st_size != position.offset_bytes

    def load_position(self) -> Position:
        """The stored position; the start of the file when none is stored or it is unreadable (logged)."""
        try:
            data = json.loads(read_bytes_bounded(self.position_path, POSITION_MAX_BYTES).decode("utf-8"))
            if data.get("format") != POSITION_FORMAT:
                raise ValueError(f"format {data.get('format')!r} is not {POSITION_FORMAT}")
            return Position(int(data["inode"]), int(data["offset_bytes"]), int(data["line_number"]))
        except FileMissing:
            return Position()
        except (InputFileError, OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            log.warning("guard_events_position_unreadable", path=self.position_path, error=str(exc),
                        action="forwarding from the start of the file; event ids make the replay harmless")
            return Position()

    def save_position(self, position: Position) -> None:
        write_atomically(self.position_path, json.dumps({
            "format": POSITION_FORMAT, "inode": position.inode, "offset_bytes": position.offset_bytes,
            "line_number": position.line_number}, sort_keys=True) + "\n", mode=0o600)

    def run(self, reason: str = "interval") -> int:
        try:
            info = os.stat(self.events_path)
        except FileNotFoundError:
            return 0
        position = self.load_position()
        if position.inode != info.st_ino or info.st_size < position.offset_bytes:
            if position.offset_bytes or position.inode:
                log.info("guard_events_restarted", path=self.events_path, reason=reason,
                         cause="inode changed" if position.inode != info.st_ino else "file shrank",
                         old_offset_bytes=position.offset_bytes, size_bytes=info.st_size)
            position = Position(info.st_ino, 0, 0)
        if info.st_size == position.offset_bytes:
            return 0
        forwarded = 0
        saved = position
        with open_regular_file(self.events_path) as handle:  # a FIFO in its place: OSError, never a wait
            if os.fstat(handle.fileno()).st_ino != position.inode:
                return 0  # replaced between stat and open: the next run starts on the new file
            handle.seek(position.offset_bytes)
            pending = b""
            try:
                while not self.runtime.stopping.is_set():
                    chunk = handle.read(READ_CHUNK_BYTES)
                    if not chunk:
                        break
                    pending += chunk
                    *lines, pending = pending.split(b"\n")
                    for raw in lines:
                        line_number = position.line_number + 1
                        if self._forward(raw, line_number):
                            forwarded += 1
                        position = Position(position.inode, position.offset_bytes + len(raw) + 1, line_number)
                        if position.line_number - saved.line_number >= SAVE_EVERY_LINES:
                            self.save_position(position)
                            saved = position
            finally:
                # Also when a commit failed: the lines before it are in the outbox, the failed one is read again.
                if position != saved:
                    self.save_position(position)
        if forwarded:
            log.info("guard_events_forwarded", events=forwarded, path=self.events_path, reason=reason,
                     offset_bytes=position.offset_bytes)
        return forwarded

    def _forward(self, raw: bytes, line_number: int) -> bool:
        """Commit one line's event; False (logged) when the line is blank or malformed."""
        text = raw.strip()
        if not text:
            return False
        try:
            payload, severity, occurred_at = decode_line(text)
        except MalformedRecord as exc:
            self._quarantine(raw, line_number, str(exc))
            return False
        self.runtime.emitter.emit(payload, severity=severity, event_id=event_id_for_line(raw),
                                  occurred_at=occurred_at)
        return True

    def _quarantine(self, raw: bytes, line_number: int, problem: str) -> None:
        """Keep a malformed line in the quarantine file and report it; the caller moves on to the next line."""
        try:  # never blocks on a FIFO in its place; a full disk or a non-file stops the run, the position kept
            fd = open_append_regular(self.quarantine_path)
            try:
                view = memoryview(raw + b"\n")
                while view:
                    view = view[os.write(fd, view):]
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError as exc:
            raise StateWriteError.of(self.quarantine_path, exc) from None
        log.warning("guard_event_malformed", path=self.events_path, line_number=line_number, error=problem,
                    action="quarantined", quarantine_path=self.quarantine_path)
        damaged = PlainStateFileDamaged(path=self.events_path, problem=f"line {line_number}: {problem}"[:2000],
                                        moved_to=self.quarantine_path, action="line quarantined; forwarding continues")
        # The same id on a replay: the line is reported once.
        self.runtime.emitter.emit(damaged, severity="warning",
                                  event_id=hashlib.sha256(b"gpuguard-guard-quarantine\0" + raw).hexdigest()[:32])


def decode_line(text: bytes) -> Tuple[GuardPayload, Severity, Optional[dt.datetime]]:
    """One line's payload, severity and time; MalformedRecord for anything else (whatever the line holds)."""
    try:
        record = parse_json_text("guard-events line", decode_text("guard-events line", text),
                                 max_depth=MAX_LINE_DEPTH)
    except InputFileError as exc:
        raise MalformedRecord(exc.reason) from None
    try:
        return payload_from_record(record)
    except MalformedRecord:
        raise
    except Exception as exc:  # noqa: BLE001 - a hostile line (wrong types anywhere) is data, never the job's end
        raise MalformedRecord(f"{type(exc).__name__}: {exc}") from None
