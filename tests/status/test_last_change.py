"""gpuguard status names the newest change of any kind: a health rollback (health-rollback.json), a pairing
rollback or a block (guard-events.jsonl), by their times; a health rollback since the last snapshot is attention."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest

from agent.status.assess import assess
from agent.status.facts import ChangeFacts, GuardFacts, last_guard_change, newest_change
from tests.status.test_assess import healthy
from tests.status.test_command import NOW, StateDir, run_status

SECOND = dt.timedelta(seconds=1)
PAIRING_ROLLBACK = {"kind": "rollback", "reason": "nvidia.pairing", "succeeded": True,
                    "from_versions": {"libnvidia-compute-580": "580.172.08-1"},
                    "to_versions": {"libnvidia-compute-580": "580.159.04-1"},
                    "detail": "libnvidia-compute-580 does not pair with the loaded module"}
HEALTH_ROLLBACK = {"health_status": "cpu_fallback", "status": "rolled_back",
                   "from_versions": {"cuda-cudart-13-0": "13.0.96-1", "cuda-toolkit-13-0": "13.0.2-1"},
                   "to_versions": {"cuda-cudart-13-0": "13.0.88-1", "cuda-toolkit-13-0": "13.0.2-1"}}


def write_health_rollback(state: StateDir, at: dt.datetime, **changes: object) -> None:
    """health-rollback.json where the health-gated rollback writes it (the state directory under the Host root)."""
    path = state.root / str(state.state).lstrip("/") / "health-rollback.json"
    path.write_text(json.dumps({**HEALTH_ROLLBACK, "at": at.isoformat(), **changes}))


def guard_line(at: dt.datetime, **event: object) -> str:
    return json.dumps({"occurred_at": at.isoformat(), **event}) + "\n"


@pytest.fixture
def state(tmp_path: Path) -> StateDir:
    return StateDir(tmp_path).healthy()


def test_health_rollback_15_s_ago_is_named_over_an_older_pairing_rollback(state: StateDir) -> None:
    """As on the H200: 15 s after a health rollback, with a pairing rollback 27 s ago in the guard log, status names
    the health rollback with its reason and from -> to versions, and it is attention (exit 30), not ok."""
    state.guard_events().write_text(guard_line(NOW - 27 * SECOND, **PAIRING_ROLLBACK))
    write_health_rollback(state, NOW - 15 * SECOND)
    code, text = run_status(state, "--offline")
    assert code == 30, text
    assert ("WARN  guard       last change: health rollback 15 s ago (the health check found cpu_fallback: "
            "cuda-cudart-13-0 13.0.96-1 -> 13.0.88-1)") in text
    assert "nvidia.pairing" not in text
    _, document = run_status(state, "--offline", "--json")
    change = json.loads(document)["facts"]["guard"]["last_change"]
    assert change["kind"] == "health_rollback" and change["moves"] == ["cuda-cudart-13-0 13.0.96-1 -> 13.0.88-1"]


def test_a_newer_pairing_rollback_or_block_is_named_over_an_older_health_rollback(state: StateDir) -> None:
    """A pairing rollback after the health rollback is the newest change; then a block after both is."""
    write_health_rollback(state, NOW - 40 * dt.timedelta(minutes=1))
    state.guard_events().write_text(guard_line(NOW - 27 * SECOND, **PAIRING_ROLLBACK))
    code, text = run_status(state, "--offline")
    assert code == 0, text
    assert ("ok    guard       last change: rollback 27 s ago (nvidia.pairing: libnvidia-compute-580 580.172.08-1 "
            "-> 580.159.04-1)") in text
    with state.guard_events().open("a") as log:
        log.write(guard_line(NOW - 5 * SECOND, kind="transaction_blocked", tool="apt", rule="cuda-pin",
                             message="cuda-toolkit-13-1 breaks cuda-pin", packages={"cuda-toolkit-13-1": "13.1.0-1"}))
        log.write(guard_line(NOW - 2 * SECOND, kind="policy_violation", rule="cuda-pin"))  # not a change
    code, text = run_status(state, "--offline")
    assert code == 0 and "ok    guard       last change: blocked 5 s ago (cuda-pin)" in text, text


def test_a_failed_health_rollback_fails_and_an_old_one_is_ok(state: StateDir) -> None:
    """A health rollback that failed is failing (exit 31); one done longer ago than a snapshot interval is ok."""
    write_health_rollback(state, NOW - 2 * dt.timedelta(hours=1), status="failed")
    code, text = run_status(state, "--offline")
    assert code == 31 and "FAIL  guard       last change: health rollback FAILED 2.0 h ago" in text, text
    write_health_rollback(state, NOW - 301 * SECOND)  # the default snapshot interval is 300 s
    code, text = run_status(state, "--offline")
    assert code == 0 and "ok    guard       last change: health rollback 5 min ago" in text, text


def test_a_health_rollback_within_the_snapshot_interval_is_attention() -> None:
    """assess(): a health rollback no older than the snapshot interval is warn; a pairing rollback then is ok."""
    change = ChangeFacts(kind="health_rollback", at=healthy().gathered_at - 299 * SECOND, succeeded=True)
    [check] = [c for c in assess(healthy(guard=GuardFacts(last_change=change))).checks if c.name == "guard"]
    assert check.state == "warn"
    pairing = change.model_copy(update={"kind": "rollback"})
    [check] = [c for c in assess(healthy(guard=GuardFacts(last_change=pairing))).checks if c.name == "guard"]
    assert check.state == "ok"


def test_newest_change_and_the_last_guard_change_in_a_tail() -> None:
    """The guard log's last rollback or block is found past other kinds and a cut first line; the newest by time
    wins, one without a time counts as oldest."""
    tail = (b'ed_at": "2026-06-01T11:00:00+00:00", "kind": "rollback"}\n'
            + guard_line(NOW - 60 * SECOND, kind="transaction_blocked", rule="r").encode()
            + guard_line(NOW - 30 * SECOND, kind="override_used", reason="x").encode() + b"garbage\n")
    found = last_guard_change(tail, first_line_cut=True)
    assert found is not None and (found.kind, found.reason, found.at) == ("transaction_blocked", "r", NOW - 60 * SECOND)
    undated = ChangeFacts(kind="rollback")
    assert newest_change(undated, found, None) == found and newest_change(None) is None
