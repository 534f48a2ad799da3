"""Override windows with an injected clock: open, expire, close, limits, audit lines, corrupt files."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest

from agent.errors import InputFileError, UsageError
from agent.guard.hotpath.overrides import active_windows, end_windows, load_windows, start_window

T0 = dt.datetime(2026, 3, 1, 12, 0, tzinfo=dt.timezone.utc)


def _paths(tmp_path: Path):
    return str(tmp_path / "overrides.json"), str(tmp_path / "audit.log")


def test_window_is_active_until_it_expires(tmp_path: Path) -> None:
    """An override window is active until its minutes run out, and its opening is audited with the reason."""
    overrides, audit = _paths(tmp_path)
    window = start_window(overrides, audit, 60, "kernel swap", 240, now=lambda: T0, opened_by="ops")
    windows = load_windows(overrides)
    assert active_windows(windows, T0 + dt.timedelta(minutes=59)) == [window]
    assert active_windows(windows, T0 + dt.timedelta(minutes=60)) == []
    line = json.loads(Path(audit).read_text().splitlines()[0])
    assert line["event"] == "override_started" and line["window"]["reason"] == "kernel swap"


def test_ending_a_window_closes_it_now_and_audits(tmp_path: Path) -> None:
    """Ending a window closes it at once and audits it; ending an unknown window is a UsageError."""
    overrides, audit = _paths(tmp_path)
    window = start_window(overrides, audit, 60, "x", 240, now=lambda: T0, opened_by="ops")
    closed = end_windows(overrides, audit, now=lambda: T0 + dt.timedelta(minutes=5))
    assert [w.id for w in closed] == [window.id]
    assert active_windows(load_windows(overrides), T0 + dt.timedelta(minutes=6)) == []
    assert '"event":"override_ended"' in Path(audit).read_text()
    with pytest.raises(UsageError, match="no active override window"):
        end_windows(overrides, audit, now=lambda: T0 + dt.timedelta(minutes=7), window_id="nope")


@pytest.mark.parametrize("minutes,reason,fragment", [(500, "x", "longer than the policy allows"),
                                                     (0, "x", "must be positive"), (10, "  ", "needs a --reason")])
def test_limits(tmp_path: Path, minutes: float, reason: str, fragment: str) -> None:
    """A window longer than the policy allows, of no minutes or without a reason is a UsageError saying which."""
    with pytest.raises(UsageError, match=fragment):
        start_window(*_paths(tmp_path), minutes, reason, 240, now=lambda: T0)


@pytest.mark.parametrize("text,fragment", [
    ("{", "not valid JSON"),
    ('{"format": 2, "windows": []}', "not a gpuguard override file"),
    ('{"format": 1, "windows": [{"id": "a", "started_at": "yesterday", "expires_at": "x"}]}',
     "windows -> 1 -> started_at: 'yesterday' is not an ISO timestamp"),
    ('{"format": 1, "windows": [{"started_at": "2026-01-01T00:00:00", "expires_at": "2026-01-01T01:00:00"}]}',
     "has no time zone"),
])
def test_corrupt_state_file_is_an_input_file_error(tmp_path: Path, text: str, fragment: str) -> None:
    """An overrides file of another format, a bad timestamp or one without a time zone is an InputFileError (exit 4)."""
    overrides, _ = _paths(tmp_path)
    Path(overrides).write_text(text)
    with pytest.raises(InputFileError, match=fragment) as info:
        load_windows(overrides)
    assert info.value.exit_code == 4


def test_override_list_caps_a_hand_written_window_at_the_policys_longest(tmp_path: Path) -> None:
    """``override list`` shows a window written into the file until 2099 as over once the policy's 240 min passed."""
    import io

    from agent.cli import main

    state = tmp_path / "var/lib/gpuguard"
    state.mkdir(parents=True)
    started = dt.datetime.now(dt.timezone.utc) - dt.timedelta(hours=5)
    (state / "overrides.json").write_text(json.dumps({"format": 1, "windows": [
        {"id": "w1", "started_at": started.isoformat(), "expires_at": "2099-01-01T00:00:00+00:00",
         "reason": "by hand", "opened_by": "root"}]}))
    out = io.StringIO()
    assert main(["override", "list", "--root", str(tmp_path), "--config", str(tmp_path / "none.toml")], out=out) == 0
    assert out.getvalue().startswith("w1 expired ") and "2099" not in out.getvalue()
