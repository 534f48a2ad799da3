"""Events on the hub's clock (issue 43), on SQLite and a real PostgreSQL: retention, the drift listing, the event
listing and their "since" filters go by when the hub received an event, whatever the agent's clock said; agents a
year ahead, a day ahead and ten minutes behind."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any, Dict, Iterator, List

import pytest

from agent.hub.fleet import drift_hosts
from agent.hub.retention import RetentionPolicy, run_pass
from agent.hub.rows import DRIFT_KINDS, EventQuery
from agent.hub.store import SqlStore, make_store
from agent.report.events import Event
from agent.wire import INGEST_PATH
from tests.hub.conftest import READER, HubClock, bearer
from tests.hub.factories import ROCM_62, batch_json, event, ids

NOW = dt.datetime(2026, 6, 1, 12, 0, tzinfo=dt.timezone.utc)
MINUTE = dt.timedelta(minutes=1)
SKEWS = {"year-ahead": dt.timedelta(days=365), "day-ahead": dt.timedelta(days=1),
         "ten-minutes-behind": -10 * MINUTE}
SIX_MINUTES = RetentionPolicy(heartbeat_hours=0.1, event_days=0)  # heartbeats kept 6 minutes, other kinds forever


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SqlStore]:
    url = f"sqlite:///{tmp_path}/hub.db" if request.param == "sqlite" else str(request.getfixturevalue("postgres_url"))
    opened = make_store(url)
    opened.open()
    yield opened
    opened.close()


def received(store: SqlStore, host_id: str, skew: dt.timedelta, at: dt.datetime, kind: str = "heartbeat",
             **payload: object) -> Event:
    """One event of ``host_id`` that the hub receives at ``at`` (its clock), dated by an agent ``skew`` off."""
    sent = event(host_id, kind=kind, at=at + skew, **payload)
    store.ingest([[sent]], received_at=at)
    return sent


def stored_ids(store: SqlStore, **query: object) -> List[str]:
    return [Event.model_validate_json(s.body).event_id for s in store.events(EventQuery(limit=1000, **query))]


@pytest.mark.parametrize("skew", SKEWS.values(), ids=SKEWS.keys())
def test_retention_deletes_what_the_hub_received_before_the_cutoff_whatever_the_agents_clock(
        store: SqlStore, skew: dt.timedelta) -> None:
    """A skewed agent's heartbeats go exactly when the hub's clock puts them past retention: one received 7
    minutes ago goes, those received 5 and 1 minutes ago stay; the 5-minute one goes 1 microsecond after it is 6
    minutes old, not before."""
    old = received(store, "skewed", skew, NOW - 7 * MINUTE)
    edge = received(store, "skewed", skew, NOW - 5 * MINUTE)
    fresh = received(store, "skewed", skew, NOW - MINUTE)
    true_clock = [received(store, "true", dt.timedelta(0), NOW - m * MINUTE) for m in (7, 1)]

    assert run_pass(store, SIX_MINUTES, NOW, batch_rows=100, pause_seconds=0) == {"heartbeat": 2}
    assert sorted(stored_ids(store)) == sorted(ids([edge, fresh, true_clock[1]]))
    assert old.event_id not in stored_ids(store)

    exactly_six_minutes = NOW + MINUTE  # edge was received at NOW - 5 min
    assert run_pass(store, SIX_MINUTES, exactly_six_minutes, batch_rows=100, pause_seconds=0) == {}
    later = exactly_six_minutes + dt.timedelta(microseconds=1)
    assert run_pass(store, SIX_MINUTES, later, batch_rows=100, pause_seconds=0) == {"heartbeat": 1}
    assert sorted(stored_ids(store)) == sorted(ids([fresh, true_clock[1]]))


@pytest.mark.parametrize("skew", SKEWS.values(), ids=SKEWS.keys())
def test_retention_keeps_the_event_the_hub_received_last_as_the_hosts_newest(store: SqlStore,
                                                                              skew: dt.timedelta) -> None:
    """Of a host whose clock was set right after running off, the heartbeat received last is its newest and stays
    however old its time reads, and the one dated far off but received earlier goes; the hosts row agrees."""
    received(store, "host-a", skew, NOW - 60 * MINUTE)  # dated far off
    kept = received(store, "host-a", dt.timedelta(0), NOW - 30 * MINUTE)  # clock set right: dated before that one
    assert run_pass(store, SIX_MINUTES, NOW, batch_rows=100, pause_seconds=0) == {"heartbeat": 1}
    assert stored_ids(store) == ids([kept])
    [host] = store.hosts()
    assert host.heartbeat_at == kept.occurred_at


def test_other_kinds_age_by_receipt_too(store: SqlStore) -> None:
    """A snapshot dated a year ahead but received 91 days ago goes at 90 days' retention once a newer one came; one
    dated 100 days back by a slow clock but received today stays."""
    ahead = received(store, "host-a", SKEWS["year-ahead"], NOW - dt.timedelta(days=91), "snapshot_changed",
                     pairing=ROCM_62)
    behind = received(store, "host-a", -dt.timedelta(days=100), NOW - MINUTE, "snapshot_changed", pairing=ROCM_62)
    policy = RetentionPolicy(heartbeat_hours=0, event_days=90)
    assert run_pass(store, policy, NOW, batch_rows=100, pause_seconds=0) == {"snapshot_changed": 1}
    assert stored_ids(store) == ids([behind])
    assert ahead.event_id not in stored_ids(store)


def _skewed_fleet(store: SqlStore) -> Dict[str, Event]:
    """Each skewed host sends a heartbeat (its skew) and a drift event; the year-ahead host's arrives first, then the
    day-ahead host's, then the host ten minutes behind."""
    drift: Dict[str, Event] = {}
    for minutes, (host_id, skew) in enumerate(SKEWS.items()):
        at = NOW + minutes * 10 * MINUTE
        received(store, host_id, skew, at)
        drift[host_id] = received(store, host_id, skew, at + MINUTE, "cpu_fallback")
    return drift


def test_the_drift_listing_orders_and_filters_by_receipt(store: SqlStore) -> None:
    """The drift listing puts the host whose drift arrived first first (not the one ten minutes behind, whose event
    reads oldest), gives each host's times on both clocks and its skew, and since= counts arrivals."""
    drift = _skewed_fleet(store)
    hosts = drift_hosts(store.drift(NOW, DRIFT_KINDS))
    assert [h.host_id for h in hosts] == list(SKEWS)
    by_id = {h.host_id: h for h in hosts}
    for minutes, (host_id, skew) in enumerate(SKEWS.items()):
        arrived = NOW + minutes * 10 * MINUTE + MINUTE
        host = by_id[host_id]
        assert (host.first_received_at, host.first_occurred_at) == (arrived, arrived + skew)
        assert host.kinds["cpu_fallback"].last_occurred_at == drift[host_id].occurred_at
        assert host.clock_skew_seconds == skew.total_seconds() and host.clock_skewed
    since_second = NOW + 10 * MINUTE  # after the year-ahead host's drift arrived, before the others'
    assert [h.host_id for h in drift_hosts(store.drift(since_second, DRIFT_KINDS))] == [
        "day-ahead", "ten-minutes-behind"]
    assert drift_hosts(store.drift(NOW + 30 * MINUTE, DRIFT_KINDS)) == []  # nothing arrived since, whatever the dates


def test_the_event_listing_orders_and_filters_by_receipt(store: SqlStore) -> None:
    """GET /v1/events' query: the event received last first (a year-ahead date does not put it on top for ever),
    and since= returns exactly what arrived since, a slow clock's fresh event included, a fast clock's old one not."""
    drift = _skewed_fleet(store)
    newest_first = stored_ids(store, kind="cpu_fallback")
    assert newest_first == ids([drift["ten-minutes-behind"], drift["day-ahead"], drift["year-ahead"]])
    assert stored_ids(store, kind="cpu_fallback", newest_first=False) == newest_first[::-1]
    since = NOW + 20 * MINUTE  # the behind host's heartbeat and drift arrive at and after it
    arrived_since = stored_ids(store, since=since)
    assert len(arrived_since) == 2 and drift["ten-minutes-behind"].event_id in arrived_since
    assert drift["year-ahead"].event_id not in arrived_since
    assert stored_ids(store, since=since + 2 * MINUTE) == []


def test_a_schema_version_11_database_gets_the_receipt_indexes(store: SqlStore) -> None:
    """Version 11 to 12: the indexes on the agent's times are dropped, those on the receipt made, the events kept."""
    from agent.hub import schema

    kept = received(store, "host-old", SKEWS["day-ahead"], NOW)
    downgrade = ["DROP INDEX events_host_received", "DROP INDEX events_kind_received", "DROP INDEX events_received",
                 "CREATE INDEX events_host_occurred ON events (host_id, occurred_at)",
                 "CREATE INDEX events_kind_occurred ON events (kind, occurred_at)",
                 "CREATE INDEX events_occurred ON events (occurred_at)",
                 "UPDATE hub_meta SET value = '11' WHERE key = 'schema_version'"]

    def work(cur: Any) -> None:
        for statement in downgrade:
            cur.execute(statement)

    store.write("test", work)
    store.close()
    reopened = SqlStore(store.dialect)
    reopened.open()
    try:
        assert reopened.query("test", "SELECT value FROM hub_meta WHERE key = 'schema_version'") == [
            (str(schema.SCHEMA_VERSION),)] == [("12",)]
        if reopened.dialect.name == "sqlite":
            names = reopened.query("test", "SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = ?",
                                   ["events"])
        else:
            names = reopened.query("test", "SELECT indexname FROM pg_indexes WHERE tablename = ?", ["events"])
        found = {name for (name,) in names}
        assert {"events_host_received", "events_kind_received", "events_received"} <= found
        assert not found & {"events_host_occurred", "events_kind_occurred", "events_occurred"}
        assert stored_ids(reopened) == ids([kept])
    finally:
        reopened.close()


def test_the_api_lists_drift_and_events_the_hub_received_since(client: Any, tokens: Dict[str, str],
                                                              hub_clock: HubClock) -> None:
    """Over the fleet API: a fallback dated a year ahead but received two days ago is out of the default day's drift
    and of since=an hour ago; one dated ten minutes back but received now is in both, with both times."""
    now = dt.datetime(2026, 12, 7, 12, 0, tzinfo=dt.timezone.utc)
    sent = {}
    for host_id, arrived, skew in (("host-a", now - dt.timedelta(days=2), SKEWS["year-ahead"]),
                                   ("host-b", now, SKEWS["ten-minutes-behind"])):
        hub_clock.at = arrived
        sent[host_id] = event(host_id, kind="cpu_fallback", at=arrived + skew)
        answer = client.post(INGEST_PATH, content=batch_json([sent[host_id]]), headers={
            **bearer(tokens[host_id]), "Content-Type": "application/json"})
        assert answer.status_code == 200
    reader = bearer(tokens[READER])
    drift = client.get("/v1/drift", headers=reader).json()
    assert [(h["host_id"], h["first_received_at"], h["first_occurred_at"]) for h in drift["hosts"]] == [
        ("host-b", "2026-12-07T12:00:00Z", "2026-12-07T11:50:00Z")]
    since = client.get("/v1/events", params={"since": "2026-12-07T11:00:00Z"}, headers=reader).json()
    assert [r["event"]["event_id"] for r in since["events"]] == [sent["host-b"].event_id]
