"""Override windows: a time-limited, audited permission to make changes the policy would refuse.

``gpuguard override start --minutes 60 --reason "..."`` records a window in ``overrides.json`` under the state
directory and an ``override_started`` line in the audit log. While a window is open the apt hook lets violating
transactions through and audits each one (``override_used``); expired windows are ignored. Removing gpuguard itself
needs a window opened with ``--allow-self-removal`` (``allow_self_removal``): one opened for a kernel or a driver
never lets the guard's own removal through (hotpath/decision.py, ``Decision.self_protection``). Standard library
only.
"""

from __future__ import annotations

import datetime as dt
import json
import os

from agent.errors import InputFileError, UsageError
from agent.files import decode_text, write_atomically
from agent.guard.hotpath.state import append_json_line
from agent.records import Record
from agent.strictjson import parse_json_text

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs milliseconds of the apt hook's start-up budget
    from typing import Callable, List, Optional

    Clock = Callable[[], dt.datetime]

FORMAT = 1
# The policy model's upper bound on max_override_minutes: no window is ever honoured for longer.
LONGEST_WINDOW_MINUTES = 7 * 24 * 60
MAX_OVERRIDES_BYTES = 1 << 20


def utc_now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


class OverrideWindow(Record):
    """One maintenance window (aware datetimes); a record because the apt hook reads these."""

    __slots__ = ("id", "started_at", "expires_at", "reason", "opened_by", "allow_self_removal")
    id: str
    started_at: dt.datetime
    expires_at: dt.datetime
    reason: str
    opened_by: str
    allow_self_removal: bool

    def __init__(self, id: str, started_at: dt.datetime, expires_at: dt.datetime, reason: str,
                 opened_by: str, allow_self_removal: bool = False) -> None:
        Record.__init__(self, id, started_at, expires_at, reason, opened_by, allow_self_removal)

    def is_active(self, now: dt.datetime) -> bool:
        return self.started_at <= now < self.expires_at

    def to_dict(self) -> dict:
        return {"id": self.id, "started_at": self.started_at.isoformat(), "expires_at": self.expires_at.isoformat(),
                "reason": self.reason, "opened_by": self.opened_by, "allow_self_removal": self.allow_self_removal}


def _parse_time(value: object, path: str, where: str) -> dt.datetime:
    if not isinstance(value, str):
        raise InputFileError(path, f"{where}: not a timestamp")
    try:
        parsed = dt.datetime.fromisoformat(value)
    except ValueError:
        raise InputFileError(path, f"{where}: {value!r} is not an ISO timestamp") from None
    if parsed.tzinfo is None:
        raise InputFileError(path, f"{where}: {value!r} has no time zone")
    return parsed


def load_windows(path: str, max_minutes: float = LONGEST_WINDOW_MINUTES) -> List[OverrideWindow]:
    """Every recorded window (active or not); empty when the file does not exist, InputFileError when corrupt.

    Each window ends at most ``max_minutes`` after it started, whatever the file says: the policy's
    ``max_override_minutes`` is enforced when a window is read, not only when one is opened, so a window written
    into the file by hand (``"expires_at": "2099-..."``) is honoured for the policy's longest window only. The file
    is read without blocking and bounded (a FIFO or a huge file in its place is a corrupt file).
    """
    from agent.hostfacts.paths import read_regular_file

    try:
        raw = read_regular_file(path, MAX_OVERRIDES_BYTES)
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise InputFileError(path, exc.strerror or str(exc)) from None
    data = parse_json_text(path, decode_text(path, raw))
    if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("windows"), list):
        raise InputFileError(path, f"not a gpuguard override file (format {FORMAT} with a 'windows' list)")
    longest = dt.timedelta(minutes=max(0.0, min(float(max_minutes), LONGEST_WINDOW_MINUTES)))
    windows = []
    for index, item in enumerate(data["windows"], 1):
        where = f"windows -> {index}"
        if not isinstance(item, dict):
            raise InputFileError(path, f"{where}: not an object")
        started = _parse_time(item.get("started_at"), path, where + " -> started_at")
        expires = _parse_time(item.get("expires_at"), path, where + " -> expires_at")
        windows.append(OverrideWindow(
            id=str(item.get("id", "")), started_at=started, expires_at=min(expires, started + longest),
            reason=str(item.get("reason", "")), opened_by=str(item.get("opened_by", "")),
            allow_self_removal=item.get("allow_self_removal") is True))
    return windows


def active_windows(windows: List[OverrideWindow], now: dt.datetime) -> List[OverrideWindow]:
    return [w for w in windows if w.is_active(now)]


def _save(path: str, windows: List[OverrideWindow]) -> None:
    write_atomically(path, json.dumps({"format": FORMAT, "windows": [w.to_dict() for w in windows]}, indent=2,
                                      sort_keys=True) + "\n", mode=0o640)


def who() -> str:
    """The operator behind this command: the sudo caller when there is one."""
    user = os.environ.get("SUDO_USER") or os.environ.get("USER") or os.environ.get("LOGNAME")
    if user:
        return user
    try:
        import pwd

        return pwd.getpwuid(os.getuid()).pw_name
    except (ImportError, KeyError):
        return f"uid {os.getuid()}"


def start_window(overrides_path: str, audit_path: str, minutes: float, reason: str, max_minutes: float,
                 now: Clock = utc_now, opened_by: Optional[str] = None,
                 allow_self_removal: bool = False) -> OverrideWindow:
    """Open a window of ``minutes`` from now (``allow_self_removal``: it also lets gpuguard's own package be
    removed); UsageError for an empty reason or a window longer than allowed."""
    if not reason.strip():
        raise UsageError("an override needs a --reason (it goes to the audit log)")
    if minutes <= 0:
        raise UsageError("--minutes must be positive")
    if minutes > max_minutes:
        raise UsageError(f"--minutes {minutes:g} is longer than the policy allows ({max_minutes:g} minutes)")
    import secrets  # only for opening windows, never on the hook's path

    started = now()
    window = OverrideWindow(id=secrets.token_hex(4), started_at=started,
                            expires_at=started + dt.timedelta(minutes=minutes), reason=reason.strip(),
                            opened_by=opened_by or who(), allow_self_removal=allow_self_removal)
    kept = [w for w in load_windows(overrides_path) if w.expires_at > started]
    _save(overrides_path, kept + [window])
    audit(audit_path, "override_started", started, window=window.to_dict())
    return window


def end_windows(overrides_path: str, audit_path: str, now: Clock = utc_now,
                window_id: Optional[str] = None) -> List[OverrideWindow]:
    """Close the given window (or every active one) now; returns the windows closed."""
    current = now()
    windows = load_windows(overrides_path)
    closed, kept = [], []
    for window in windows:
        if window.expires_at <= current:
            continue  # expired windows are dropped from the file; the audit log keeps their story
        if window_id is None or window.id == window_id:
            closed.append(window)
            kept.append(OverrideWindow(window.id, window.started_at, current, window.reason, window.opened_by,
                                       window.allow_self_removal))
        else:
            kept.append(window)
    if window_id is not None and not closed:
        raise UsageError(f"no active override window with id {window_id!r}")
    _save(overrides_path, kept)
    for window in closed:
        audit(audit_path, "override_ended", current, window=window.to_dict(), ended_by=who())
    return closed


def audit(audit_path: str, event: str, at: dt.datetime, **fields: object) -> None:
    """Append one line to the audit log."""
    append_json_line(audit_path, {"at": at.isoformat(), "event": event, **fields})
