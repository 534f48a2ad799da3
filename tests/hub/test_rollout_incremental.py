"""An incremental rollout evaluation (issue #43: only the hosts whose evidence can have changed since the last one
are judged again) decides byte for byte what a full evaluation decides, on seeded random fleets, over SQLite and
PostgreSQL."""

from __future__ import annotations

import datetime as dt
import itertools
import os
import random
import warnings
from pathlib import Path
from typing import Any, Iterator, List, Tuple

import pytest

from agent.hub.bundles import PolicyBundles
from agent.hub.rollout_plan import RolloutSpec
from agent.hub.rollouts import Rollouts
from agent.hub.store import PostgresStore, SQLiteStore, SqlStore
from agent.hub.tokens import Principal
from agent.report.events import Event, Heartbeat
from tests.hub.factories import CUDA_12, ROCM_62, event
from tests.hub.signing import check, signature_of
from tests.hub.test_policy_bundles import bundle_bytes
from tests.hub.test_rollouts import Clock

ADMIN = Principal(role="admin", subject="alice")
_numbers = itertools.count()
PAIRINGS = (ROCM_62, CUDA_12, ROCM_62.model_copy(update={"gpu_models": "GPU model 2"}))


def beat(host_id: str, cohort: int, at: dt.datetime, serial: int, health: str) -> Event:
    return event(host_id, at=at).model_copy(update={"payload": Heartbeat(
        agent_version="1.0", uptime_seconds=1.0, pairing=PAIRINGS[cohort], policy_source="bundle",
        policy_serial=serial, last_health_status=health)})


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


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_incremental_evaluations_decide_what_full_ones_do(two_stores: Tuple[SqlStore, SqlStore], seed: int) -> None:
    """A seeded random fleet reporting passes, busy, failures and silence: after every step the incremental
    evaluation's decision and stored rows equal those of an evaluation that reads the whole rollout."""
    rng = random.Random(seed)
    clock = Clock()
    hosts = [(f"h-{i:03d}", rng.randrange(len(PAIRINGS))) for i in range(rng.randint(30, 90))]
    spec = RolloutSpec(target_serial=2, canaries=2, batches=(20, 50, 100), soak_seconds=300,
                       report_deadline_seconds=1800, judge=rng.choice(("control", "absolute")), halt_percent=20)
    sides = []
    for store, full_every in zip(two_stores, (10 ** 6, 1)):
        store.open()
        store.ingest([[beat(h, c, clock.now, 1, "pass") for h, c in hosts]], received_at=clock.now)
        bundles = PolicyBundles(store, check(), clock)
        for serial in (1, 2):
            bundles.push(ADMIN, bundle_bytes(serial), signature_of(bundle_bytes(serial)))
        rollouts = Rollouts(store, bundles, None, clock, full_every=full_every)
        sides.append((store, rollouts, rollouts.start(ADMIN, spec).rollout.rollout_id))
    (_, incremental, inc_id), (_, full, full_id) = sides
    assert rows(incremental, inc_id) == rows(full, full_id)
    for step in range(60):
        clock.advance(rng.choice((5, 30, 120, 400, 900)))
        admitted = {h.host_id for h in full.status(full_id).hosts if h.stage is not None}
        batch = []
        for host_id, cohort in rng.sample(hosts, rng.randint(0, len(hosts) // 3)):
            health = rng.choices(("pass", "busy", "cpu_fallback"), (90, 8, 2))[0]
            on_target = host_id in admitted and rng.random() < 0.8
            batch.append(beat(host_id, cohort, clock.now - dt.timedelta(seconds=rng.randint(0, 3)),
                              2 if on_target else 1, health))
            if rng.random() < 0.01:
                batch.append(event(host_id, kind="cpu_fallback", at=clock.now))
        decisions = []
        for store, rollouts, rollout_id in sides:
            if batch:
                store.ingest([batch], received_at=clock.now)
            decision = rollouts.evaluate(rollout_id)
            decisions.append(None if decision is None else decision.model_dump())
        assert decisions[0] == decisions[1], (seed, step)
        assert rows(incremental, inc_id) == rows(full, full_id), (seed, step)
        if decisions[0] is None:
            break
