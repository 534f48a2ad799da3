"""The health gate's window (pure, the time passed in) and its state file (strict, bounded, never reset silently)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from agent.guard.rollback.health_gate import (
    MAX_CHANGES,
    GateState,
    GateStateDamaged,
    gate_decision,
    judge,
    load_gate,
    may_record_pass,
    observe,
    record_pass,
    render_gate,
    update_gate,
)

A = {"amdgpu-dkms": ("1:6.8.5", "all"), "rocm-core": ("6.2.2", "amd64")}
B = {**A, "rocm-core": ("6.2.4", "amd64")}
T = 1_796_000_000.0


def _passed_a() -> GateState:
    return record_pass(observe(GateState(), A, T), A, T)


def test_a_move_since_the_last_look_is_a_change_and_no_move_is_none() -> None:
    """The first look only sets what was seen; a later look that finds the set moved adds one change naming it."""
    state = observe(GateState(), A, T)
    assert state.seen == A and not state.window_open
    assert observe(state, A, T + 1) == state
    moved = observe(state, B, T + 4)
    [change] = moved.changes
    assert (change.at_seconds, change.by, change.describe()) == (
        T + 4, "package_manager", "2026-11-30T00:53:24Z rocm-core 6.2.2 -> 6.2.4")
    assert moved.window_open and moved.noted == 1


def test_a_bypass_the_guard_rolled_back_is_a_change_though_the_set_is_back() -> None:
    """The guard's rollback is a change (named as it moved) even when the installed set ends where it was; the gate's
    own health rollback adds none."""
    state = observe(_passed_a(), A, T + 5, by="guard_rollback",
                    moved=({"amdgpu-dkms": "1:6.10.5"}, {"amdgpu-dkms": "1:6.8.5"}))
    [change] = state.changes
    assert change.by == "guard_rollback" and "the guard's rollback: amdgpu-dkms 1:6.10.5 -> 1:6.8.5" in \
        change.describe()
    after_b = observe(state, B, T + 9)
    back = observe(after_b, A, T + 20, by="health_rollback")
    assert len(after_b.changes) == 2 and back.changes == after_b.changes and back.seen == A


def test_the_window_is_bounded_and_counts_what_it_drops() -> None:
    """More changes than MAX_CHANGES keep the newest and count the rest; the description says how many."""
    state = _passed_a()
    for i in range(MAX_CHANGES + 5):
        state = observe(state, {**A, "rocm-core": (f"6.2.{i + 3}", "amd64")}, T + i)
    assert len(state.changes) == MAX_CHANGES and state.dropped == 5 and state.noted == MAX_CHANGES + 5
    assert state.covered().startswith(f"{MAX_CHANGES + 5} package change(s) (5 older not listed): ")


def test_a_pass_closes_the_window_and_a_failing_verdict_judges_it() -> None:
    """A recorded pass becomes the last set that passed and its verdict covers the changes; judge() closes the window
    with the outcome, keeping the last-passed set."""
    state = observe(_passed_a(), B, T + 4)
    passed = record_pass(state, B, T + 60)
    assert passed.passed == B and not passed.window_open and passed.verdict is not None
    assert (passed.verdict.outcome, len(passed.verdict.covers)) == ("passed", 1)
    judged = judge(state, T + 60, "cpu_fallback", "rolled_back")
    assert judged.passed == A and not judged.window_open and judged.verdict is not None
    assert (judged.verdict.status, judged.verdict.outcome, judged.verdict.covers) == (
        "cpu_fallback", "rolled_back", state.changes)


@pytest.mark.parametrize("before,after,known_good,noted_before,expected", [
    (B, B, B, 1, True),  # unchanged during the check and the guard's known-good set
    (A, A, B, 1, True),  # the last set that passed itself (the recheck after a rollback to it)
    (B, B, A, 1, False),  # the guard has not judged this set yet (a bypass, or its check still to come)
    (A, B, B, 1, False),  # the set moved during the check
    (B, B, B, 0, False),  # a change was noted during the check
    (None, B, B, 1, False),  # the gate could not look before the check
])
def test_which_pass_may_become_the_last_set_that_passed(before: object, after: object, known_good: object,
                                                        noted_before: int, expected: bool) -> None:
    """A pass is recorded only for a set that stayed put during the check and that the guard recorded (or passed)."""
    state = observe(_passed_a(), B, T + 4)  # noted == 1
    assert may_record_pass(state, before, after, known_good, noted_before) is expected  # type: ignore[arg-type]


@pytest.mark.parametrize("action,status,after_change,window_open,confirmed,expected", [
    ("rollback", "cpu_fallback", True, False, False, "rollback"),  # the check after a change, as before
    ("rollback", "cpu_fallback", False, True, False, "rollback"),  # a periodic check, changes unjudged
    ("rollback", "failed", False, True, False, "rollback"),
    ("rollback", "regression", False, True, False, "confirm"),
    ("rollback", "regression", False, True, True, "rollback"),
    ("rollback", "cpu_fallback", False, False, False, "none"),  # a periodic check, nothing changed since the pass
    ("rollback", "busy", False, True, False, "none"),
    ("rollback", "timeout", True, True, False, "none"),
    ("alert", "cpu_fallback", True, True, False, "none"),
])
def test_the_gate_decision_table(action: str, status: str, after_change: bool, window_open: bool, confirmed: bool,
                                 expected: str) -> None:
    """gate_decision() is the after-change table, for the check after a change and any check while changes since
    the last pass are unjudged."""
    assert gate_decision(action, status, after_change, window_open, confirmed) == expected


def test_the_file_round_trips_and_updates_under_the_lock(tmp_path: Path) -> None:
    """update_gate writes what load_gate reads back (0600); a missing file is an empty window."""
    path = str(tmp_path / "health-gate.json")
    assert load_gate(path) == GateState()
    state = observe(_passed_a(), B, T + 4)
    written = update_gate(path, lambda s: state)
    assert load_gate(path) == written == state
    assert os.stat(path).st_mode & 0o777 == 0o600


@pytest.mark.parametrize("damage", [
    "{not json",
    "NEGATIVE",  # a count below zero
    "[]",
    "UNKNOWN",  # an unknown field
    "MOVES",  # a change naming too many packages
    "BY",  # a change by nobody the gate knows
])
def test_a_damaged_file_is_reported_and_never_overwritten(tmp_path: Path, damage: str) -> None:
    """A file that is not the gate's state (invalid JSON, wrong shape, unknown fields, over its bounds) raises
    GateStateDamaged naming it, and update_gate leaves it as it was."""
    path = tmp_path / "health-gate.json"
    data = json.loads(render_gate(observe(_passed_a(), B, T + 4)))
    if damage == "UNKNOWN":
        data["extra"] = 1
    elif damage == "MOVES":
        data["changes"][0]["moves"] *= 65
    elif damage == "NEGATIVE":
        data["dropped"] = -1
    elif damage == "BY":
        data["changes"][0]["by"] = "someone"
    text = json.dumps(data) if damage.isupper() else damage
    path.write_text(text)
    with pytest.raises(GateStateDamaged) as caught:
        update_gate(str(path), lambda s: GateState())
    assert str(path) in str(caught.value)
    assert path.read_text() == text
