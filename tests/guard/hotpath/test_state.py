"""agent/guard/hotpath/state.py: appending guard events and audit lines, on a full disk too."""

from __future__ import annotations

import errno
import json
from pathlib import Path

import pytest

from agent.errors import StateWriteError
from agent.guard.hotpath.state import append_json_lines
from tests.conftest import fill_disk


def test_an_append_on_a_full_disk_is_state_write_error_and_keeps_the_earlier_lines(small_disk: Path) -> None:
    """ENOSPC while appending the audit log: StateWriteError (an OSError, caught by the hook's recorder), the lines
    already there untouched."""
    log = small_disk / "audit.log"
    append_json_lines(str(log), [{"event": "first"}])
    fill_disk(small_disk / "filler")
    with pytest.raises(StateWriteError) as info:
        append_json_lines(str(log), [{"event": "second", "pad": "x" * 300000}])
    assert info.value.errno == errno.ENOSPC and "cannot be written (No space left on device)" in str(info.value)
    first = log.read_bytes().split(b"\n")[0]
    assert json.loads(first) == {"event": "first"}


def test_a_directory_in_place_of_the_log_is_state_write_error(tmp_path: Path) -> None:
    """A directory where the events file should be: one StateWriteError, no traceback-worthy bare OSError."""
    (tmp_path / "guard-events.jsonl").mkdir()
    with pytest.raises(StateWriteError, match="guard-events.jsonl: cannot be written"):
        append_json_lines(str(tmp_path / "guard-events.jsonl"), [{"kind": "x"}])
