"""A host's stored evidence is a fixed point of its judgement (issue #43): judged again from the same host row,
failure events and gating verdicts, it comes out byte for byte the same, so an evaluation may keep the stored
evidence of every host whose inputs did not change (and whose report deadline did not pass) instead of judging the
whole rollout again."""

from __future__ import annotations

import datetime as dt
import random
from typing import List, Optional, Tuple

from agent.hub.rollout_plan import Evidence, RolloutSpec, host_evidence, overdue
from agent.hub.rows import HostRow
from agent.hub.workload_stacks import GatingVerdict
from tests.hub.factories import T0

SPEC = RolloutSpec(target_serial=7, report_deadline_seconds=3600)
STATUSES = (None, "pass", "busy", "skipped", "regression", "cpu_fallback", "failed", "timeout")
KINDS = ("rollback", "cpu_fallback", "health_regression", "health_failed")


def minutes(rng: random.Random, low: int, high: int) -> dt.timedelta:
    return dt.timedelta(minutes=rng.randint(low, high))


def inputs(rng: random.Random) -> Tuple[Optional[HostRow], List[Tuple[str, dt.datetime]], List[GatingVerdict],
                                        Optional[Evidence]]:
    """One random host: its row (or none), failure events, gating verdicts and the evidence it had."""
    beat = T0 + minutes(rng, -30, 120)
    skew = minutes(rng, -20, 20)
    health_at = None if rng.random() < 0.3 else beat + skew - minutes(rng, -2, 40)
    host = None if rng.random() < 0.1 else HostRow(
        host_id="h1", hostname="h1", first_seen_at=T0, last_seen_at=beat, last_event_at=beat + skew,
        last_sequence=1, heartbeat_at=beat + skew, heartbeat_received_at=beat,
        policy_serial=rng.choice((6, 7, 7, 7, None)), last_health_status=rng.choice(STATUSES),
        last_health_at=health_at, last_health_after_change=rng.choice((True, True, False, None)))
    events = [(rng.choice(KINDS), T0 + minutes(rng, -30, 120)) for _ in range(rng.choice((0, 0, 0, 1, 2)))]
    gating = [GatingVerdict(f"w{i}", rng.choice(("pass", "pass", "failed", "timeout")), "stack",
                            health_at if health_at is not None and rng.random() < 0.7 else T0)
              for i in range(rng.choice((0, 0, 1, 2)))]
    previous = rng.choice((None, Evidence(result="pass", detail="health pass on serial 7"),
                           Evidence(result="wait", detail="health busy")))
    return host, events, gating, previous


def judged(admitted_at: dt.datetime, now: dt.datetime, host: Optional[HostRow],
           events: List[Tuple[str, dt.datetime]], gating: List[GatingVerdict],
           previous: Optional[Evidence]) -> Evidence:
    """What ``Rollouts._evidence`` stores for a host: its evidence, overdue past the deadline."""
    return overdue(host_evidence(SPEC.target_serial, admitted_at, host, events, previous, gating), admitted_at, now,
                   SPEC)


def test_judging_stored_evidence_again_from_unchanged_inputs_gives_it_back() -> None:
    """For 3,000 seeded random hosts, evidence judged again from its own stored result and the same inputs is equal,
    at the same time and at a later time on the same side of the report deadline."""
    rng = random.Random(43)
    for case in range(3000):
        host, events, gating, previous = inputs(rng)
        admitted_at = T0 + minutes(rng, 0, 60)
        now = admitted_at + minutes(rng, 0, 120)
        stored = judged(admitted_at, now, host, events, gating, previous)
        assert judged(admitted_at, now, host, events, gating, stored) == stored, case
        deadline = admitted_at + dt.timedelta(seconds=SPEC.report_deadline_seconds)
        later = now + minutes(rng, 0, 120)
        if (now < deadline) == (later < deadline):
            assert judged(admitted_at, later, host, events, gating, stored) == stored, case
