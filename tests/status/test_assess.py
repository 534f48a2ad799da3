"""assess(): facts and a time in, checks and the exit code out; every rule on a table of cases."""

from __future__ import annotations

import datetime as dt
from typing import Any, Dict

import pytest

from agent.status.assess import STATUS_EXIT_CODES, assess
from agent.status.facts import (
    DaemonFacts,
    GuardFacts,
    HealthFacts,
    HubFacts,
    LastSnapshot,
    MetricsFacts,
    OutboxFacts,
    PolicyFacts,
    RollbackFacts,
    StatusFacts,
)

NOW = dt.datetime(2026, 6, 1, 12, 0, tzinfo=dt.timezone.utc)
MIN = dt.timedelta(minutes=1)


def healthy(**changes: Any) -> StatusFacts:
    """A host where everything is fine; ``changes`` replace whole fact groups."""
    fields: Dict[str, Any] = dict(
        gathered_at=NOW, config_path="/etc/gpuguard/agent.toml", state_dir="/var/lib/gpuguard",
        snapshot_interval_seconds=300, health_enabled=True, health_interval_seconds=21600,
        delivery_interval_seconds=30, daemon=DaemonFacts(pids=[4242], systemd_state="active"),
        snapshot=LastSnapshot(taken_at=NOW - 2 * MIN, content_hash="c" * 64),
        health=HealthFacts(status="pass", finished_at=NOW - 60 * MIN, summary="8 GPUs, gemm within baseline"),
        guard=GuardFacts(last_kind="transaction_blocked", last_at=NOW - 90 * MIN, last_message="rocm-pin"),
        rollback=RollbackFacts(guarded=33, restorable=33, by_source={"archive cache": 1, "rebuilt": 32},
                               summary="33/33 guarded packages restorable: 1 from the archive cache, 32 rebuilt "
                                       "from the installed files"),
        metrics=MetricsFacts(compliant=True, written_at=NOW - MIN),
        outbox=OutboxFacts(depth=2, oldest_enqueued_at=NOW - 10 * dt.timedelta(seconds=1)),
        hub=HubFacts(endpoint_url="https://hub.example:8470", checked=True, status_code=200, latency_ms=12.0))
    fields.update(changes)
    return StatusFacts(**fields)


def test_a_healthy_host_is_ok_and_exits_0() -> None:
    """Every check ok (or info), verdict ok, exit 0."""
    result = assess(healthy())
    assert (result.verdict, result.exit_code) == ("ok", 0)
    assert {c.name: c.state for c in result.checks} == {
        "daemon": "ok", "snapshot": "ok", "compliance": "ok", "health": "ok", "guard": "ok", "rollback": "ok",
        "policy": "ok", "outbox": "ok", "hub": "ok"}


@pytest.mark.parametrize("changes, check, state", [
    ({"daemon": DaemonFacts()}, "daemon", "fail"),
    ({"daemon": DaemonFacts(pids=[1], systemd_state="failed")}, "daemon", "fail"),
    ({"daemon": DaemonFacts(systemd_state="active")}, "daemon", "ok"),
    ({"snapshot": LastSnapshot()}, "snapshot", "warn"),
    ({"snapshot": LastSnapshot(taken_at=NOW - 20 * MIN)}, "snapshot", "warn"),
    ({"snapshot": LastSnapshot(taken_at=NOW - MIN, critical_findings=1)}, "snapshot", "warn"),
    ({"snapshot": LastSnapshot(problem="last-snapshot.json: not valid JSON")}, "snapshot", "fail"),
    ({"metrics": MetricsFacts(compliant=False)}, "compliance", "fail"),
    ({"metrics": MetricsFacts()}, "compliance", "info"),
    ({"health": HealthFacts(status="regression", finished_at=NOW)}, "health", "fail"),
    ({"health": HealthFacts(status="cpu_fallback", finished_at=NOW)}, "health", "fail"),
    ({"health": HealthFacts(status="skipped", finished_at=NOW)}, "health", "info"),
    ({"health": HealthFacts(status="pass", finished_at=NOW - dt.timedelta(days=2))}, "health", "warn"),
    ({"health": HealthFacts(problem="health/last.json: not valid JSON")}, "health", "fail"),
    ({"health": HealthFacts()}, "health", "info"),
    ({"guard": GuardFacts(last_kind="rollback", last_at=NOW, last_succeeded=False)}, "guard", "fail"),
    ({"guard": GuardFacts(last_kind="rollback", last_at=NOW, last_succeeded=True)}, "guard", "ok"),
    ({"outbox": OutboxFacts(depth=40, oldest_enqueued_at=NOW - 30 * MIN)}, "outbox", "warn"),
    ({"outbox": OutboxFacts(dropped_total=3)}, "outbox", "warn"),
    ({"outbox": OutboxFacts(problem="outbox.sqlite3: unreadable outbox (file is not a database)")}, "outbox", "fail"),
    ({"hub": HubFacts(endpoint_url="https://hub", checked=True, error="ConnectTimeout")}, "hub", "warn"),
    ({"hub": HubFacts(endpoint_url="https://hub", checked=True, status_code=503)}, "hub", "warn"),
    ({"hub": HubFacts(endpoint_url="https://hub", checked=True, status_code=404)}, "hub", "ok"),
    ({"hub": HubFacts(endpoint_url="https://hub")}, "hub", "info"),
    ({"hub": HubFacts()}, "hub", "info"),
    ({"policy": PolicyFacts(source="bundle", description="bundle serial 4 from hub, key AB", bundle_serial=4)},
     "policy", "ok"),
    ({"policy": PolicyFacts(source="bundle", description="bundle (none installed)")}, "policy", "warn"),
    ({"policy": PolicyFacts(source="bundle", bundle_serial=4, refused_serial=5, refused_reason="signature: bad",
                            refusal_pending=True)}, "policy", "warn"),
    ({"policy": PolicyFacts(problem="policy-bundle/state.json: not valid JSON")}, "policy", "warn"),
])
def test_each_rule(changes: Dict[str, Any], check: str, state: str) -> None:
    """One changed fact group moves its check to the expected state and the verdict and exit code with it."""
    result = assess(healthy(**changes))
    assert {c.name: c.state for c in result.checks}[check] == state
    verdict = {"fail": "failing", "warn": "attention"}.get(state, "ok")
    assert (result.verdict, result.exit_code) == (verdict, STATUS_EXIT_CODES[verdict])


def test_summaries_are_one_line_with_ages() -> None:
    """Summaries say how long ago, on one line each; the outbox line says when the hub last took a batch."""
    result = assess(healthy(metrics=MetricsFacts(compliant=True, last_delivery_success_at=NOW - 5 * MIN)))
    text = {c.name: c.summary for c in result.checks}
    assert text["outbox"] == "2 event(s) waiting, oldest enqueued 10 s ago, last delivery 5 min ago"
    assert text["snapshot"].startswith("taken 2 min ago") and text["health"].startswith("pass 60 min ago")
    assert all("\n" not in c.summary for c in result.checks)


def test_rollback_row_says_the_coverage_and_names_what_cannot_be_restored_exactly() -> None:
    """The rollback row: ok with the coverage line when complete; attention naming the packages no file was kept
    for and the ones only restorable inexactly; info before any known-good set."""
    complete = {c.name: c for c in assess(healthy()).checks}["rollback"]
    assert complete.state == "ok" and complete.summary == ("33/33 guarded packages restorable: 1 from the archive "
                                                           "cache, 32 rebuilt from the installed files")
    partial = RollbackFacts(guarded=33, restorable=31, by_source={"rebuilt": 31},
                            not_restorable=["cuda-cudart-13-0"], inexact={"libnvidia-compute-580": ["changed"]},
                            summary="31/33 guarded packages restorable: 31 rebuilt from the installed files",
                            attention=["not restorable (no package file kept): cuda-cudart-13-0",
                                       "libnvidia-compute-580 restorable only inexactly (changed since installation:"
                                       " /usr/lib/x86_64-linux-gnu/libcuda.so.580.95.05)"])
    result = assess(healthy(rollback=partial))
    row = {c.name: c for c in result.checks}["rollback"]
    assert row.state == "warn" and (result.verdict, result.exit_code) == ("attention", 30)
    assert "31/33 guarded packages restorable" in row.summary and "cuda-cudart-13-0" in row.summary
    assert "libnvidia-compute-580 restorable only inexactly" in row.summary
    none = {c.name: c for c in assess(healthy(rollback=RollbackFacts())).checks}["rollback"]
    assert none.state == "info" and none.summary == "no known-good set recorded yet"


def test_the_status_table_shows_escapes_in_a_health_summary_as_text() -> None:
    """A health summary holding ESC[2J, OSC 52 and CR (from an older result file) is shown escaped in the table."""
    from agent.status.render import render_table

    facts = healthy(health=HealthFacts(status="failed", finished_at=NOW - MIN,
                                       summary="x\x1b[2J\x1b]52;c;eA==\x07\rPASS"))
    table = render_table(facts, assess(facts, NOW))
    assert "\x1b" not in table and "\x07" not in table and "\r" not in table
    assert "x\\x1b[2J\\x1b]52;c;eA==\\x07\\rPASS" in table
