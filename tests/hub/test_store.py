"""The Store contract, run against SQLiteStore and a real PostgreSQL server alike."""

from __future__ import annotations

import datetime as dt
import sqlite3
from pathlib import Path
from typing import Iterator, List

import pytest

from agent.errors import ConfigError, StoreError
from agent.hub.rows import DRIFT_KINDS, EventQuery
from agent.hub.store import PostgresStore, SQLiteStore, Store, make_store, redact_url
from agent.report.events import Event
from tests.hub.factories import CUDA_12, ROCM_62, ROCM_63, T0, event, ids

NOW = dt.datetime(2026, 2, 1, tzinfo=dt.timezone.utc)


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    if request.param == "sqlite":
        opened: Store = SQLiteStore(str(tmp_path / "db" / "hub.db"))
    else:
        opened = PostgresStore(request.getfixturevalue("postgres_url"))
    opened.open()
    yield opened
    opened.close()


def test_ingest_stores_new_events_and_answers_resent_ones_as_duplicates(store: Store) -> None:
    """A batch sent twice is stored once; the second answer lists every event as a duplicate."""
    events = [event("host-a", at=T0 + dt.timedelta(seconds=i)) for i in range(3)]
    first = store.ingest([events], received_at=NOW)
    second = store.ingest([events], received_at=NOW)
    assert first[0].accepted == ids(events) and first[0].duplicates == []
    assert second[0].accepted == [] and second[0].duplicates == ids(events)
    assert len(store.events(EventQuery(limit=1000))) == 3


def test_ingest_attributes_a_repeat_within_one_group_to_the_first_batch(store: Store) -> None:
    """The same event in two batches of one commit (and twice in one batch) is accepted once."""
    shared = event("host-a")
    other = event("host-a")
    results = store.ingest([[shared, shared], [other, shared]], received_at=NOW)
    assert results[0].accepted == [shared.event_id] and results[0].duplicates == [shared.event_id]
    assert results[1].accepted == [other.event_id] and results[1].duplicates == [shared.event_id]


def test_same_event_id_on_two_hosts_is_two_events(store: Store) -> None:
    """The idempotency key is (host_id, event_id): one host cannot shadow another's events."""
    a = event("host-a", event_id="same-id-0001")
    b = event("host-b", event_id="same-id-0001")
    results = store.ingest([[a], [b]], received_at=NOW)
    assert [r.accepted for r in results] == [["same-id-0001"], ["same-id-0001"]]


def test_stored_event_round_trips(store: Store) -> None:
    """The stored body parses back to the event that was sent."""
    sent = event("host-a", kind="snapshot_changed", pairing=ROCM_62)
    store.ingest([[sent]], received_at=NOW)
    [stored] = store.events(EventQuery(host_id="host-a"))
    assert Event.model_validate_json(stored.body) == sent
    assert stored.received_at == NOW


def test_hosts_keep_the_newest_pairing_by_receipt_and_a_resent_older_event_changes_nothing(store: Store) -> None:
    """The pairing received last wins, not the one the agent's clock calls newest; an older event resent later (it
    is a duplicate) does not roll it back; last_seen moves with every receipt."""
    older = event("host-a", kind="snapshot_changed", pairing=ROCM_62, at=T0 + dt.timedelta(days=1),
                  hostname="old-name")
    newer = event("host-a", kind="snapshot_changed", pairing=ROCM_63, at=T0 + dt.timedelta(hours=2))
    store.ingest([[older]], received_at=NOW)
    store.ingest([[newer]], received_at=NOW + dt.timedelta(minutes=1))
    store.ingest([[older]], received_at=NOW + dt.timedelta(minutes=5))
    [host] = store.hosts()
    assert host.pairing == ROCM_63
    assert host.pairing_at == T0 + dt.timedelta(hours=2)
    assert host.hostname == "host-a.lab"
    assert host.first_seen_at == NOW
    assert host.last_seen_at == NOW + dt.timedelta(minutes=5)
    assert host.content_hash == "b" * 64


def test_a_future_dated_heartbeat_followed_by_a_normal_one_updates_the_row(store: Store) -> None:
    """A heartbeat from a clock a day ahead is stored as sent, and the next one, from the corrected clock, replaces
    it (the agent's time is data); the row's skew is the heartbeat's time less its receipt."""
    ahead = event("host-a", kind="heartbeat", compliant=True, at=NOW + dt.timedelta(days=1))
    store.ingest([[ahead]], received_at=NOW)
    [host] = store.hosts()
    assert host.heartbeat_at == NOW + dt.timedelta(days=1) and host.clock_skew_seconds == 86400.0
    assert host.clock_skewed
    normal = event("host-a", kind="heartbeat", compliant=False, at=NOW + dt.timedelta(minutes=1))
    store.ingest([[normal]], received_at=NOW + dt.timedelta(minutes=1))
    [host] = store.hosts()
    assert (host.compliant, host.heartbeat_at, host.heartbeat_received_at) == (
        False, NOW + dt.timedelta(minutes=1), NOW + dt.timedelta(minutes=1))
    assert host.last_event_at == NOW + dt.timedelta(minutes=1) and host.last_sequence == normal.sequence
    assert host.clock_skew_seconds == 0.0 and not host.clock_skewed


def test_within_one_commit_the_agents_sequence_orders_a_hosts_heartbeats(store: Store) -> None:
    """Two heartbeats received together: the higher sequence is the newest, whatever their times say."""
    first = event("host-a", kind="heartbeat", compliant=True, at=NOW + dt.timedelta(hours=1), sequence=7)
    second = event("host-a", kind="heartbeat", compliant=False, at=NOW, sequence=8)
    store.ingest([[second, first]], received_at=NOW)
    [host] = store.hosts()
    assert (host.compliant, host.heartbeat_at, host.last_sequence) == (False, NOW, 8)


def test_heartbeat_sets_compliance_and_a_pairing_only_when_it_carries_one(store: Store) -> None:
    """A heartbeat without pairing keeps the snapshot's pairing but updates compliance."""
    store.ingest([[event("host-a", kind="snapshot_changed", pairing=CUDA_12, at=T0)]], received_at=NOW)
    store.ingest([[event("host-a", kind="heartbeat", pairing=None, compliant=False,
                         at=T0 + dt.timedelta(minutes=1))]], received_at=NOW)
    [host] = store.hosts()
    assert host.pairing == CUDA_12
    assert host.compliant is False
    assert host.agent_version == "0.1.0"
    assert host.heartbeat_at == T0 + dt.timedelta(minutes=1)


def test_hosts_without_pairing_are_listed_with_none(store: Store) -> None:
    """A host whose events carry no pairing is listed with pairing and compliance None."""
    store.ingest([[event("host-b", kind="cpu_fallback")]], received_at=NOW)
    [host] = store.hosts()
    assert host.host_id == "host-b" and host.pairing is None and host.compliant is None


def test_drift_counts_each_drift_kind_per_host_since_a_time(store: Store) -> None:
    """Heartbeats are not drift; events received before ``since`` are not counted; first and last times are kept on
    both clocks (here the agent's runs a minute ahead of the hub's)."""
    sent = [event("host-a", kind="heartbeat", at=T0 + dt.timedelta(hours=1)),
            event("host-a", kind="snapshot_changed", at=T0 - dt.timedelta(hours=1)),
            event("host-a", kind="snapshot_changed", at=T0 + dt.timedelta(hours=2)),
            event("host-a", kind="snapshot_changed", at=T0 + dt.timedelta(hours=3)),
            event("host-a", kind="rollback", at=T0 + dt.timedelta(hours=4)),
            event("host-b", kind="health_regression", at=T0 + dt.timedelta(hours=5))]
    for one in sent:
        store.ingest([[one]], received_at=one.occurred_at - dt.timedelta(minutes=1))
    rows = {(r.host_id, r.kind): r for r in store.drift(T0, DRIFT_KINDS)}
    assert set(rows) == {("host-a", "snapshot_changed"), ("host-a", "rollback"), ("host-b", "health_regression")}
    changed = rows[("host-a", "snapshot_changed")]
    assert (changed.event_count, changed.first_received_at, changed.last_received_at) == (
        2, T0 + dt.timedelta(hours=2, minutes=-1), T0 + dt.timedelta(hours=3, minutes=-1))
    assert (changed.first_occurred_at, changed.last_occurred_at) == (
        T0 + dt.timedelta(hours=2), T0 + dt.timedelta(hours=3))
    assert changed.clock_skew_seconds == 60.0  # host-a's heartbeat: a minute ahead
    assert rows[("host-b", "health_regression")].hostname == "host-b.lab"
    assert store.drift(T0, []) == []


def test_events_filter_by_host_kind_and_time_in_either_order(store: Store) -> None:
    """Stored events filter by host, kind and since (their receipt), newest or oldest first, with a limit."""
    a1 = event("host-a", kind="heartbeat", at=T0 + dt.timedelta(minutes=1))
    a2 = event("host-a", kind="rollback", at=T0 + dt.timedelta(minutes=2))
    a3 = event("host-a", kind="heartbeat", at=T0 + dt.timedelta(minutes=3))
    b1 = event("host-b", kind="heartbeat", at=T0 + dt.timedelta(minutes=4))
    for one in (a1, a2, a3, b1):
        store.ingest([[one]], received_at=one.occurred_at)

    def found(**query: object) -> list:
        return [Event.model_validate_json(s.body).event_id for s in store.events(EventQuery(**query))]

    assert found() == ids([b1, a3, a2, a1])
    assert found(newest_first=False, limit=2) == ids([a1, a2])
    assert found(host_id="host-a", kind="heartbeat") == ids([a3, a1])
    assert found(since=T0 + dt.timedelta(minutes=2), host_id="host-a") == ids([a3, a2])
    assert found(host_id="nobody") == []


def test_offsets_are_normalised_so_time_order_holds_across_zones(store: Store) -> None:
    """An event at 01:30+02:00 (23:30Z the day before) is stored as the earlier of it and one at 00:00Z."""
    plus_two = dt.timezone(dt.timedelta(hours=2))
    early = event("host-a", kind="rollback", at=dt.datetime(2026, 1, 1, 1, 30, tzinfo=plus_two))
    late = event("host-a", kind="rollback", at=T0)
    store.ingest([[late, early]], received_at=NOW)
    [row] = store.drift(NOW, ["rollback"])
    assert (row.first_occurred_at, row.last_occurred_at) == (dt.datetime(2025, 12, 31, 23, 30,
                                                                         tzinfo=dt.timezone.utc), T0)


def test_reopening_keeps_what_was_stored(store: Store) -> None:
    """A store closed and opened again still knows the events it stored (they come back duplicates)."""
    sent = event("host-a")
    store.ingest([[sent]], received_at=NOW)
    store.close()
    store.open()
    assert store.ingest([[sent]], received_at=NOW)[0].duplicates == [sent.event_id]
    store.ping()


def test_large_group_spans_several_insert_statements(store: Store) -> None:
    """More rows than one INSERT carries are all stored and all answered."""
    events = [event("host-c", at=T0 + dt.timedelta(seconds=i)) for i in range(450)]
    [result] = store.ingest([events], received_at=NOW)
    assert len(result.accepted) == 450
    assert len(store.events(EventQuery(host_id="host-c", limit=1000))) == 450


def test_sqlite_refuses_a_database_of_a_newer_schema(tmp_path: Path) -> None:
    """A SQLite database of a newer schema version is refused with a StoreError naming the version."""
    path = tmp_path / "hub.db"
    SQLiteStore(str(path)).open()
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE hub_meta SET value = '99' WHERE key = 'schema_version'")
    with pytest.raises(StoreError, match="schema version 99"):
        SQLiteStore(str(path)).open()


def test_sqlite_errors_become_store_errors(tmp_path: Path) -> None:
    """A database path that cannot be created is a StoreError naming the operation."""
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(StoreError, match="hub store open failed"):
        SQLiteStore(str(blocker / "hub.db")).open()
    corrupt = tmp_path / "corrupt.db"
    corrupt.write_bytes(b"this is not a database" * 100)
    with pytest.raises(StoreError, match="hub store open failed"):
        SQLiteStore(str(corrupt)).open()


def test_postgres_unreachable_is_a_store_error(tmp_path: Path) -> None:
    """A PostgreSQL server that cannot be reached is a StoreError of the open, within the connect timeout."""
    store = PostgresStore(f"postgresql://nobody@/none?host={tmp_path}", connect_timeout_seconds=2)
    with pytest.raises(StoreError, match="hub store open failed"):
        store.open()


@pytest.mark.parametrize("url, kind", [
    ("sqlite:////var/lib/gpuguard/hub.db", SQLiteStore),
    ("sqlite:///relative.db", SQLiteStore),
    ("postgresql://hub@db.example/hub", PostgresStore),
    ("postgres://hub@db.example/hub", PostgresStore),
])
def test_make_store_picks_the_backend_by_url(url: str, kind: type) -> None:
    """make_store picks the SQLite or PostgreSQL store from the database URL's scheme."""
    assert isinstance(make_store(url), kind)


@pytest.mark.parametrize("url", ["mysql://x/y", "sqlite:///:memory:"])
def test_make_store_refuses_what_it_cannot_serve(url: str) -> None:
    """A database URL of another kind, or an in-memory SQLite one, is a ConfigError."""
    with pytest.raises(ConfigError):
        make_store(url)


@pytest.mark.parametrize("url, shown", [
    ("postgresql://hub:s3cret@db:5432/hub", "postgresql://hub:***@db:5432/hub"),
    ("postgresql://hub@db/hub", "postgresql://hub@db/hub"),
    ("sqlite:////var/lib/gpuguard/hub.db", "sqlite:////var/lib/gpuguard/hub.db"),
])
def test_redact_url_hides_passwords(url: str, shown: str) -> None:
    """redact_url replaces a URL's password with *** and leaves URLs without one as they are."""
    assert redact_url(url) == shown


def _heartbeat(at: dt.datetime, **fields: object) -> Event:
    from agent.report.events import Heartbeat
    return event("host-p", at=at).model_copy(update={"payload": Heartbeat(agent_version="1.0", uptime_seconds=1.0,
                                                                          **fields)})  # type: ignore[arg-type]


def test_a_hosts_labels_and_policy_fields_come_from_its_newest_heartbeat(store: Store) -> None:
    """labels, policy_source, policy_serial and the last refusal are the newest heartbeat's (by sequence when
    received at the same time), whatever the order the commits come in."""
    older = _heartbeat(T0, labels={"rack": "b1"}, policy_source="local")
    newer = _heartbeat(T0 + dt.timedelta(minutes=2), labels={"rack": "a7"}, policy_source="bundle", policy_serial=42,
                       policy_refused_serial=43, policy_refused_reason="signature: BADSIG")
    store.ingest([[newer]], received_at=NOW)
    store.ingest([[older]], received_at=NOW)
    [host] = store.hosts()
    assert (host.labels, host.policy_source, host.policy_serial, host.policy_refused_serial,
            host.policy_refused_reason) == ({"rack": "a7"}, "bundle", 42, 43, "signature: BADSIG")


_VERSION_10_COLUMNS = ("last_event_received_at", "pairing_received_at", "pairing_sequence",
                       "heartbeat_received_at", "heartbeat_sequence", "clock_skew_seconds")


def _reopened_after(store: Store, downgrade: List[str], below: int = 10) -> Store:
    """``store`` taken back to an older schema (below 11: version 11's indexes and column dropped first; below 10:
    version 10's columns too) by ``downgrade``, closed, and opened again by a new store object."""
    from agent.hub import schema
    from agent.hub.store import SqlStore

    assert isinstance(store, SqlStore)
    dropped = [f"DROP INDEX IF EXISTS {index.split()[5]}" for index in schema._CHANGE_INDEXES]
    dropped.append("ALTER TABLE rollouts DROP COLUMN evaluations")
    if below <= 10:
        dropped += [f"ALTER TABLE hosts DROP COLUMN {name}" for name in _VERSION_10_COLUMNS]

    def work(cur: object) -> None:
        for statement in dropped + downgrade:
            cur.execute(statement)  # type: ignore[attr-defined]

    store.write("test", work)
    store.close()
    reopened = type(store).__new__(type(store))
    SqlStore.__init__(reopened, store.dialect)
    reopened.open()
    return reopened


def test_a_schema_version_3_database_keeps_its_bundles_offered_after_the_migration(store: Store) -> None:
    """Version 3 to 5: stored bundles get the new staged column as not staged, so hosts are offered them as before."""
    from agent.hub import schema
    from agent.hub.bundles import PolicyBundles
    from agent.hub.store import SqlStore
    from agent.hub.tokens import Principal
    from tests.hub.signing import check, signature_of
    from tests.hub.test_policy_bundles import bundle_bytes

    assert isinstance(store, SqlStore)
    PolicyBundles(store, check()).push(Principal(role="admin", subject="alice"), bundle_bytes(7),
                                       signature_of(bundle_bytes(7)))

    reopened = _reopened_after(store, ["ALTER TABLE policy_bundles DROP COLUMN staged",
                                       "ALTER TABLE rollouts DROP COLUMN paused_by",
                                       "ALTER TABLE hosts DROP COLUMN policy_refused_kind",
                                       "ALTER TABLE hosts DROP COLUMN policy_attention",
                                       "ALTER TABLE hosts DROP COLUMN unknown_versions",
                                       "UPDATE hub_meta SET value = '3' WHERE key = 'schema_version'"])
    try:
        assert reopened.query("test", "SELECT value FROM hub_meta WHERE key = 'schema_version'") == [
            (str(schema.SCHEMA_VERSION),)]
        assert PolicyBundles(reopened, check()).offer_serial("any-host") == 7
    finally:
        reopened.close()


def test_a_schema_version_4_paused_rollout_gets_an_empty_paused_by_after_the_migration(store: Store) -> None:
    """Version 4 to 5: a rollout row (paused then, its pauser only in the reason text) gets paused_by NULL, loads,
    and a paused evaluation words it "paused" without reading the reason back."""
    from agent.hub import schema
    from agent.hub.bundles import PolicyBundles
    from agent.hub.rollout_plan import RolloutSpec
    from agent.hub.rollouts import Rollouts
    from agent.hub.store import SqlStore
    from agent.hub.tokens import Principal
    from tests.hub.signing import check, signature_of
    from tests.hub.test_policy_bundles import bundle_bytes

    assert isinstance(store, SqlStore)
    admin = Principal(role="admin", subject="alice")
    store.ingest([[event("host-old", at=T0)]], received_at=NOW)
    bundles = PolicyBundles(store, check())
    bundles.push(admin, bundle_bytes(1), signature_of(bundle_bytes(1)))
    bundles.push(admin, bundle_bytes(2), signature_of(bundle_bytes(2)))
    rid = Rollouts(store, bundles).start(admin, RolloutSpec(target_serial=2)).rollout.rollout_id
    Rollouts(store, bundles).pause(admin, rid)
    reopened = _reopened_after(store, ["ALTER TABLE rollouts DROP COLUMN paused_by",
                                       "ALTER TABLE hosts DROP COLUMN policy_refused_kind",
                                       "ALTER TABLE hosts DROP COLUMN policy_attention",
                                       "ALTER TABLE hosts DROP COLUMN unknown_versions",
                                       "UPDATE hub_meta SET value = '4' WHERE key = 'schema_version'"])
    try:
        assert reopened.query("test", "SELECT value FROM hub_meta WHERE key = 'schema_version'") == [
            (str(schema.SCHEMA_VERSION),)]
        rollouts = Rollouts(reopened, PolicyBundles(reopened, check()))
        row = rollouts.status(rid).rollout
        assert (row.state, row.paused_by) == ("paused", None)
        rollouts.evaluate(rid)
        assert rollouts.status(rid).rollout.reason.startswith("paused; waiting for stage")
    finally:
        reopened.close()


def test_a_schema_version_1_database_is_migrated_with_its_rows(store: Store) -> None:
    """A database of schema version 1 (hosts without the policy columns, no bundle or rollout tables) opens as the
    newest version with its hosts kept, the new columns empty and the new tables there."""
    from agent.hub import schema
    from agent.hub.store import SqlStore

    assert isinstance(store, SqlStore)
    store.ingest([[event("host-old", at=T0)]], received_at=NOW)

    reopened = _reopened_after(store, [
        "DROP TABLE policy_bundles", "DROP TABLE audit", "DROP TABLE rollouts", "DROP TABLE rollout_hosts",
        *(f"ALTER TABLE hosts DROP COLUMN {name}"
          for name, _ in schema._HOST_POLICY_COLUMNS + schema._HOST_HEALTH_COLUMNS
          + schema._HOST_REFUSAL_KIND_COLUMNS + schema._HOST_ATTENTION_COLUMNS
          + schema._HOST_UNKNOWN_VERSIONS_COLUMNS),
        "UPDATE hub_meta SET value = '1' WHERE key = 'schema_version'"])
    try:
        [host] = reopened.hosts()
        assert (host.host_id, host.policy_serial, host.labels, host.last_health_at, host.policy_refused_kind) == (
            "host-old", None, None, None, None)
        assert reopened.query("test", "SELECT value FROM hub_meta WHERE key = 'schema_version'") == [
            (str(schema.SCHEMA_VERSION),)]
        assert reopened.query("test", "SELECT COUNT(*) FROM policy_bundles WHERE staged = 0") == [(0,)]
        assert reopened.query("test", "SELECT COUNT(*) FROM rollout_hosts") == [(0,)]
    finally:
        reopened.close()


def test_a_schema_version_5_database_gets_the_refusal_kind_column(store: Store) -> None:
    """Version 5 to 6: hosts get policy_refused_kind, empty for the rows there, and a heartbeat's kind is stored."""
    from agent.hub import schema
    from agent.hub.store import SqlStore
    from agent.report.events import Heartbeat

    assert isinstance(store, SqlStore)
    store.ingest([[event("host-old", at=T0)]], received_at=NOW)
    reopened = _reopened_after(store, ["ALTER TABLE hosts DROP COLUMN policy_refused_kind",
                                       "ALTER TABLE hosts DROP COLUMN policy_attention",
                                       "ALTER TABLE hosts DROP COLUMN unknown_versions",
                                       "UPDATE hub_meta SET value = '5' WHERE key = 'schema_version'"])
    try:
        assert reopened.query("test", "SELECT value FROM hub_meta WHERE key = 'schema_version'") == [
            (str(schema.SCHEMA_VERSION),)]
        assert reopened.hosts()[0].policy_refused_kind is None
        refusing = event("host-old", at=T0 + dt.timedelta(minutes=1))
        payload = Heartbeat(agent_version="1", uptime_seconds=1.0, policy_serial=3, policy_refused_kind="signature",
                            policy_refused_reason="signature: bad signature")
        reopened.ingest([[refusing.model_copy(update={"payload": payload})]], received_at=NOW)
        [host] = reopened.hosts()
        assert (host.policy_serial, host.policy_refused_serial, host.policy_refused_kind) == (3, None, "signature")
    finally:
        reopened.close()


def test_a_schema_version_7_database_gets_the_policy_attention_column(store: Store) -> None:
    """Version 7 to 8: hosts get policy_attention, empty for the rows there, and a heartbeat's words are stored."""
    from agent.hub import schema
    from agent.hub.store import SqlStore
    from agent.report.events import Heartbeat

    assert isinstance(store, SqlStore)
    store.ingest([[event("host-old", at=T0)]], received_at=NOW)
    reopened = _reopened_after(store, ["ALTER TABLE hosts DROP COLUMN policy_attention",
                                       "ALTER TABLE hosts DROP COLUMN unknown_versions",
                                       "UPDATE hub_meta SET value = '7' WHERE key = 'schema_version'"])
    try:
        assert reopened.query("test", "SELECT value FROM hub_meta WHERE key = 'schema_version'") == [
            (str(schema.SCHEMA_VERSION),)] == [("12",)]
        assert reopened.hosts()[0].policy_attention is None
        expired = event("host-old", at=T0 + dt.timedelta(minutes=1))
        payload = Heartbeat(agent_version="1", uptime_seconds=1.0, policy_source="bundle", policy_serial=3,
                            policy_attention=("freshness", "expired"))
        reopened.ingest([[expired.model_copy(update={"payload": payload})]], received_at=NOW)
        [host] = reopened.hosts()
        assert (host.policy_serial, host.policy_attention) == (3, ("expired", "freshness"))
    finally:
        reopened.close()


def test_a_schema_version_8_database_gets_the_unknown_versions_column(store: Store) -> None:
    """Version 8 to 10: hosts get unknown_versions, empty for the rows there, and a heartbeat's items are stored."""
    from agent.hub import schema
    from agent.hub.store import SqlStore
    from agent.report.events import Heartbeat, UnknownVersionReport

    assert isinstance(store, SqlStore)
    store.ingest([[event("host-old", at=T0)]], received_at=NOW)
    reopened = _reopened_after(store, ["ALTER TABLE hosts DROP COLUMN unknown_versions",
                                       "UPDATE hub_meta SET value = '8' WHERE key = 'schema_version'"])
    try:
        assert reopened.query("test", "SELECT value FROM hub_meta WHERE key = 'schema_version'") == [
            (str(schema.SCHEMA_VERSION),)] == [("12",)]
        assert reopened.hosts()[0].unknown_versions is None
        item = UnknownVersionReport(table="amd-matrix", component="rocm", version="10.1", newest="10.0",
                                    dated="2026-12-04")
        payload = Heartbeat(agent_version="1", uptime_seconds=1.0, unknown_versions=[item])
        reopened.ingest([[event("host-old", at=T0 + dt.timedelta(minutes=1)).model_copy(
            update={"payload": payload})]], received_at=NOW)
        [host] = reopened.hosts()
        assert host.unknown_versions == (item,)
    finally:
        reopened.close()


def test_a_schema_version_8_row_frozen_by_a_future_heartbeat_is_updated_after_the_migration(store: Store) -> None:
    """Version 9 to 10: a row that a heartbeat from a day ahead froze under version 9 takes the next heartbeat, and
    has no skew until then."""
    from agent.hub import schema

    store.ingest([[event("host-old", kind="heartbeat", compliant=True, at=NOW + dt.timedelta(days=1))]],
                 received_at=NOW)
    reopened = _reopened_after(store, ["UPDATE hub_meta SET value = '9' WHERE key = 'schema_version'"])
    try:
        assert reopened.query("test", "SELECT value FROM hub_meta WHERE key = 'schema_version'") == [
            (str(schema.SCHEMA_VERSION),)] == [("12",)]
        [host] = reopened.hosts()
        assert host.heartbeat_received_at is None and host.clock_skew_seconds is None
        reopened.ingest([[event("host-old", kind="heartbeat", compliant=False, at=NOW + dt.timedelta(minutes=1))]],
                        received_at=NOW + dt.timedelta(minutes=1))
        [host] = reopened.hosts()
        assert (host.compliant, host.heartbeat_at, host.clock_skew_seconds) == (
            False, NOW + dt.timedelta(minutes=1), 0.0)
    finally:
        reopened.close()


def test_a_schema_version_10_database_gets_the_evaluation_counter_and_the_change_indexes(store: Store) -> None:
    """Version 10 to 11: rollouts get the evaluations counter (0 for the rows there) and the indexes an incremental
    rollout evaluation reads by are made."""
    from agent.hub import schema

    store.ingest([[event("host-old", at=T0)]], received_at=NOW)
    store.write("test", lambda cur: cur.execute(  # type: ignore[attr-defined, union-attr]
        "INSERT INTO rollouts (rollout_id, target_serial, spec, state, stage, created_at, created_by, updated_at, "
        "reason) VALUES ('r1', 2, '{}', 'done', 1, '2026-01-01T00:00:00+00:00', 'alice', "
        "'2026-01-01T00:00:00+00:00', 'done')"))
    reopened = _reopened_after(store, ["UPDATE hub_meta SET value = '10' WHERE key = 'schema_version'"], below=11)
    try:
        assert reopened.query("test", "SELECT value FROM hub_meta WHERE key = 'schema_version'") == [
            (str(schema.SCHEMA_VERSION),)] == [("12",)]
        assert reopened.query("test", "SELECT evaluations FROM rollouts") == [(0,)]
        assert [h.host_id for h in reopened.hosts()] == ["host-old"]
        listing = ("SELECT name FROM sqlite_master WHERE type = 'index'" if reopened.dialect.name == "sqlite"
                   else "SELECT indexname FROM pg_indexes")
        names = {row[0] for row in reopened.query("test", listing)}
        assert {index.split()[5] for index in schema._CHANGE_INDEXES} <= names
    finally:
        reopened.close()
