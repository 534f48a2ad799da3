"""Judgement with a control over a simulated 10,000-host fleet with background failures, in process: the pure
``control_counts`` and ``decide`` run every report interval as the hub's tick would, on a seeded RNG."""

from __future__ import annotations

import datetime as dt
import math
import random
from typing import Dict, List, Optional, Tuple

import pytest

from agent.hub.rollout_plan import (
    Evidence,
    RolloutHost,
    RolloutSpec,
    StageStep,
    control_counts,
    decide,
)
from agent.hub.rows import HostRow
from tests.hub.factories import T0

pytestmark = pytest.mark.slow

INTERVAL = dt.timedelta(seconds=60)  # the report interval: an admitted host reports within one
HOSTS, COHORTS = 10_000, 8
BACKGROUND = 0.02  # of the hosts fail in every report interval, changed or not
SPEC = RolloutSpec(target_serial=2, canaries=25, batches=(5, 25, 100), soak_seconds=60)
PASS = Evidence(result="pass", detail="health pass on serial 2")
FAIL = Evidence(result="fail", detail="health_regression reported after admission")
WAIT = Evidence(result="wait", detail="no heartbeat since admission")


_HOSTS: Dict[Tuple[str, Optional[int], Optional[dt.datetime], str], RolloutHost] = {}


def host(host_id: str, cohort: str, stage: Optional[int], admitted_at: Optional[dt.datetime],
         evidence: Optional[Evidence]) -> RolloutHost:
    """One host, shared by every rollout that reaches the same state (harmless rollouts admit the same hosts at
    the same ticks): building 10,000 models a rollout would cost more than the decisions."""
    key = (host_id, stage, admitted_at, evidence.result if evidence else "")
    found = _HOSTS.get(key)
    if found is None:
        found = _HOSTS[key] = RolloutHost(host_id=host_id, cohort=cohort, stage=stage, admitted_at=admitted_at,
                                          evidence=evidence)
    return found


class Fleet:
    """One rollout's simulated fleet: each host's failure times (a Poisson process at BACKGROUND per interval, plus
    a failure one half interval after admission for hosts of ``broken`` cohorts, a ``broken_share`` of them)."""

    def __init__(self, rng: random.Random, broken: Tuple[str, ...] = (), broken_share: float = 1.0,
                 horizon_intervals: int = 10) -> None:
        self.rng = rng
        self.broken, self.broken_share = broken, broken_share
        rate = -math.log(1 - BACKGROUND) / INTERVAL.total_seconds()
        horizon = horizon_intervals * INTERVAL.total_seconds()
        self.failures: Dict[str, List[dt.datetime]] = {}
        self.hosts: List[RolloutHost] = []
        self.admitted: List[int] = []
        for i in range(HOSTS):
            host_id = f"h{i:05d}"
            self.hosts.append(host(host_id, f"c{i % COHORTS}", None, None, None))
            at = rng.expovariate(rate)
            while at < horizon:
                self.failures.setdefault(host_id, []).append(T0 + dt.timedelta(seconds=at))
                at += rng.expovariate(rate)
        self.breaks = {h.host_id for h in self.hosts if h.cohort in broken and rng.random() < broken_share}

    def admit(self, host_ids: List[str], stage: int, now: dt.datetime) -> None:
        for host_id in host_ids:
            i = int(host_id[1:])
            self.hosts[i] = host(host_id, self.hosts[i].cohort, stage, now, WAIT)
            self.admitted.append(i)
        for host_id in set(host_ids) & self.breaks:
            self.failures.setdefault(host_id, []).append(now + INTERVAL / 2)

    def tick(self, now: dt.datetime) -> Tuple[List[RolloutHost], Dict[str, Tuple[int, int]]]:
        """Every admitted host's evidence at ``now`` and each cohort's control, as the hub reads them: the failure
        events reported by ``now`` and a row heard from now for every host not admitted."""
        for i in self.admitted:
            h = self.hosts[i]
            admitted_at = h.admitted_at
            assert admitted_at is not None
            failed = any(admitted_at <= at <= now for at in self.failures.get(h.host_id, ()))
            evidence = FAIL if failed else PASS if now >= admitted_at + INTERVAL else WAIT
            if evidence is not h.evidence:
                self.hosts[i] = host(h.host_id, h.cohort, h.stage, admitted_at, evidence)
        heard = HostRow(host_id="-", hostname="-", first_seen_at=T0, last_seen_at=now, last_event_at=now,
                        last_sequence=1, heartbeat_at=now, policy_serial=1, last_health_status="pass")
        states = dict.fromkeys((h.host_id for h in self.hosts if h.stage is None), heard)
        failures = {host_id: [("health_regression", at) for at in times if at <= now]
                    for host_id, times in self.failures.items() if times[0] <= now}
        return self.hosts, control_counts(self.hosts, states, failures)


def run(fleet: Fleet, spec: RolloutSpec = SPEC, max_ticks: int = 10) -> Tuple[StageStep, dt.datetime]:
    """Drive one rollout tick by tick until it halts or is done; the final step and when it was taken."""
    stage, started = -1, None
    now = T0
    for _ in range(max_ticks):
        hosts, control = fleet.tick(now)
        step = decide(spec, stage, started, hosts, now, control=control)
        if step.action in ("halt", "done"):
            return step, now
        if step.action == "admit":
            fleet.admit(step.admit, step.stage, now)
            stage, started = step.stage, now
        now += INTERVAL
    raise AssertionError(f"no end within {max_ticks} ticks (stage {stage})")


@pytest.mark.timeout(600)  # about a minute on a shared 2-core machine: 1,000 evaluations of 10,000 hosts
def test_no_halt_in_200_harmless_rollouts_with_2_percent_background_failures() -> None:
    """With 2 % of 10,000 hosts failing every report interval, 200 harmless rollouts all end done, none halts."""
    master = random.Random(43)
    outcomes = [run(Fleet(random.Random(master.getrandbits(64))))[0] for _ in range(200)]
    halts = [step.reason for step in outcomes if step.action == "halt"]
    assert halts == []
    assert all("judged against their control" in step.reason for step in outcomes)


def test_the_absolute_rule_halts_harmless_rollouts_on_that_background() -> None:
    """The same fleet under the absolute rule halts on noise: why the control is the default."""
    master = random.Random(44)
    spec = SPEC.model_copy(update={"judge": "absolute"})
    outcomes = [run(Fleet(random.Random(master.getrandbits(64))), spec)[0] for _ in range(10)]
    assert sum(step.action == "halt" for step in outcomes) >= 8


@pytest.mark.parametrize("share", [1.0, 0.3])
def test_a_change_that_breaks_a_cohort_halts_within_one_report_interval(share: float) -> None:
    """A change failing all (or 30 %) of one cohort's admitted hosts halts at the first tick after their reports,
    and the halt names that cohort with both groups' counts and rates."""
    step, at = run(Fleet(random.Random(7), broken=("c3",), broken_share=share))
    assert step.action == "halt" and step.stage == 0
    assert at <= T0 + INTERVAL  # canaries admitted at T0, failing at T0 + INTERVAL/2: halted at the next tick
    assert step.reason.startswith("cohort c3: admitted ")
    assert "failed vs control " in step.reason and step.reason.count("%)") == 2
    worse = [j for j in step.judgements if j.worse]
    assert [j.cohort for j in worse] == ["c3"] and worse[0].admitted == 25 and worse[0].control > 1000


def test_a_change_that_breaks_a_cohort_late_halts_at_the_batch_it_reaches() -> None:
    """A break that shows only from stage 1 on (the canaries were lucky) still halts within one report interval
    of the batch's failing reports."""
    fleet = Fleet(random.Random(11))
    step: Optional[StageStep] = None
    stage, started, now = -1, None, T0
    for _ in range(10):
        hosts, control = fleet.tick(now)
        step = decide(SPEC, stage, started, hosts, now, control=control)
        if step.action != "admit":
            if step.action == "halt":
                break
            now += INTERVAL
            continue
        if step.stage == 1:
            fleet.breaks = {h.host_id for h in fleet.hosts if h.cohort == "c5"}
        fleet.admit(step.admit, step.stage, now)
        stage, started = step.stage, now
        now += INTERVAL
    assert step is not None and step.action == "halt" and stage == 1
    assert step.reason.startswith("cohort c5:") and now == started + INTERVAL
