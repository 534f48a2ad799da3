"""One health check at a time: the daemon's check and ``gpuguard health run`` never share the GPUs.

Whoever runs a check holds an exclusive ``flock`` on ``<state_dir>/health/check.lock`` (StatePaths) for the whole
check, from before its look at the GPUs to after the probe has gone. The kernel drops the lock when the holder
dies, so a killed daemon child never leaves it held. Another check waits for it, bounded (``[health]
check_lock_wait_seconds``, ``health run --wait-seconds``), saying so once, and then runs; or gives up with the
``deferred`` outcome and names the holder.

The holder writes who it is into the lock file (its pid, when it started, its probe's session and uid once the
probe is started). The record outlives the holder on purpose: a probe left running by a holder that was killed is
still gpuguard's own, and the next check's busy-GPU detection (tenants.py) must not count it as another job.
"""

from __future__ import annotations

import datetime as dt
import fcntl
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Callable, Optional

from agent.errors import InputFileError
from agent.files import open_regular_file
from agent.jsonrecord import JsonRecord, iso_time
from agent.log import get_logger
from agent.statepaths import StatePaths

log = get_logger("health.checklock")
_POLL_SECONDS = 0.1
_RECORD_MAX_BYTES = 4096


@dataclass(frozen=True)
class CheckHolder(JsonRecord):
    """Who holds (or last held) the health-check lock, as its lock-file record says."""

    pid: int
    started_at: dt.datetime
    probe_session: Optional[int] = None
    probe_uid: Optional[int] = None

    def describe(self) -> str:
        return f"pid {self.pid}, started {iso_time(self.started_at)}"


def parse_holder(text: str) -> Optional[CheckHolder]:
    """The record of a lock file's text; None for an empty, partly written or foreign one (RecordError is a
    ValueError, as json's own)."""
    try:
        return CheckHolder.from_json(json.loads(text))
    except ValueError:
        return None


def state_file_error(path: str, exc: OSError) -> InputFileError:
    """One line for a state file the check cannot make or open; an unwritable state directory says what to do."""
    reason = exc.strerror or str(exc)
    if isinstance(exc, PermissionError):
        reason += " (the state directory is not this user's: run as root, or give --state-dir DIR)"
    return InputFileError(path, reason)


def read_holder(state_dir: str) -> Optional[CheckHolder]:
    """The lock file's record (the holder now, or the last one), read without the lock; None when there is none."""
    try:
        with open_regular_file(StatePaths(state_dir).health_check_lock) as stream:  # a FIFO there: None at once
            return parse_holder(stream.read(_RECORD_MAX_BYTES).decode("utf-8", errors="replace"))
    except OSError:
        return None


class CheckLock:
    """The held lock: release it once; record the probe once it is started."""

    def __init__(self, stream: IO[str], holder: CheckHolder, previous: Optional[CheckHolder]) -> None:
        self._stream = stream
        self.holder = holder
        # The record that was there before this holder took it: a probe it names may still be running.
        self.previous = previous
        self._write(holder)

    def _write(self, holder: CheckHolder) -> None:
        self._stream.seek(0)
        self._stream.truncate()
        self._stream.write(json.dumps(holder.to_json()))
        self._stream.flush()

    def record_probe(self, session: int, uid: Optional[int]) -> None:
        """Name the started probe (its session id is its pid) in the record, for whoever checks next."""
        self.holder = CheckHolder(self.holder.pid, self.holder.started_at, session, uid)
        try:
            self._write(self.holder)
        except OSError as exc:
            log.warning("health_check_lock_record_failed", error=exc.strerror or str(exc))

    def release(self) -> None:
        if self._stream.closed:
            return
        fcntl.flock(self._stream.fileno(), fcntl.LOCK_UN)
        self._stream.close()

    def __enter__(self) -> "CheckLock":
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def acquire_check_lock(state_dir: str, wait_seconds: float, on_wait: Optional[Callable[[str], None]] = None,
                       clock: Callable[[], float] = time.monotonic,
                       sleep: Callable[[float], None] = time.sleep) -> Optional[CheckLock]:
    """The lock, waiting up to ``wait_seconds`` for another check; None when it stayed held that long.

    ``on_wait(line)`` is called once, when the lock is found held, with a line naming the holder and the bound.
    InputFileError when the lock file cannot be made or opened (an unwritable state directory).
    """
    path = Path(StatePaths(state_dir).health_check_lock)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        stream = open(path, "a+", encoding="utf-8")
    except OSError as exc:
        raise state_file_error(str(path), exc) from None
    deadline = clock() + wait_seconds
    told = False
    while True:
        try:
            fcntl.flock(stream.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            pass
        except OSError as exc:
            stream.close()
            raise InputFileError(str(path), exc.strerror or str(exc)) from None
        if not told:
            told = True
            holder = read_holder(state_dir)
            who = holder.describe() if holder is not None else "holder unknown"
            log.info("health_check_lock_waiting", path=str(path), holder=who, wait_seconds=wait_seconds)
            if on_wait is not None:
                on_wait(f"gpuguard: another health check is running ({who}); waiting up to {wait_seconds:g} s "
                        "for it to finish")
        if clock() >= deadline:
            stream.close()
            return None
        sleep(min(_POLL_SECONDS, max(0.0, deadline - clock())))
    stream.seek(0)
    previous = parse_holder(stream.read(_RECORD_MAX_BYTES))
    now = dt.datetime.now(dt.timezone.utc).replace(microsecond=0)
    return CheckLock(stream, CheckHolder(os.getpid(), now), previous)
