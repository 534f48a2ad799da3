"""The health-check lock (agent/health/checklock.py): its record read back, damaged records ignored, release."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from agent.errors import InputFileError
from agent.health.checklock import acquire_check_lock, parse_holder, read_holder, state_file_error

pytestmark = pytest.mark.timeout(30)


def test_a_damaged_record_is_ignored_and_the_lock_still_taken(tmp_path: Path) -> None:
    """A half-written or foreign lock file names no holder; the lock is taken and its record rewritten whole."""
    lock_file = tmp_path / "health" / "check.lock"
    lock_file.parent.mkdir()
    lock_file.write_text('{"pid": 12')
    assert parse_holder(lock_file.read_text()) is None and parse_holder('{"pid": "x"}') is None
    lock = acquire_check_lock(str(tmp_path), 0)
    assert lock is not None and lock.previous is None
    with lock:
        lock.record_probe(4242, 998)
        holder = read_holder(str(tmp_path))
        assert holder is not None and (holder.pid, holder.probe_session, holder.probe_uid) == (os.getpid(), 4242, 998)
    again = acquire_check_lock(str(tmp_path), 0)  # released on leaving the block
    assert again is not None and again.previous == holder
    again.release()


def test_an_unwritable_state_directory_is_one_line(tmp_path: Path) -> None:
    """A state directory the lock file cannot be made in is an InputFileError naming the lock file."""
    blocker = tmp_path / "state"
    blocker.write_text("a file where the state directory should be")
    with pytest.raises(InputFileError, match="check.lock"):
        acquire_check_lock(str(blocker), 0)


def test_a_state_directory_of_another_user_says_what_to_do() -> None:
    """Permission denied on a state file (a non-root user and root's state directory) names --state-dir."""
    error = state_file_error("/var/lib/x/health/check.lock", PermissionError(13, "Permission denied"))
    assert str(error) == ("/var/lib/x/health/check.lock: Permission denied (the state directory is not this user's: "
                          "run as root, or give --state-dir DIR)")
    assert str(state_file_error("/s/f", FileNotFoundError(2, "No such file or directory"))).endswith("directory")
