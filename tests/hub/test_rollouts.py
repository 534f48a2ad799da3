"""Staged rollouts in the hub's store: canaries first, widening on evidence and soak, an automatic halt with an alert
and an audit trail, what each host is offered, abort, the API, and one decision per stage across hub processes on
one PostgreSQL."""

from __future__ import annotations

import datetime as dt
import json
import threading
from pathlib import Path
from typing import Any, Dict, Iterator, List, Tuple

import pytest
from fastapi.testclient import TestClient

from agent.hub.alert_settings import AlertWebhook
from agent.hub.alerts import AlertQueue
from agent.hub.app import create_app
from agent.hub.bundles import PolicyBundles
from agent.hub.dashboard.rollouts import rollout_page
from agent.hub.responses import HubHTTPError
from agent.hub.rollout_plan import RolloutSpec
from agent.hub.rollouts import Rollouts
from agent.hub.settings import HubSettings
from agent.hub.store import PostgresStore, SQLiteStore, SqlStore, make_store
from agent.hub.tokens import Principal
from agent.report.events import Event, Heartbeat
from tests.hub.conftest import bearer
from tests.hub.factories import CUDA_12, ROCM_62, T0, event
from tests.hub.signing import check, signature_of
from tests.hub.test_policy_bundles import bundle_bytes

ADMIN = Principal(role="admin", subject="alice")
AMD = [f"amd-{i}" for i in range(4)]
NV = [f"nv-{i}" for i in range(2)]
SPEC = RolloutSpec(target_serial=2, canaries=1, batches=(50, 100), soak_seconds=60, halt_percent=0)


class Clock:
    """A hub clock the test moves."""

    def __init__(self) -> None:
        self.now = T0 + dt.timedelta(hours=1)

    def __call__(self) -> dt.datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += dt.timedelta(seconds=seconds)


def beat(host_id: str, at: dt.datetime, serial: int = 1, health: str = "pass") -> Event:
    pairing = ROCM_62 if host_id.startswith("amd") else CUDA_12
    return event(host_id, at=at).model_copy(update={"payload": Heartbeat(
        agent_version="1.0", uptime_seconds=1.0, pairing=pairing, policy_source="bundle", policy_serial=serial,
        last_health_status=health)})


def seed(store: SqlStore, clock: Clock) -> Tuple[PolicyBundles, Rollouts]:
    """Six hosts in two cohorts on serial 1, bundles 1 and 2 pushed; the hub's rollouts over them."""
    store.open()
    store.ingest([[beat(h, clock.now - dt.timedelta(minutes=5)) for h in AMD + NV]], received_at=clock.now)
    bundles = PolicyBundles(store, check(), clock)
    bundles.push(ADMIN, bundle_bytes(1), signature_of(bundle_bytes(1)))
    bundles.push(ADMIN, bundle_bytes(2), signature_of(bundle_bytes(2)))
    alerts = AlertQueue(store, [AlertWebhook(name="pager", url="http://127.0.0.1:9/hook")])
    alerts.open()
    return bundles, Rollouts(store, bundles, alerts, clock)


@pytest.fixture
def sqlite(tmp_path: Path) -> Iterator[SqlStore]:
    store = SQLiteStore(str(tmp_path / "hub.db"))
    yield store
    store.close()


@pytest.fixture(params=["sqlite", "postgresql"])
def any_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SqlStore]:
    """The store over SQLite in tmp_path, and over a fresh PostgreSQL database."""
    store: SqlStore = (SQLiteStore(str(tmp_path / "hub.db")) if request.param == "sqlite"
                       else PostgresStore(request.getfixturevalue("postgres_url")))
    yield store
    store.close()


def report(store: SqlStore, clock: Clock, hosts: List[str], serial: int = 2, health: str = "pass") -> None:
    store.ingest([[beat(h, clock.now, serial, health) for h in hosts]], received_at=clock.now)


def stages(rollouts: Rollouts, rollout_id: str) -> Dict[str, Any]:
    return {h.host_id: h.stage for h in rollouts.status(rollout_id).hosts}


def test_canaries_widen_on_evidence_and_soak_then_a_failure_halts_with_an_alert(any_store: SqlStore) -> None:
    """One canary per cohort is admitted; the next stage opens only after both passed and the soak elapsed; a
    cpu_fallback in the batch halts, queues one alert naming the host, and audits each decision once."""
    clock = Clock()
    bundles, rollouts = seed(any_store, clock)
    rid = rollouts.start(ADMIN, SPEC).rollout.rollout_id
    assert stages(rollouts, rid) == {"amd-0": 0, "amd-1": None, "amd-2": None, "amd-3": None, "nv-0": 0, "nv-1": None}
    assert rollouts.offer("amd-0").serial == 2
    held = rollouts.offer("amd-1")
    assert held.serial == 1 and held.notice == f"rollout {rid}: waiting for stage 1 (0/2 canaries passed, soak " \
                                               "ends 01:01 UTC)"
    clock.advance(30)
    report(any_store, clock, ["amd-0", "nv-0"])
    assert rollouts.evaluate(rid).action == "wait"  # type: ignore[union-attr]
    assert "2/2 canaries passed" in (rollouts.offer("amd-1").notice or "")
    clock.advance(31)
    decision = rollouts.evaluate(rid)
    assert decision is not None and (decision.action, decision.stage, decision.admit) == ("admit", 1, ["amd-1"])
    assert rollouts.offer("amd-1").serial == 2 and rollouts.offer("amd-2").serial == 1
    clock.advance(5)
    any_store.ingest([[event("amd-1", kind="cpu_fallback", at=clock.now)]], received_at=clock.now)
    decision = rollouts.evaluate(rid)
    assert decision is not None and decision.action == "halt" and "amd-1 (cpu_fallback" in decision.reason
    status = rollouts.status(rid)
    assert status.rollout.state == "halted" and "amd-1" in status.rollout.reason
    assert rollouts.evaluate(rid) is None  # halted: no more admissions
    assert rollouts.offer("amd-2").serial == 1 and "halted" in (rollouts.offer("amd-2").notice or "")
    [alert] = [r for r in AlertQueue(any_store, [AlertWebhook(name="pager", url="http://127.0.0.1:9/hook")]).rows()
               if r["kind"] == "rollout_halted"]
    assert alert["state"] == "pending" and alert["event_id"] == f"rollout-{rid}-halt"
    actions = [e.action for e in reversed(bundles.audit())]
    assert actions[-4:] == ["rollout_start", "rollout_stage", "rollout_stage", "rollout_halted"]


def test_a_staged_target_reaches_no_host_before_the_rollout_and_its_whole_scope_once_done(
        any_store: SqlStore) -> None:
    """A bundle pushed staged is offered to nobody between the push and rollout start (hosts keep serial 1), only
    to admitted hosts while the rollout runs, and to every host in its scope once the rollout is done."""
    clock = Clock()
    any_store.open()
    any_store.ingest([[beat(h, clock.now - dt.timedelta(minutes=5)) for h in AMD + NV]], received_at=clock.now)
    bundles = PolicyBundles(any_store, check(), clock)
    bundles.push(ADMIN, bundle_bytes(1), signature_of(bundle_bytes(1)))
    assert bundles.push(ADMIN, bundle_bytes(2), signature_of(bundle_bytes(2)), staged=True).staged
    rollouts = Rollouts(any_store, bundles, None, clock)
    assert {h: rollouts.offer(h).serial for h in AMD + NV} == {h: 1 for h in AMD + NV}
    assert bundles.offer_serial("amd-0") == 1 and bundles.rollout().newest_serial == 1
    spec = RolloutSpec(target_serial=2, canaries=1, batches=(100,), soak_seconds=60, halt_percent=0)
    rid = rollouts.start(ADMIN, spec).rollout.rollout_id
    assert (rollouts.offer("amd-0").serial, rollouts.offer("nv-0").serial, rollouts.offer("amd-1").serial) == (2, 2, 1)
    clock.advance(61)
    report(any_store, clock, ["amd-0", "nv-0"])
    assert rollouts.evaluate(rid).action == "admit"  # type: ignore[union-attr]
    clock.advance(61)
    report(any_store, clock, AMD + NV)
    assert rollouts.evaluate(rid).action == "done"  # type: ignore[union-attr]
    assert not bundles.summary(2).staged
    assert {h: bundles.offer_serial(h) for h in AMD + NV} == {h: 2 for h in AMD + NV}


def test_a_failing_canary_halts_and_abort_withdraws_the_target(any_store: SqlStore) -> None:
    """A canary whose post-change health is cpu_fallback halts the rollout; abort withdraws the target, so no
    host is offered it again and the held-back hosts keep the previous bundle."""
    clock = Clock()
    bundles, rollouts = seed(any_store, clock)
    rid = rollouts.start(ADMIN, SPEC).rollout.rollout_id
    clock.advance(10)
    report(any_store, clock, ["amd-0"], health="cpu_fallback")
    decision = rollouts.evaluate(rid)
    assert decision is not None and decision.action == "halt" and "1 of 2 canaries failed" in decision.reason
    with pytest.raises(HubHTTPError) as refused:
        rollouts.resume(ADMIN, rid)
    assert refused.value.status == 409
    assert rollouts.abort(ADMIN, rid).state == "aborted"
    assert bundles.summary(2).withdrawn_by == "alice"
    assert {h: rollouts.offer(h).serial for h in AMD + NV} == {h: 1 for h in AMD + NV}
    assert rollouts.offer("amd-0").notice is None  # no active rollout any more
    bundles.push(ADMIN, bundle_bytes(3), signature_of(bundle_bytes(3)))  # the previous policy again, under a new serial
    assert rollouts.offer("amd-0").serial == 3


def test_abort_releases_the_revert_bundle_to_every_host_and_done_withdraws_it(any_store: SqlStore) -> None:
    """A revert bundle (the previous policy pushed staged above the target, signed in advance) reaches no host while
    the rollout runs; abort offers it to every host of its scope, so the admitted ones leave the target without a
    new push; a completed rollout withdraws it instead. A revert that is not staged, not above the target or of
    another scope is refused at start."""
    clock = Clock()
    bundles, rollouts = seed(any_store, clock)
    bundles.push(ADMIN, bundle_bytes(3), signature_of(bundle_bytes(3)), staged=True)
    bundles.push(ADMIN, bundle_bytes(4), signature_of(bundle_bytes(4)))  # offered at once: no revert
    bundles.withdraw(ADMIN, 4)
    amd_only = bundle_bytes(5, host_ids=["amd-*"])
    bundles.push(ADMIN, amd_only, signature_of(amd_only), staged=True)
    for revert, code in ((4, "revert_not_staged"), (5, "revert_scope")):
        with pytest.raises(HubHTTPError) as refused:
            rollouts.start(ADMIN, SPEC.model_copy(update={"revert_serial": revert}))
        assert refused.value.error == code, refused.value
    assert "revert_serial: must be above target_serial" in RolloutSpec(target_serial=2, revert_serial=2).problems()[0]
    rid = rollouts.start(ADMIN, SPEC.model_copy(update={"revert_serial": 3})).rollout.rollout_id
    assert {h: rollouts.offer(h).serial for h in AMD + NV} == {"amd-0": 2, "amd-1": 1, "amd-2": 1, "amd-3": 1,
                                                              "nv-0": 2, "nv-1": 1}
    clock.advance(10)
    report(any_store, clock, ["amd-0"], health="cpu_fallback")
    assert rollouts.evaluate(rid).action == "halt"  # type: ignore[union-attr]
    aborted = rollouts.abort(ADMIN, rid)
    assert aborted.state == "aborted" and "revert bundle 3 released" in aborted.reason
    assert {h: rollouts.offer(h).serial for h in AMD + NV} == {h: 3 for h in AMD + NV}
    assert not bundles.summary(3).staged and bundles.summary(2).withdrawn_at is not None
    assert [e.action for e in bundles.audit()][:3] == ["rollout_revert_released", "withdraw", "rollout_aborted"]

    bundles.push(ADMIN, bundle_bytes(6), signature_of(bundle_bytes(6)), staged=True)
    bundles.push(ADMIN, bundle_bytes(7), signature_of(bundle_bytes(7)), staged=True)
    spec = RolloutSpec(target_serial=6, canaries=1, batches=(100,), soak_seconds=0, revert_serial=7)
    done = rollouts.start(ADMIN, spec).rollout.rollout_id
    clock.advance(10)
    report(any_store, clock, ["amd-0", "nv-0"], serial=6)
    rollouts.evaluate(done)
    clock.advance(10)
    report(any_store, clock, AMD + NV, serial=6)
    assert rollouts.evaluate(done).action == "done"  # type: ignore[union-attr]
    assert bundles.summary(7).withdrawn_by == "hub"
    assert {h: bundles.offer_serial(h) for h in AMD + NV} == {h: 6 for h in AMD + NV}


def test_pause_stops_admissions_and_a_second_rollout_waits(sqlite: SqlStore) -> None:
    """A paused rollout admits nobody until resumed, while a held-back host's notice still says the stage, the
    canaries' current tally and the soak; a second rollout is refused while one is active."""
    clock = Clock()
    _, rollouts = seed(sqlite, clock)
    rid = rollouts.start(ADMIN, SPEC).rollout.rollout_id
    rollouts.pause(ADMIN, rid)
    clock.advance(120)
    report(sqlite, clock, ["amd-0", "nv-0"])
    assert rollouts.evaluate(rid) is None
    assert rollouts.offer("amd-3").notice == f"rollout {rid}: paused (paused by alice; waiting for stage 1 (2/2 " \
                                             "canaries passed, soak ends 01:01 UTC))"
    with pytest.raises(HubHTTPError) as refused:
        rollouts.start(ADMIN, SPEC)
    assert (refused.value.status, refused.value.error) == (409, "rollout_active")
    rollouts.resume(ADMIN, rid)
    assert stages(rollouts, rid)["amd-1"] == 1


def test_the_offer_carries_typed_fields_and_the_row_keeps_who_paused_it(any_store: SqlStore) -> None:
    """The offer names the rollout, its state and the admitting stage as typed fields (held back: no stage); pause
    keeps the pauser in the row's paused_by column, which a paused evaluation reads, never the reason text (here
    overwritten with prose naming someone else); resume clears it."""
    clock = Clock()
    _, rollouts = seed(any_store, clock)
    rid = rollouts.start(ADMIN, SPEC).rollout.rollout_id
    canary, held = rollouts.offer("amd-0"), rollouts.offer("amd-1")
    assert (canary.rollout_id, canary.state, canary.admitted_stage) == (rid, "running", 0)
    assert (held.rollout_id, held.state, held.admitted_stage) == (rid, "running", None)
    row = rollouts.pause(ADMIN, rid)
    assert (row.state, row.paused_by) == ("paused", "alice") and row.reason.startswith("paused by alice; waiting")
    assert (rollouts.offer("amd-0").state, rollouts.offer("amd-0").admitted_stage) == ("paused", 0)
    any_store.write("test", lambda cur: cur.execute(any_store.dialect.sql(
        "UPDATE rollouts SET reason = ? WHERE rollout_id = ?"), ("paused by mallory; waiting for stage 9", rid)))
    clock.advance(5)
    assert rollouts.evaluate(rid) is None
    status = rollouts.status(rid).rollout
    assert status.paused_by == "alice" and status.reason.startswith("paused by alice; waiting for stage 1")
    assert rollouts.resume(ADMIN, rid).paused_by is None
    assert rollouts.status(rid).rollout.paused_by is None and rollouts.offer("amd-1").state == "running"


def test_no_active_rollout_offers_no_rollout_fields(sqlite: SqlStore) -> None:
    """Without a rollout (or after abort) the offer has no id, state or stage, and no X-Gpuguard-Rollout* header."""
    clock = Clock()
    _, rollouts = seed(sqlite, clock)
    offered = rollouts.offer("amd-0")
    assert (offered.rollout_id, offered.state, offered.admitted_stage, offered.headers()) == (None, None, None, {})
    rid = rollouts.start(ADMIN, SPEC).rollout.rollout_id
    assert set(rollouts.offer("amd-0").headers()) == {"X-Gpuguard-Rollout", "X-Gpuguard-Rollout-Id",
                                                      "X-Gpuguard-Rollout-State", "X-Gpuguard-Rollout-Admitted-Stage"}
    rollouts.abort(ADMIN, rid)
    assert rollouts.offer("amd-0").headers() == {}


def test_a_hub_restart_resumes_from_the_rows(sqlite: SqlStore, tmp_path: Path) -> None:
    """A new hub process over the same database carries the rollout on where the old one left it."""
    clock = Clock()
    _, rollouts = seed(sqlite, clock)
    rid = rollouts.start(ADMIN, SPEC).rollout.rollout_id
    sqlite.close()
    again = SQLiteStore(str(tmp_path / "hub.db"))
    again.open()
    try:
        restarted = Rollouts(again, PolicyBundles(again, check(), clock), None, clock)
        clock.advance(61)
        report(again, clock, ["amd-0", "nv-0"])
        decision = restarted.evaluate(rid)
        assert decision is not None and (decision.action, decision.stage) == ("admit", 1)
    finally:
        again.close()


def test_the_api_starts_serves_and_aborts_a_rollout(settings: HubSettings, tokens: Dict[str, str],
                                                    admin_token: str) -> None:
    """Admins start and abort through the API, readers see the status and /metrics, a held-back host's fetch carries
    the X-Gpuguard-Rollout notice and the previous bundle, and every fetch (200 and 304) carries the typed fields
    rollout_id, state and admitted_stage as JSON fields and X-Gpuguard-Rollout-* headers."""
    clock = Clock()
    store = make_store(settings.database_url)
    seed(store, clock)
    for host in ("host-a", "host-b"):
        store.ingest([[beat(host, clock.now).model_copy(update={"host_id": host})]], received_at=clock.now)
    store.close()
    with TestClient(create_app(settings, make_store(settings.database_url), clock=clock)) as hub:
        body = SPEC.model_dump(mode="json") | {"labels": {}}
        assert hub.post("/v1/rollouts", json=body, headers=bearer(tokens["ops"])).status_code == 403
        started = hub.post("/v1/rollouts", json=body, headers=bearer(admin_token))
        assert started.status_code == 201, started.json()
        rid = started.json()["rollout"]["rollout_id"]
        admitted = {h["host_id"] for h in started.json()["hosts"] if h["stage"] == 0}
        held = sorted({"host-a", "host-b"} - admitted)[0]
        fetched = hub.get("/v1/policy/bundle", headers=bearer(tokens[held]))
        assert fetched.status_code == 200 and fetched.json()["serial"] == 1
        assert fetched.headers["x-gpuguard-rollout"].startswith(f"rollout {rid}: waiting for stage 1")
        assert fetched.json()["rollout"] == fetched.headers["x-gpuguard-rollout"]
        assert {k: fetched.json()[k] for k in ("rollout_id", "state", "admitted_stage")} == {
            "rollout_id": rid, "state": "running", "admitted_stage": None}
        assert (fetched.headers["x-gpuguard-rollout-id"], fetched.headers["x-gpuguard-rollout-state"]) == (
            rid, "running") and "x-gpuguard-rollout-admitted-stage" not in fetched.headers
        again = hub.get("/v1/policy/bundle", headers={**bearer(tokens[held]), "If-None-Match": '"bundle-1"'})
        assert again.status_code == 304 and again.headers["x-gpuguard-rollout-id"] == rid
        canary = sorted(admitted & {"host-a", "host-b"})
        if canary:
            got = hub.get("/v1/policy/bundle", headers=bearer(tokens[canary[0]]))
            assert got.status_code == 200 and got.json()["serial"] == 2
            assert (got.json()["rollout_id"], got.json()["state"], got.json()["admitted_stage"]) == (rid, "running", 0)
            assert got.headers["x-gpuguard-rollout-admitted-stage"] == "0"
        shown = hub.get(f"/v1/rollouts/{rid}", headers=bearer(tokens["ops"])).json()
        assert shown["rollout"]["state"] == "running" and shown["hosts_by_stage"]["0"] == len(admitted)
        scraped = hub.get("/metrics", headers=bearer(tokens["ops"])).text
        assert f'gpuguard_hub_rollout_state{{rollout_id="{rid}",state="running"}} 1.0' in scraped
        assert f'gpuguard_hub_rollout_hosts{{rollout_id="{rid}",stage="0"}} {float(len(admitted))}' in scraped
        assert hub.post(f"/v1/rollouts/{rid}/abort", headers=bearer(tokens["ops"])).status_code == 403
        aborted = hub.post(f"/v1/rollouts/{rid}/abort", headers=bearer(admin_token))
        assert aborted.status_code == 200 and aborted.json()["state"] == "aborted"
        assert hub.post(f"/v1/rollouts/{rid}/resume", headers=bearer(admin_token)).status_code == 409
        listed = hub.get("/v1/rollouts", headers=bearer(tokens["ops"])).json()
        assert [r["state"] for r in listed["rollouts"]] == ["aborted"]


@pytest.mark.timeout(120)
def test_two_hub_processes_on_one_postgresql_decide_each_stage_once(postgres_url: str) -> None:
    """Two stores on one PostgreSQL evaluating the same rollout at once open each stage exactly once: one audit
    row per stage, every host admitted once."""
    clock = Clock()
    first, second = PostgresStore(postgres_url), PostgresStore(postgres_url)
    try:
        _, rollouts_a = seed(first, clock)
        second.open()
        rollouts_b = Rollouts(second, PolicyBundles(second, check(), clock), None, clock)
        spec = SPEC.model_copy(update={"batches": (25, 50, 75, 100), "soak_seconds": 0})
        rid = rollouts_a.start(ADMIN, spec).rollout.rollout_id
        for _ in range(6):
            clock.advance(1)
            admitted = [h.host_id for h in rollouts_a.status(rid).hosts if h.stage is not None]
            report(first, clock, admitted)
            clock.advance(1)
            barrier = threading.Barrier(4)
            errors: List[BaseException] = []

            def race(rollouts: Rollouts, barrier: threading.Barrier = barrier,
                     errors: List[BaseException] = errors) -> None:
                try:
                    barrier.wait(10)
                    rollouts.evaluate(rid)
                except BaseException as exc:  # noqa: BLE001 - reported below
                    errors.append(exc)

            threads = [threading.Thread(target=race, args=(r,)) for r in (rollouts_a, rollouts_b) * 2]
            for t in threads:
                t.start()
            for t in threads:
                t.join(30)
            assert not errors
        status = rollouts_a.status(rid)
        assert status.rollout.state == "done" and all(h.stage is not None for h in status.hosts)
        audit = [e for e in PolicyBundles(first, check(), clock).audit(1000) if e.action == "rollout_stage"]
        opened = [e.detail.split("stage ")[1].split(" ")[0] for e in audit]
        assert sorted(opened) == sorted(set(opened)) and len(opened) >= 3
        done = [e for e in PolicyBundles(first, check(), clock).audit(1000) if e.action == "rollout_done"]
        assert len(done) == 1
    finally:
        first.close()
        second.close()


def test_the_dashboard_shows_a_halted_rollout_and_why(settings: HubSettings, tokens: Dict[str, str]) -> None:
    """/ui/rollouts lists the rollout as halted; its page names the failing canary and its result, escaped."""
    clock = Clock()
    store = make_store(settings.database_url)
    _, rollouts = seed(store, clock)
    rid = rollouts.start(ADMIN, SPEC).rollout.rollout_id
    clock.advance(10)
    report(store, clock, ["nv-0"], health="failed")
    assert rollouts.evaluate(rid).action == "halt"  # type: ignore[union-attr]
    store.close()
    with TestClient(create_app(settings, make_store(settings.database_url), clock=clock)) as hub:
        listed = hub.get("/ui/rollouts", headers=bearer(tokens["ops"]))
        assert listed.status_code == 200 and f'data-rollout-id="{rid}"' in listed.text and ">halted<" in listed.text
        shown = hub.get(f"/ui/rollouts/{rid}", headers=bearer(tokens["ops"])).text
        assert "1 of 2 canaries failed: nv-0 (health failed on serial 2)" in shown
        assert 'class="rollout-host fail" data-host-id="nv-0"' in shown
        assert hub.get("/ui/rollouts/nope", headers=bearer(tokens["ops"])).status_code == 404
        assert hub.get("/ui/rollouts", follow_redirects=False).status_code == 303  # no token: to the login form


def test_a_pass_from_before_admission_or_not_after_a_change_does_not_count(sqlite: SqlStore) -> None:
    """With the optional heartbeat fields, a pass from a check that finished before admission, or one that was not a
    post-change check, keeps the canary waiting; a post-change pass after admission counts."""
    clock = Clock()
    _, rollouts = seed(sqlite, clock)
    rid = rollouts.start(ADMIN, SPEC.model_copy(update={"soak_seconds": 0})).rollout.rollout_id
    admitted_at = clock.now
    clock.advance(10)

    def canaries(health_at: dt.datetime, after_change: bool) -> None:
        sqlite.ingest([[beat(h, clock.now, 2).model_copy(update={"payload": beat(h, clock.now, 2).payload.model_copy(
            update={"last_health_at": health_at, "last_health_after_change": after_change})})
            for h in ("amd-0", "nv-0")]], received_at=clock.now)

    canaries(admitted_at - dt.timedelta(seconds=1), True)
    assert rollouts.evaluate(rid).action == "wait"  # type: ignore[union-attr]
    assert {h.evidence.detail for h in rollouts.status(rid).hosts if h.evidence} == {
        "last health check (pass) finished before admission"}
    clock.advance(1)
    canaries(clock.now, False)
    assert rollouts.evaluate(rid).action == "wait"  # type: ignore[union-attr]
    clock.advance(1)
    canaries(clock.now, True)
    assert rollouts.evaluate(rid).action == "admit"  # type: ignore[union-attr]


def test_a_failing_report_halts_without_waiting_for_the_tick(settings: HubSettings,
                                                                     tokens: Dict[str, str]) -> None:
    """With an hour-long tick, a canary's failing heartbeat posted to the hub halts the rollout within seconds:
    storing failing evidence nudges the rollout worker."""
    import time

    from tests.hub.factories import batch_json

    clock = Clock()
    store = make_store(settings.database_url)
    store.open()
    store.ingest([[beat(h, clock.now).model_copy(update={"host_id": h}) for h in ("host-a", "host-b", "host-c")]],
                 received_at=clock.now)
    bundles = PolicyBundles(store, check(), clock)
    bundles.push(ADMIN, bundle_bytes(1), signature_of(bundle_bytes(1)))
    bundles.push(ADMIN, bundle_bytes(2), signature_of(bundle_bytes(2)))
    rid = Rollouts(store, bundles, None, clock).start(ADMIN, SPEC.model_copy(update={"soak_seconds": 0})) \
        .rollout.rollout_id
    store.close()
    clock.advance(5)
    slow_tick = settings.model_copy(update={"rollout_tick_seconds": 3600.0})
    with TestClient(create_app(slow_tick, make_store(settings.database_url), clock=clock)) as hub:
        [canary] = [h["host_id"] for h in hub.get(f"/v1/rollouts/{rid}", headers=bearer(tokens["ops"]))
                    .json()["hosts"] if h["stage"] == 0]
        failing = beat(canary, clock.now, 2, health="cpu_fallback").model_copy(update={"host_id": canary})
        assert hub.post("/v1/events", content=batch_json([failing]), headers=bearer(tokens[canary])).status_code == 200
        deadline = time.monotonic() + 120  # only ends a broken run
        while time.monotonic() < deadline:
            if hub.get(f"/v1/rollouts/{rid}", headers=bearer(tokens["ops"])).json()["rollout"]["state"] == "halted":
                break
            time.sleep(0.05)
        assert hub.get(f"/v1/rollouts/{rid}", headers=bearer(tokens["ops"])).json()["rollout"]["state"] == "halted"


def test_the_halt_alert_reads_as_json_and_as_slack(sqlite: SqlStore) -> None:
    """The queued halt alert is sent as the JSON envelope (kind rollout_halted, the failing hosts) and, to a Slack
    webhook, as one escaped text naming the rollout and the host."""

    from agent.hub.alerts import Delivery, message

    clock = Clock()
    _, rollouts = seed(sqlite, clock)
    rid = rollouts.start(ADMIN, SPEC).rollout.rollout_id
    clock.advance(10)
    report(sqlite, clock, ["amd-0"], health="regression")
    rollouts.evaluate(rid)
    [(body, attempts)] = sqlite.query("test", "SELECT body, attempts FROM alert_deliveries WHERE kind = ?",
                                      ["rollout_halted"])
    delivery = Delivery(webhook="pager", host_id="-", event_id=f"rollout-{rid}-halt", attempts=attempts, body=body)
    sent = json.loads(message(AlertWebhook(name="pager", url="http://127.0.0.1:9/h"), delivery))
    assert (sent["kind"], sent["severity"], sent["hub_alert"]["rollout_id"]) == ("rollout_halted", "critical", rid)
    assert sent["hub_alert"]["hosts"] == [{"host_id": "amd-0", "result": "fail",
                                           "detail": "health regression on serial 2"}]
    slack = json.loads(message(AlertWebhook(name="chat", url="http://127.0.0.1:9/s", format="slack"), delivery))
    assert slack["text"].startswith("*[critical] rollout_halted*") and "amd-0 (health regression" in slack["text"]


def test_a_silent_canary_fails_at_the_report_deadline_and_halts_with_an_alert_naming_it(any_store: SqlStore) -> None:
    """A canary that never reports after admission (powered off, agent dead) holds the stage only until the report
    deadline; then it fails as overdue, the rollout halts and the alert names it."""
    clock = Clock()
    _, rollouts = seed(any_store, clock)
    rid = rollouts.start(ADMIN, SPEC.model_copy(update={"report_deadline_seconds": 600})).rollout.rollout_id
    clock.advance(10)
    report(any_store, clock, ["amd-0"])  # nv-0 stays silent
    clock.advance(589)
    assert rollouts.evaluate(rid).action == "wait"  # type: ignore[union-attr]
    clock.advance(2)
    decision = rollouts.evaluate(rid)
    assert decision is not None and decision.action == "halt"
    assert "1 of 2 canaries failed: nv-0 (overdue: no pass within 600s of admission (no heartbeat since " \
           "admission))" in decision.reason
    assert "halted" in (rollouts.offer("amd-1").notice or "") and rollouts.offer("amd-1").serial == 1
    [(body,)] = any_store.query("test", "SELECT body FROM alert_deliveries WHERE kind = ?", ["rollout_halted"])
    assert json.loads(body)["hub_alert"]["hosts"] == [{
        "host_id": "nv-0", "result": "fail",
        "detail": "overdue: no pass within 600s of admission (no heartbeat since admission)"}]


def health_beat(host_id: str, at: dt.datetime, health_at: dt.datetime, after_change: Any,
                health: str = "pass") -> Event:
    """A heartbeat on serial 2 that says when its last check finished and whether it followed a change."""
    plain = beat(host_id, at, 2, health)
    return plain.model_copy(update={"payload": plain.payload.model_copy(
        update={"last_health_at": health_at, "last_health_after_change": after_change})})


def test_a_canary_that_passed_keeps_its_pass_after_a_periodic_check_and_an_agent_restart(any_store: SqlStore) -> None:
    """A post-change pass stands through the soak when the canary's next heartbeats carry that result read back after
    an agent restart (after_change absent) and then a periodic check (after_change false)."""
    clock = Clock()
    _, rollouts = seed(any_store, clock)
    rid = rollouts.start(ADMIN, SPEC.model_copy(update={"soak_seconds": 3600})).rollout.rollout_id
    clock.advance(60)
    checked_at = clock.now
    any_store.ingest([[health_beat(h, clock.now, checked_at, True) for h in ("amd-0", "nv-0")]], received_at=clock.now)
    assert rollouts.evaluate(rid).action == "wait"  # type: ignore[union-attr]
    assert "2/2 canaries passed" in (rollouts.offer("amd-1").notice or "")
    clock.advance(1800)
    any_store.ingest([[health_beat(h, clock.now, checked_at, None) for h in ("amd-0", "nv-0")]], received_at=clock.now)
    assert rollouts.evaluate(rid).action == "wait"  # type: ignore[union-attr]
    clock.advance(1800)
    any_store.ingest([[health_beat(h, clock.now, clock.now, False) for h in ("amd-0", "nv-0")]], received_at=clock.now)
    decision = rollouts.evaluate(rid)
    assert decision is not None and (decision.action, decision.stage) == ("admit", 1)


def test_a_paused_rollout_keeps_its_evidence_current(sqlite: SqlStore) -> None:
    """While paused, the tick records the canaries' post-change passes, so a periodic check during the pause does
    not make them wait again after resume."""
    clock = Clock()
    _, rollouts = seed(sqlite, clock)
    rid = rollouts.start(ADMIN, SPEC).rollout.rollout_id
    rollouts.pause(ADMIN, rid)
    clock.advance(30)
    sqlite.ingest([[health_beat(h, clock.now, clock.now, True) for h in ("amd-0", "nv-0")]], received_at=clock.now)
    assert rollouts.evaluate_running() == 0
    clock.advance(3600)
    sqlite.ingest([[health_beat(h, clock.now, clock.now, False) for h in ("amd-0", "nv-0")]], received_at=clock.now)
    rollouts.resume(ADMIN, rid)
    assert stages(rollouts, rid)["amd-1"] == 1


def test_a_host_silent_when_the_rollout_starts_is_left_out_and_never_made_a_canary(
        settings: HubSettings, admin_token: str) -> None:
    """A host the hub last heard from two days ago (decommissioned, powered off) would sort first in its cohort; the
    hub's rollout leaves it out (audited), so the canary is a live host and the silent one is held back."""
    clock = Clock()
    store = make_store(settings.database_url)
    seed(store, clock)
    two_days_ago = clock.now - dt.timedelta(days=2)
    store.ingest([[beat("amd--dead", two_days_ago)]], received_at=two_days_ago)
    store.close()
    with TestClient(create_app(settings, make_store(settings.database_url), clock=clock)) as hub:
        started = hub.post("/v1/rollouts", json=SPEC.model_dump(mode="json"), headers=bearer(admin_token))
        assert started.status_code == 201, started.json()
        hosts = {h["host_id"]: h["stage"] for h in started.json()["hosts"]}
        assert "amd--dead" not in hosts and hosts["amd-0"] == 0 and hosts["nv-0"] == 0
        audit = hub.get("/v1/audit", headers=bearer(admin_token)).json()
        [detail] = [e["detail"] for e in audit["entries"] if e["action"] == "rollout_start"]
        assert "1 hosts silent for over 900s left out" in detail


def test_a_host_gone_silent_before_its_stage_is_passed_over(any_store: SqlStore) -> None:
    """When a stage opens, a host of the rollout the hub has not heard from for stale_after_seconds is passed over
    (the next live host of its cohort is admitted), and a rollout whose only hosts left are silent ends done, saying
    so."""
    clock = Clock()
    bundles, _ = seed(any_store, clock)
    rollouts = Rollouts(any_store, bundles, None, clock, stale_after_seconds=900)
    rid = rollouts.start(ADMIN, SPEC).rollout.rollout_id
    clock.advance(1000)
    report(any_store, clock, ["amd-0", "nv-0"])
    report(any_store, clock, ["amd-2", "amd-3", "nv-1"], serial=1)  # alive; amd-1 is powered off
    decision = rollouts.evaluate(rid)
    assert decision is not None and (decision.action, decision.stage, decision.admit) == ("admit", 1, ["amd-2"])
    clock.advance(61)
    report(any_store, clock, ["amd-0", "nv-0", "amd-2"])
    report(any_store, clock, ["amd-3", "nv-1"], serial=1)
    decision = rollouts.evaluate(rid)
    assert decision is not None and (decision.action, decision.admit) == ("admit", ["amd-3", "nv-1"])
    clock.advance(61)
    report(any_store, clock, ["amd-0", "nv-0", "amd-2", "amd-3", "nv-1"])
    decision = rollouts.evaluate(rid)
    assert decision is not None and decision.action == "done" and "1 silent hosts never admitted" in decision.reason
    assert stages(rollouts, rid)["amd-1"] is None


def test_a_bundle_pushed_during_a_rollout_must_be_staged(settings: HubSettings, admin_token: str) -> None:
    """While a rollout is active, a plain push (which would reach only its admitted hosts, every other host being
    held below the target) is refused with 409 naming the rollout; a staged push is stored; after abort a plain
    push is stored and offered to every host."""
    from tests.hub.test_policy_bundles import push_body, refused

    clock = Clock()
    store = make_store(settings.database_url)
    seed(store, clock)
    store.close()
    with TestClient(create_app(settings, make_store(settings.database_url), clock=clock)) as hub:
        started = hub.post("/v1/rollouts", json=SPEC.model_dump(mode="json"), headers=bearer(admin_token))
        rid = started.json()["rollout"]["rollout_id"]
        refused(hub.post("/v1/policy/bundles", json=push_body(bundle_bytes(3)), headers=bearer(admin_token)), 409,
                "rollout_active", f"rollout {rid} of bundle 2 is running: a bundle pushed now would reach only")
        staged = hub.post("/v1/policy/bundles", json=push_body(bundle_bytes(3)) | {"staged": True},
                          headers=bearer(admin_token))
        assert staged.status_code == 201 and staged.json()["staged"] is True
        assert hub.post(f"/v1/rollouts/{rid}/abort", headers=bearer(admin_token)).status_code == 200
        assert hub.post("/v1/policy/bundles", json=push_body(bundle_bytes(4)),
                        headers=bearer(admin_token)).status_code == 201


def test_a_failed_gating_workload_halts_the_rollout_naming_it_and_its_stack(any_store: SqlStore) -> None:
    """A canary whose post-change check carries a gating workload in cpu_fallback (the status pass, as an agent that
    did not gate on it would send) fails and halts the rollout naming the workload and its stack; the other canary's
    pass names its gating workload; a failed non-gating workload fails nobody."""
    from agent.report.events import WorkloadReport, WorkloadStackReport

    clock = Clock()
    _, rollouts = seed(any_store, clock)
    rid = rollouts.start(ADMIN, SPEC).rollout.rollout_id
    clock.advance(60)
    stack = WorkloadStackReport(driver="amdgpu 6.10.5", gpu_stack="ROCm 6.3.1", framework="torch 2.9.1 (ROCm 6.3)")

    def with_workloads(host_id: str, *workloads: WorkloadReport) -> Event:
        plain = health_beat(host_id, clock.now, clock.now, True)
        return plain.model_copy(update={"payload": plain.payload.model_copy(update={"workloads": list(workloads)})})

    nv_ok = WorkloadReport(name="llm-decode", status="pass", gates=True, stack_id="1" * 16, stack=stack)
    side = WorkloadReport(name="side-job", status="failed", gates=False, stack_id="2" * 16, stack=stack)
    any_store.ingest([[with_workloads("nv-0", nv_ok, side)]], received_at=clock.now)
    assert rollouts.evaluate(rid).action == "wait"  # type: ignore[union-attr]
    [nv] = [h for h in rollouts.status(rid).hosts if h.host_id == "nv-0"]
    assert nv.evidence is not None and nv.evidence.result == "pass"
    assert "gating workloads passed: llm-decode" in nv.evidence.detail
    bad = WorkloadReport(name="resnet-train", status="cpu_fallback", gates=True, stack_id="3" * 16, stack=stack)
    any_store.ingest([[with_workloads("amd-0", bad)]], received_at=clock.now)
    decision = rollouts.evaluate(rid)
    assert decision is not None and decision.action == "halt"
    assert ("amd-0 (gating workload resnet-train cpu_fallback on driver amdgpu 6.10.5, ROCm 6.3.1, "
            "torch 2.9.1 (ROCm 6.3)") in decision.reason


def test_a_heartbeat_with_a_failed_gating_workload_nudges_the_tick(sqlite: SqlStore) -> None:
    """A stored heartbeat whose gating workload failed asks for an evaluation at once; a failed non-gating one and
    a passing gating one do not."""
    from agent.hub.rollouts import RolloutWorker
    from agent.report.events import WorkloadReport

    class Soon:
        def __init__(self) -> None:
            self.asked: List[str] = []

        def run_soon(self, job: str) -> None:
            self.asked.append(job)

    clock = Clock()
    _, rollouts = seed(sqlite, clock)
    worker, soon = RolloutWorker(rollouts, 60.0), Soon()
    worker._periodic = soon  # type: ignore[assignment]

    def with_workload(status: str, gates: bool) -> Event:
        plain = beat("amd-0", clock.now, 2, "pass")
        report = WorkloadReport(name="resnet-train", status=status, gates=gates, stack_id="3" * 16)
        return plain.model_copy(update={"payload": plain.payload.model_copy(update={"workloads": [report]})})

    worker.nudge([with_workload("failed", False), with_workload("pass", True)])
    assert soon.asked == []
    worker.nudge([with_workload("cpu_fallback", True)])
    assert soon.asked == [RolloutWorker.JOB]


def test_the_control_tolerates_background_failures_and_halts_a_cohort_the_change_breaks(any_store: SqlStore) -> None:
    """One cohort of 120 hosts judged against its control: a canary failing as often as a held-back host does not
    halt, and the widening says both rates; when the change breaks the admitted batch the halt, status and alert
    give both groups' counts and rates."""
    clock = Clock()
    fleet = [f"amd-{i:03d}" for i in range(120)]
    any_store.open()
    any_store.ingest([[beat(h, clock.now - dt.timedelta(minutes=5)) for h in fleet]], received_at=clock.now)
    bundles = PolicyBundles(any_store, check(), clock)
    for serial in (1, 2):
        bundles.push(ADMIN, bundle_bytes(serial), signature_of(bundle_bytes(serial)))
    alerts = AlertQueue(any_store, [AlertWebhook(name="pager", url="http://127.0.0.1:9/hook")])
    alerts.open()
    rollouts = Rollouts(any_store, bundles, alerts, clock)
    spec = RolloutSpec(target_serial=2, canaries=20, batches=(40, 100), soak_seconds=60)
    rid = rollouts.start(ADMIN, spec).rollout.rollout_id
    canaries, held = fleet[:20], fleet[20:]
    clock.advance(30)
    report(any_store, clock, canaries[1:])
    report(any_store, clock, held, serial=1)  # the control: heard from in the window, one of them failing
    report(any_store, clock, [held[30]], serial=1, health="failed")
    any_store.ingest([[event(canaries[0], kind="cpu_fallback", at=clock.now)]], received_at=clock.now)
    decision = rollouts.evaluate(rid)
    assert decision is not None and decision.action == "wait"  # the absolute rule would have halted here
    assert "admitted 1/20 (5.0%) failed vs control 1/100 (1.0%), p=0.3" in decision.reason
    clock.advance(31)
    decision = rollouts.evaluate(rid)
    assert decision is not None and (decision.action, decision.stage, len(decision.admit)) == ("admit", 1, 28)
    widened = rollouts.status(rid).rollout.reason
    assert "widened: 1 cohorts judged against their control" in widened and "admitted 1/20 (5.0%)" in widened
    assert "control 1/100 (1.0%)" in [e.detail for e in bundles.audit() if e.action == "rollout_stage"][0]
    clock.advance(10)
    any_store.ingest([[event(h, kind="health_regression", at=clock.now) for h in decision.admit]],
                     received_at=clock.now)
    decision = rollouts.evaluate(rid)
    assert decision is not None and decision.action == "halt"
    status = rollouts.status(rid).rollout
    assert status.state == "halted" and status.reason.startswith("cohort AMD Instinct MI300X | ")
    assert "admitted 29/48 (60.4%) failed vs control 1/100 (1.0%)" in status.reason
    [(body,)] = any_store.query("test", "SELECT body FROM alert_deliveries WHERE kind = ?", ["rollout_halted"])
    sent = json.loads(body)["hub_alert"]
    [judged] = sent["judgements"]
    assert (judged["admitted_failed"], judged["admitted"], judged["control_failed"], judged["control"],
            judged["worse"]) == (29, 48, 1, 100, True)
    assert "admitted 29/48 (60.4%) failed vs control 1/100 (1.0%)" in sent["summary"]
    page = rollout_page(rollouts.status(rid), clock.now, "ops")
    assert "admitted 29/48 (60.4%) failed vs control 1/100 (1.0%)" in page and "one-sided Fisher" in page


def test_a_rollout_started_before_the_control_keeps_the_absolute_rule(sqlite: SqlStore) -> None:
    """A stored spec without ``judge`` (a rollout started before judgement with a control) reads as absolute: an
    upgrade does not change the rule a running rollout was started under."""
    clock = Clock()
    _, rollouts = seed(sqlite, clock)
    rid = rollouts.start(ADMIN, SPEC).rollout.rollout_id
    assert rollouts.status(rid).rollout.spec.judge == "control"
    old = {k: v for k, v in json.loads(SPEC.model_dump_json()).items() if k != "judge"}
    sqlite.write("test", lambda cur: cur.execute("UPDATE rollouts SET spec = ? WHERE rollout_id = ?",
                                                 (json.dumps(old), rid)))
    assert rollouts.status(rid).rollout.spec.judge == "absolute"
