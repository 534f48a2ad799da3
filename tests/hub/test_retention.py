"""Retention with a fixed clock, on SQLite and a real PostgreSQL: old heartbeats and events go in batches, each
host's newest event of each kind and the hosts table stay, and one of several hubs runs each pass."""

from __future__ import annotations

import datetime as dt
import threading
import time
from pathlib import Path
from typing import Dict, Iterator, List, Tuple

import pytest

from agent.hub.periodic import Periodic
from agent.hub.retention import RetentionPolicy, RetentionWorker, run_pass
from agent.hub.rows import EventQuery
from agent.hub.settings import HubSettings
from agent.hub.store import SQLiteStore, Store, make_store
from agent.report.events import PAYLOAD_KINDS, Event
from tests.hub.factories import ROCM_62, event

NOW = dt.datetime(2026, 6, 1, 12, 0, tzinfo=dt.timezone.utc)
HOUR = dt.timedelta(hours=1)
DAY = dt.timedelta(days=1)


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/hub.db"
    return str(request.getfixturevalue("postgres_url"))


@pytest.fixture
def store(store_url: str) -> Iterator[Store]:
    opened = make_store(store_url)
    opened.open()
    yield opened
    opened.close()


def stored(store: Store) -> List[Tuple[str, str]]:
    """(host_id, event_id) of every stored event, sorted."""
    return sorted((Event.model_validate_json(s.body).host_id, Event.model_validate_json(s.body).event_id)
                  for s in store.events(EventQuery(limit=1000)))


def arrive(store: Store, events: List[Event]) -> None:
    """Each event received by the hub at the time it carries (a true clock; skewed ones: test_receipt_order.py)."""
    for one in events:
        store.ingest([[one]], received_at=one.occurred_at)


def keys(events: List[Event]) -> List[Tuple[str, str]]:
    return sorted((e.host_id, e.event_id) for e in events)


def test_cutoffs_follow_the_policy_and_zero_keeps_a_kind_forever() -> None:
    """Heartbeats by hours, every other kind by days; 0 leaves the kind out (kept forever)."""
    cutoffs = RetentionPolicy(heartbeat_hours=6, event_days=30).cutoffs(NOW)
    assert cutoffs["heartbeat"] == NOW - 6 * HOUR
    assert {kind: at for kind, at in cutoffs.items() if kind != "heartbeat"} == {
        kind: NOW - 30 * DAY for kind in PAYLOAD_KINDS if kind != "heartbeat"}
    assert RetentionPolicy(heartbeat_hours=0, event_days=0).cutoffs(NOW) == {}
    assert set(RetentionPolicy(heartbeat_hours=0, event_days=1).cutoffs(NOW)) == set(PAYLOAD_KINDS) - {"heartbeat"}


def test_a_pass_deletes_old_events_but_keeps_each_hosts_newest_of_each_kind(store: Store) -> None:
    """Old heartbeats and snapshots go; a stale host's last heartbeat, a lone old event and host rows stay."""
    old_heartbeats = [event("host-a", at=NOW - hours * HOUR) for hours in (72, 48, 30)]
    recent_heartbeats = [event("host-a", at=NOW - hours * HOUR) for hours in (23, 2)]
    stale_host = [event("host-b", at=NOW - 100 * DAY)]  # gone quiet: its one heartbeat is its latest state
    old_snapshots = [event("host-a", kind="snapshot_changed", at=NOW - days * DAY, pairing=ROCM_62)
                     for days in (200, 95)]
    newest_snapshot = [event("host-a", kind="snapshot_changed", at=NOW - 10 * DAY, pairing=ROCM_62)]
    lone_old_violation = [event("host-a", kind="policy_violation", at=NOW - 300 * DAY)]
    everything = (old_heartbeats + recent_heartbeats + stale_host + old_snapshots + newest_snapshot
                  + lone_old_violation)
    arrive(store, everything)
    hosts_before = store.hosts()

    deleted = run_pass(store, RetentionPolicy(heartbeat_hours=24, event_days=90), NOW, batch_rows=1000)

    assert deleted == {"heartbeat": 3, "snapshot_changed": 2}
    assert stored(store) == keys(recent_heartbeats + stale_host + newest_snapshot + lone_old_violation)
    assert store.hosts() == hosts_before  # host state is forever


def test_a_pass_works_in_batches_and_stops_between_them_when_asked(store: Store) -> None:
    """batch_rows bounds each transaction; a set stop event ends the pass after the current batch."""
    arrive(store, [event("host-a", at=NOW - (30 + i) * HOUR) for i in range(7)] + [event("host-a", at=NOW)])
    policy = RetentionPolicy(heartbeat_hours=24, event_days=0)
    calls: List[int] = []
    stopping = threading.Event()

    class Counting:
        def claim_retention_pass(self, now: dt.datetime, min_interval_seconds: float) -> bool:
            return True

        def prune_batch(self, kind: str, cutoff: dt.datetime, limit: int) -> int:
            count = store.prune_batch(kind, cutoff, limit)
            calls.append(count)
            stopping.set()
            return count

    assert run_pass(Counting(), policy, NOW, batch_rows=2, stopping=stopping, pause_seconds=0) == {"heartbeat": 2}
    stopping.clear()
    calls.clear()
    rest = run_pass(store, policy, NOW, batch_rows=2, pause_seconds=0)
    assert rest == {"heartbeat": 5}
    assert len(stored(store)) == 1


def test_of_several_hubs_on_one_database_one_runs_each_pass(store_url: str, store: Store) -> None:
    """The claim is a compare-and-set in the database: a second hub within the interval gets None."""
    other = make_store(store_url)
    other.open()
    try:
        arrive(store, [event("host-a", at=NOW - 48 * HOUR), event("host-a", at=NOW)])
        clock = {"now": NOW}
        mine = RetentionWorker(store, RetentionPolicy(24, 90), 600, 100, lambda: clock["now"])
        theirs = RetentionWorker(other, RetentionPolicy(24, 90), 600, 100, lambda: clock["now"])
        assert mine.run_once() == {"heartbeat": 1}
        assert theirs.run_once() is None
        clock["now"] = NOW + dt.timedelta(seconds=600)
        assert theirs.run_once() == {}
        assert mine.run_once() is None
    finally:
        other.close()


def test_the_scheduled_pass_does_not_prune_at_start_and_stops_promptly(tmp_path: Path) -> None:
    """A hub that just started leaves the database alone for its first minute; the scheduler stops at once."""
    store = SQLiteStore(str(tmp_path / "hub.db"))
    store.open()
    periodic = Periodic()
    try:
        arrive(store, [event("host-a", at=NOW - 48 * HOUR), event("host-a", at=NOW)])
        worker = RetentionWorker(store, RetentionPolicy(24, 90), 600, 100, lambda: NOW)
        worker.schedule(periodic)
        periodic.start()
        started = time.monotonic()
        worker.stop()
        periodic.stop()
        assert time.monotonic() - started < 30  # not held until the first pass (a minute on): load-proof
        assert worker.pass_count == 0 and len(stored(store)) == 2
    finally:
        store.close()


def test_retention_keeping_everything_schedules_nothing() -> None:
    """0 hours and 0 days delete nothing ever: no job is added."""
    periodic = Periodic()
    RetentionWorker(_NoStore(), RetentionPolicy(0, 0), 600, 100, lambda: NOW).schedule(periodic)
    assert periodic.job_names() == []


class _NoStore:
    """A store the test never reaches (the worker must not touch it)."""

    def __getattr__(self, name: str) -> None:
        raise AssertionError(f"store.{name} used")


def test_settings_carry_the_retention_and_worker_knobs() -> None:
    """hub.toml keys: workers, retention_heartbeat_hours, retention_event_days, interval and batch size."""
    from agent.hub.settings import parse_hub_settings

    parsed = parse_hub_settings("workers = 4\nretention_heartbeat_hours = 6\nretention_event_days = 0\n"
                                "retention_interval_seconds = 60\nretention_batch_rows = 500\n")
    assert (parsed.workers, parsed.retention_heartbeat_hours, parsed.retention_event_days,
            parsed.retention_interval_seconds, parsed.retention_batch_rows) == (4, 6, 0, 60, 500)
    defaults: Dict[str, object] = HubSettings().model_dump()
    assert (defaults["workers"], defaults["retention_heartbeat_hours"], defaults["retention_event_days"]) == (1, 6, 90)

