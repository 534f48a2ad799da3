"""An incremental rollout evaluation (issue #43: only the hosts whose evidence or control state can have changed since
the last one are read and judged again, the rest kept from this process's last evaluation) decides byte for byte what
a full evaluation decides, on seeded random fleets, over SQLite and PostgreSQL, also when another hub process
evaluates the rollout in between."""

from __future__ import annotations

import datetime as dt
import itertools
import os
import random
import sqlite3
import warnings
from pathlib import Path
from typing import Any, Callable, Iterator, List, Optional, Tuple

import pytest

from agent.hub.bundles import PolicyBundles
from agent.hub.rollout_plan import RolloutSpec
from agent.hub.rollouts import Rollouts
from agent.hub.store import PostgresStore, SQLiteStore, SqlStore
from agent.hub.tokens import Principal
from agent.report.events import Event, Heartbeat, WorkloadReport
from tests.hub.factories import CUDA_12, ROCM_62, event
from tests.hub.signing import check, signature_of
from tests.hub.test_policy_bundles import bundle_bytes
from tests.hub.test_rollouts import SPEC, Clock, any_store, health_beat, seed
from tests.hub.test_rollouts import beat as rollout_beat

__all__ = ["any_store"]  # the fixture, used here too

ADMIN = Principal(role="admin", subject="alice")
_numbers = itertools.count()
PAIRINGS = (ROCM_62, CUDA_12, ROCM_62.model_copy(update={"gpu_models": "GPU model 2"}))


def beat(host_id: str, cohort: int, at: dt.datetime, serial: int, health: str,
         gate: Optional[str] = None) -> Event:
    """A heartbeat; with ``gate``, from a post-change check that finished at ``at`` whose gating workload said so."""
    workloads = [] if gate is None else [WorkloadReport(name="gate", status=gate, gates=True, stack_id="a" * 16)]
    return event(host_id, at=at).model_copy(update={"payload": Heartbeat(
        agent_version="1.0", uptime_seconds=1.0, pairing=PAIRINGS[cohort], policy_source="bundle",
        policy_serial=serial, last_health_status=health, workloads=workloads,
        last_health_at=None if gate is None else at, last_health_after_change=None if gate is None else True)})


@pytest.fixture(params=["sqlite", "postgresql"])
def two_stores(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Tuple[SqlStore, SqlStore]]:
    """Two empty stores of one kind: one evaluated incrementally, one always in full."""
    if request.param == "sqlite":
        stores: Tuple[SqlStore, SqlStore] = (SQLiteStore(str(tmp_path / "a.db")), SQLiteStore(str(tmp_path / "b.db")))
        yield stores
        for store in stores:
            store.close()
        return
    server = request.getfixturevalue("postgres_server")
    names = [f"hub_incremental_{os.getpid()}_{next(_numbers)}" for _ in range(2)]
    stores = (PostgresStore(server.create_database(names[0])), PostgresStore(server.create_database(names[1])))
    yield stores
    for store, name in zip(stores, names):
        store.close()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            server.drop_database(name)


def rows(rollouts: Rollouts, rollout_id: str) -> List[Any]:
    """What the rollout stores about its hosts and itself, less its random id."""
    status = rollouts.status(rollout_id)
    return [status.rollout.state, status.rollout.stage, status.rollout.reason,
            [h.model_dump() for h in status.hosts]]


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_incremental_evaluations_decide_what_full_ones_do(two_stores: Tuple[SqlStore, SqlStore], seed: int) -> None:
    """A seeded random fleet reporting passes, busy, failures (health, gating workloads, events, also before
    admission: the control), silence (past the report deadline and the stale bound) and a second hub process
    evaluating in between: after every step the incremental evaluation's decision and stored rows equal those of
    evaluations that read the whole rollout."""
    rng = random.Random(seed)
    clock = Clock()
    hosts = [(f"h-{i:03d}", rng.randrange(len(PAIRINGS))) for i in range(rng.randint(30, 90))]
    spec = RolloutSpec(target_serial=2, canaries=2, batches=(20, 50, 100), soak_seconds=300,
                       report_deadline_seconds=1800, judge=rng.choice(("control", "absolute")), halt_percent=20)
    stale = rng.choice((None, 600.0))
    sides = []
    for store, full_every in zip(two_stores, (10 ** 6, 1)):
        store.open()
        store.ingest([[beat(h, c, clock.now, 1, "pass") for h, c in hosts]], received_at=clock.now)
        bundles = PolicyBundles(store, check(), clock)
        for serial in (1, 2):
            bundles.push(ADMIN, bundle_bytes(serial), signature_of(bundle_bytes(serial)))
        rollouts = Rollouts(store, bundles, None, clock, stale_after_seconds=stale, full_every=full_every)
        other = Rollouts(store, bundles, None, clock, stale_after_seconds=stale, full_every=full_every)
        sides.append((store, rollouts, other, rollouts.start(ADMIN, spec).rollout.rollout_id))
    (_, incremental, _, inc_id), (_, full, _, full_id) = sides
    assert rows(incremental, inc_id) == rows(full, full_id)
    for step in range(60):
        clock.advance(rng.choice((5, 30, 120, 400, 900)))
        admitted = {h.host_id for h in full.status(full_id).hosts if h.stage is not None}
        batch = []
        for host_id, cohort in rng.sample(hosts, rng.randint(0, len(hosts) // 3)):
            health = rng.choices(("pass", "busy", "cpu_fallback"), (90, 8, 2))[0]
            on_target = host_id in admitted and rng.random() < 0.8
            gate = rng.choices((None, "pass", "cpu_fallback"), (70, 28, 2))[0]
            batch.append(beat(host_id, cohort, clock.now - dt.timedelta(seconds=rng.randint(0, 3)),
                              2 if on_target else 1, health, gate))
            if rng.random() < 0.01:
                batch.append(event(host_id, kind="cpu_fallback", at=clock.now))
        between = rng.random() < 0.2  # another hub process evaluates first
        decisions = []
        for store, rollouts, other, rollout_id in sides:
            if batch:
                store.ingest([batch], received_at=clock.now)
            for evaluating in ((other, rollouts) if between else (rollouts,)):
                decision = evaluating.evaluate(rollout_id)
                decisions.append(None if decision is None else decision.model_dump())
        assert decisions[:len(decisions) // 2] == decisions[len(decisions) // 2:], (seed, step)
        assert rows(incremental, inc_id) == rows(full, full_id), (seed, step)
        if decisions[-1] is None:
            break


def test_an_evaluation_after_another_process_evaluated_reads_its_evidence(any_store: SqlStore) -> None:
    """A canary's pass seen only by another hub process's evaluation stands in this process's next one (which reads
    the hosts again instead of its own last view), so a periodic check after it does not hold the stage back."""
    clock = Clock()
    bundles, rollouts = seed(any_store, clock)
    other = Rollouts(any_store, bundles, None, clock)
    rid = rollouts.start(ADMIN, SPEC.model_copy(update={"soak_seconds": 3600})).rollout.rollout_id
    clock.advance(60)
    assert rollouts.evaluate(rid).action == "wait"  # type: ignore[union-attr]
    clock.advance(60)
    checked_at = clock.now
    any_store.ingest([[health_beat(h, clock.now, checked_at, True) for h in ("amd-0", "nv-0")]], received_at=clock.now)
    assert other.evaluate(rid).action == "wait"  # type: ignore[union-attr]
    clock.advance(1800)
    any_store.ingest([[health_beat(h, clock.now, clock.now, False) for h in ("amd-0", "nv-0")]], received_at=clock.now)
    clock.advance(1800)
    decision = rollouts.evaluate(rid)
    assert decision is not None and (decision.action, decision.stage) == ("admit", 1), decision


class RecordingStore(SQLiteStore):
    """The SQLite store, recording every statement (and its parameters) its write transactions execute."""

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.statements: List[Tuple[str, Any]] = []

    def write(self, operation: str, work: Callable[[Any], Any]) -> Any:
        recorded = self.statements

        class Cursor:
            def __init__(self, cur: Any) -> None:
                self._cur = cur

            def execute(self, sql: str, params: Any = ()) -> Any:
                recorded.append((sql, params))
                return self._cur.execute(sql, params)

            def __getattr__(self, name: str) -> Any:
                return getattr(self._cur, name)

        return super().write(operation, lambda cur: work(Cursor(cur)))


def test_an_incremental_evaluation_reads_by_indexes_on_sqlite(tmp_path: Path) -> None:
    """Every statement of an incremental evaluation with a changed host reads its tables by an index (SQLite's
    query plan searches, never scans ``hosts``, ``events``, ``rollout_hosts`` or ``workload_stacks``)."""
    store = RecordingStore(str(tmp_path / "hub.db"))
    clock = Clock()
    try:
        _, rollouts = seed(store, clock)
        rollouts.stale_after_seconds = 900.0
        rid = rollouts.start(ADMIN, SPEC.model_copy(update={"soak_seconds": 3600})).rollout.rollout_id
        clock.advance(60)
        rollouts.evaluate(rid)  # the full one after the canaries' admission
        clock.advance(60)
        store.ingest([[health_beat("amd-0", clock.now, clock.now, True)]], received_at=clock.now)
        store.ingest([[event("amd-1", kind="cpu_fallback", at=clock.now)]], received_at=clock.now)
        del store.statements[:]
        rollouts.evaluate(rid)
        selects = [(sql, params) for sql, params in store.statements if sql.lstrip().upper().startswith("SELECT")]
        assert any("heartbeat_received_at >=" in sql for sql, _ in selects)  # it was an incremental one
        conn = sqlite3.connect(str(tmp_path / "hub.db"))
        steps = []
        try:
            for sql, params in selects:
                plan = [row[3] for row in conn.execute(f"EXPLAIN QUERY PLAN {sql}", params)]
                assert not [step for step in plan if step.startswith("SCAN") and step.split()[1] in (
                    "h", "e", "r", "w", "hosts", "events", "rollout_hosts", "workload_stacks")], (sql, plan)
                steps += plan
        finally:
            conn.close()
        # the hosts heard from since the last evaluation are found from the hosts' side, not by reading every host
        # of the rollout
        for index in ("hosts_heartbeat_received", "hosts_last_seen", "events_kind_received"):
            assert any(f"USING INDEX {index} " in step for step in steps), (index, steps)
    finally:
        store.close()


def test_a_rollout_that_ended_leaves_nothing_kept_in_the_process(any_store: SqlStore) -> None:
    """What a process keeps of a rollout between evaluations (every host) goes when it halts, and when another
    process aborted it, at the next tick."""
    clock = Clock()
    bundles, rollouts = seed(any_store, clock)
    rid = rollouts.start(ADMIN, SPEC).rollout.rollout_id
    clock.advance(60)
    assert rollouts.evaluate(rid).action == "wait"  # type: ignore[union-attr]
    assert rid in rollouts._judged
    other = Rollouts(any_store, bundles, None, clock)
    other.abort(ADMIN, rid)
    rollouts.evaluate_running()
    assert rollouts._judged == {}
    bundles.push(ADMIN, bundle_bytes(3), signature_of(bundle_bytes(3)))
    rid = rollouts.start(ADMIN, SPEC.model_copy(update={"target_serial": 3})).rollout.rollout_id
    clock.advance(60)
    any_store.ingest([[rollout_beat("amd-0", clock.now, 3, "cpu_fallback")]], received_at=clock.now)
    assert rollouts.evaluate(rid).action == "halt"  # type: ignore[union-attr]
    assert rollouts._judged == {}
