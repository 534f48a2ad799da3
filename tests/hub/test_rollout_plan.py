"""The pure rollout decisions: cohorts, a host's evidence, and what a running rollout does next, as tables."""

from __future__ import annotations

import datetime as dt
from typing import List, Optional, Tuple

import pytest

from agent.hub.rollout_plan import (
    Evidence,
    RolloutHost,
    RolloutSpec,
    cohort_of,
    control_counts,
    decide,
    host_evidence,
    kernel_major_minor,
    stage_quota,
)
from agent.hub.rows import HostRow
from tests.hub.factories import CUDA_12, ROCM_62, T0

SPEC = RolloutSpec(target_serial=7, canaries=1, batches=(5, 25, 100), soak_seconds=600, halt_percent=10)
PASS = Evidence(result="pass", detail="health pass")
FAIL = Evidence(result="fail", detail="cpu_fallback reported after admission")
WAIT = Evidence(result="wait", detail="health busy")


def state(serial: Optional[int] = 7, health: Optional[str] = "pass", beat: dt.datetime = T0,
          skew: dt.timedelta = dt.timedelta(0), **extra: object) -> HostRow:
    """A host whose newest heartbeat the hub received at ``beat``, sent by a clock ``skew`` off (the heartbeat's
    time and any ``last_health_at`` are on the agent's clock)."""
    return HostRow(host_id="h1", hostname="h1", first_seen_at=T0, last_seen_at=beat, last_event_at=beat + skew,
                   last_sequence=1, heartbeat_at=beat + skew, heartbeat_received_at=beat, policy_serial=serial,
                   last_health_status=health, **extra)  # type: ignore[arg-type]


def fleet(cohorts: Tuple[Tuple[str, int], ...], stage_of: Optional[dict] = None,
          evidence_of: Optional[dict] = None) -> List[RolloutHost]:
    hosts = []
    for cohort, size in cohorts:
        for i in range(size):
            host_id = f"{cohort}-{i:03d}"
            stage = (stage_of or {}).get(host_id)
            hosts.append(RolloutHost(host_id=host_id, cohort=cohort, stage=stage,
                                     admitted_at=T0 if stage is not None else None,
                                     evidence=(evidence_of or {}).get(host_id)))
    return hosts


@pytest.mark.parametrize("kernel, series", [("6.8.0-51-generic", "6.8"), ("5.15.0-119-generic", "5.15"),
                                            (None, "?"), ("weird", "?")])
def test_kernel_series_is_major_dot_minor(kernel: Optional[str], series: str) -> None:
    """A kernel's series is its major.minor, unknown as '?'."""
    assert kernel_major_minor(kernel) == series


def test_cohorts_split_by_gpu_os_kernel_and_pairing() -> None:
    """Hosts differing in GPU, OS, kernel series or pairing fall in different cohorts; no pairing is 'unknown'."""
    amd, nvidia = cohort_of(state(pairing=ROCM_62)), cohort_of(state(pairing=CUDA_12))
    assert amd != nvidia and "MI300X" in amd and "kernel 5.15" in amd and "rocm 6.2.0" in amd
    newer_kernel = ROCM_62.model_copy(update={"kernel_running": "6.8.0-51-generic"})
    assert cohort_of(state(pairing=newer_kernel)) != amd
    assert cohort_of(state(pairing=ROCM_62.model_copy(update={"kernel_running": "5.15.0-120-generic"}))) == amd
    assert cohort_of(state()) == "unknown" and cohort_of(None) == "unknown"


ADMITTED = T0 + dt.timedelta(minutes=1)
LATER = T0 + dt.timedelta(minutes=5)


@pytest.mark.parametrize("host, failures, result, words", [
    (state(beat=LATER), [], "pass", "health pass"),
    (state(beat=LATER), [("rollback", LATER)], "fail", "rollback"),
    (state(beat=LATER), [("rollback", T0)], "pass", "health pass"),  # before admission: not this change
    (state(beat=LATER, health="cpu_fallback"), [], "fail", "cpu_fallback"),
    (state(beat=LATER, health="failed"), [], "fail", "failed"),
    (state(beat=LATER, health="busy"), [], "wait", "busy"),
    (state(beat=LATER, health="deferred"), [], "wait", "deferred"),
    (state(beat=LATER, serial=6), [], "wait", "serial 6"),
    (state(beat=LATER, serial=6, health="failed"), [], "wait", "serial 6"),  # not on the target: not its fault
    (state(beat=T0), [], "wait", "no heartbeat since admission"),
    (None, [], "wait", "no heartbeat"),
    (state(beat=LATER, last_health_at=T0, last_health_after_change=True), [], "wait", "finished before admission"),
    (state(beat=LATER, last_health_at=LATER, last_health_after_change=False), [], "wait", "not yet a post-change"),
    (state(beat=LATER, health="cpu_fallback", last_health_at=LATER, last_health_after_change=False), [], "fail",
     "cpu_fallback"),
    (state(beat=LATER, last_health_at=LATER, last_health_after_change=True), [], "pass", "health pass"),
    # a result read back after an agent restart: the check may have been a periodic one before the change
    (state(beat=LATER, last_health_at=LATER, last_health_after_change=None), [], "wait", "after an agent restart"),
    (state(beat=LATER, health="failed", last_health_at=LATER, last_health_after_change=None), [], "fail", "failed"),
    # issue 43: clocks off; the agent's times are mapped through the heartbeat's receipt, events count on receipt
    (state(beat=LATER, skew=dt.timedelta(hours=1), last_health_at=T0 + dt.timedelta(minutes=30),
           last_health_after_change=True), [], "wait", "finished before admission"),  # 1 h ahead: checked at T0-30m
    (state(beat=LATER, skew=dt.timedelta(days=1), last_health_at=LATER + dt.timedelta(days=1),
           last_health_after_change=True), [], "pass", "health pass"),
    (state(beat=LATER, skew=-dt.timedelta(minutes=10), last_health_at=LATER - dt.timedelta(minutes=10),
           last_health_after_change=True), [], "pass", "health pass"),  # 10 min behind: a truthful pass
    (state(beat=LATER, skew=-dt.timedelta(minutes=10)), [("cpu_fallback", LATER)], "fail", "cpu_fallback"),
    (state(beat=T0, skew=dt.timedelta(days=1)), [], "wait", "no heartbeat since admission"),
    # a check stamped a day ahead, read back by a clock set right since: it cannot be placed
    (state(beat=LATER, last_health_at=LATER + dt.timedelta(days=1), last_health_after_change=True), [], "wait",
     "clock moved back"),
    (state(beat=LATER, skew=dt.timedelta(hours=1)), [("health_failed", LATER)], "fail", "health_failed"),
])
def test_host_evidence(host: Optional[HostRow], failures: list, result: str, words: str) -> None:
    """A host passes on the target with health pass after admission (a post-change check finished after admission,
    when the agent says), fails on a failure event or a failed health result on the target, and waits otherwise."""
    evidence = host_evidence(7, ADMITTED, host, failures)
    assert evidence.result == result and words in evidence.detail


def test_a_pass_stands_until_failing_evidence_arrives() -> None:
    """A host that passed keeps its pass when its newest check is a later periodic one or a result read back after
    an agent restart, but not against a failure event or a failed check on the target."""
    periodic = state(beat=LATER, last_health_at=LATER, last_health_after_change=False)
    restarted = state(beat=LATER, last_health_at=LATER, last_health_after_change=None)
    for host in (periodic, restarted, state(beat=T0)):
        assert host_evidence(7, ADMITTED, host, [], previous=PASS) == PASS
    assert host_evidence(7, ADMITTED, periodic, [("rollback", LATER)], previous=PASS).result == "fail"
    assert host_evidence(7, ADMITTED, state(beat=LATER, health="cpu_fallback", last_health_at=LATER,
                                            last_health_after_change=False), [], previous=PASS).result == "fail"
    assert host_evidence(7, ADMITTED, periodic, [], previous=WAIT).result == "wait"


@pytest.mark.parametrize("stage, size, quota", [(0, 40, 1), (1, 40, 2), (2, 40, 10), (3, 40, 40), (1, 3, 1),
                                                (0, 0, 0), (2, 3, 1)])
def test_stage_quota_is_cumulative_and_rounds_up(stage: int, size: int, quota: int) -> None:
    """Stage 0 takes the canaries; later stages fill each cohort to their percentage, rounded up, never below
    the canaries."""
    assert stage_quota(stage, size, SPEC) == quota


def test_first_decision_admits_one_canary_per_cohort() -> None:
    """A rollout that opened no stage admits the canaries of every cohort into stage 0."""
    decision = decide(SPEC, -1, None, fleet((("a", 20), ("b", 3))), T0)
    assert (decision.action, decision.stage, decision.admit) == ("admit", 0, ["a-000", "b-000"])


def test_widening_waits_for_every_pass_and_for_the_soak() -> None:
    """The next stage opens only when every admitted host passed and the soak elapsed; the wait says why."""
    stages = {"a-000": 0, "b-000": 0}
    waiting = decide(SPEC, 0, T0, fleet((("a", 20), ("b", 3)), stages, {"a-000": PASS, "b-000": WAIT}), T0)
    assert waiting.action == "wait" and "waiting for stage 1 (1/2 canaries passed, soak ends 00:10 UTC)" in \
        waiting.reason
    hosts = fleet((("a", 20), ("b", 3)), stages, {"a-000": PASS, "b-000": PASS})
    assert decide(SPEC, 0, T0, hosts, T0 + dt.timedelta(seconds=599)).action == "wait"
    widened = decide(SPEC, 0, T0, hosts, T0 + dt.timedelta(seconds=600))
    # 5% of 20 and of 3 is one, the canary: stage 1 would admit nobody, so stage 2 opens (25%: 5 of a, 1 of b)
    assert (widened.action, widened.stage, widened.admit) == ("admit", 2, ["a-001", "a-002", "a-003", "a-004"])


def test_a_soak_of_a_day_or_more_names_the_day_it_ends() -> None:
    """The waiting line of a two-day soak says the date the soak ends, not only a time of day."""
    long_soak = SPEC.model_copy(update={"soak_seconds": 2 * 86400})
    hosts = fleet((("a", 20),), {"a-000": 0}, {"a-000": PASS})
    assert "soak ends 2026-01-03 00:00 UTC" in decide(long_soak, 0, T0, hosts, T0).reason


def test_a_failing_canary_halts_naming_it() -> None:
    """Any failed canary halts the rollout, whatever the halt percentage; the reason names the host and result."""
    hosts = fleet((("a", 20), ("b", 3)), {"a-000": 0, "b-000": 0}, {"a-000": PASS, "b-000": FAIL})
    decision = decide(SPEC, 0, T0, hosts, T0 + dt.timedelta(days=1))
    assert decision.action == "halt" and "1 of 2 canaries failed: b-000 (cpu_fallback" in decision.reason


def test_a_batch_halts_only_above_its_percentage() -> None:
    """In a batch stage, failures up to halt_percent are tolerated (the rollout widens past them once the others
    passed and soaked), more halt."""
    stage_of = {f"a-{i:03d}": (0 if i == 0 else 2) for i in range(20)}
    stage_of |= {f"b-{i:03d}": (0 if i == 0 else 2) for i in range(5)}
    one_bad = {h: PASS for h in stage_of} | {"a-005": FAIL}
    cohorts = (("a", 40), ("b", 20))
    decision = decide(SPEC, 2, T0, fleet(cohorts, stage_of, one_bad | {"a-009": WAIT}), T0 + dt.timedelta(days=1))
    assert decision.action == "wait"  # a host still waiting holds the stage
    decision = decide(SPEC, 2, T0, fleet(cohorts, stage_of, one_bad), T0 + dt.timedelta(days=1))
    assert (decision.action, decision.stage, len(decision.admit)) == ("admit", 3, 35)  # 1 of 23 (4.3%) tolerated
    done = decide(SPEC, 3, T0, fleet((("a", 20),), {h: 3 for h in one_bad if h.startswith("a")}, one_bad),
                  T0 + dt.timedelta(days=1))
    assert done.action == "done" and "1 failed within the halt rule: a-005" in done.reason
    three_bad = one_bad | {"a-006": FAIL, "a-007": FAIL}
    decision = decide(SPEC, 2, T0, fleet((("a", 20),), stage_of, three_bad), T0 + dt.timedelta(days=1))
    assert decision.action == "halt" and "3 of 19 hosts of stage 2 failed" in decision.reason


def test_a_late_failure_in_an_earlier_batch_still_halts() -> None:
    """A host of batch 1 that fails while batch 2 is open counts against batch 1: above the percentage, a halt."""
    stage_of = {"a-000": 0, "a-001": 1, "a-002": 2, "a-003": 2}
    evidence = {h: PASS for h in stage_of} | {"a-001": FAIL}
    decision = decide(SPEC, 2, T0, fleet((("a", 20),), stage_of, evidence), T0 + dt.timedelta(days=1))
    assert decision.action == "halt" and "1 of 1 hosts of stage 1 failed" in decision.reason


def test_done_after_the_last_stage_passed_and_soaked() -> None:
    """When every host is admitted and passed after the last stage's soak, the rollout is done."""
    stage_of = {f"a-{i:03d}": 3 for i in range(4)}
    hosts = fleet((("a", 4),), stage_of, {h: PASS for h in stage_of})
    assert decide(SPEC, 3, T0, hosts, T0 + dt.timedelta(seconds=600)).action == "done"


def test_spec_problems_name_the_field() -> None:
    """A bad spec is refused with one line per field."""
    bad = RolloutSpec(target_serial=7, canaries=0, batches=(25, 5), soak_seconds=-1, halt_percent=100)
    assert [p.split(":")[0] for p in bad.problems()] == ["canaries", "batches", "soak_seconds", "halt_percent"]
    assert SPEC.problems() == []


def test_control_counts_who_was_heard_in_the_window_and_failed_while_not_admitted() -> None:
    """The control is the cohort's hosts while not admitted since its first admission: a silent host, one not heard
    from in the window and the first admitted count nothing; a failed check or event in the window counts, one
    before it does not; an admitted host counts its events from before its admission only."""
    later = T0 + dt.timedelta(minutes=10)
    hosts = [RolloutHost(host_id="canary", cohort="a", stage=0, admitted_at=T0, evidence=PASS),
             RolloutHost(host_id="batch", cohort="a", stage=1, admitted_at=later, evidence=PASS),
             RolloutHost(host_id="batch-late", cohort="a", stage=1, admitted_at=later, evidence=FAIL)]
    hosts += [RolloutHost(host_id=name, cohort="a") for name in ("ok", "failed", "failed-before", "silent", "quiet")]
    hosts += [RolloutHost(host_id="other", cohort="b")]  # a cohort with nobody admitted has no window yet
    seen = T0 + dt.timedelta(minutes=1)
    states = {"ok": state(serial=1, beat=seen), "silent": state(serial=1, beat=seen),
              "failed": state(serial=1, health="failed", beat=seen, last_health_at=seen),
              "failed-before": state(serial=1, health="timeout", beat=seen,
                                     last_health_at=T0 - dt.timedelta(minutes=1)),
              "quiet": state(serial=1, beat=T0 - dt.timedelta(minutes=5)), "other": state(serial=1, beat=seen)}
    failures = {"batch": [("cpu_fallback", T0 + dt.timedelta(minutes=2))],
                "batch-late": [("rollback", later + dt.timedelta(minutes=1))],
                "ok": [("rollback", T0 - dt.timedelta(minutes=1))]}
    counts = control_counts(hosts, states, failures, silent=frozenset({"silent"}))
    # batch (failed before admission), batch-late (failed only after), ok, failed, failed-before
    assert counts == {"a": (2, 5)}


def cohort_of_size(size: int, admitted: int, failed: int) -> List[RolloutHost]:
    return [RolloutHost(host_id=f"h{i:03d}", cohort="a", stage=0 if i < admitted else None,
                        admitted_at=T0 if i < admitted else None,
                        evidence=(FAIL if i < failed else PASS) if i < admitted else None) for i in range(size)]


def test_control_tolerates_a_failing_canary_the_absolute_rule_halts_on() -> None:
    """One of 25 canaries failing against a 2 % control waits under the control; ``judge = absolute`` halts."""
    hosts = cohort_of_size(500, admitted=25, failed=1)
    spec = SPEC.model_copy(update={"canaries": 25})
    control = {"a": (10, 475)}
    step = decide(spec, 0, T0, hosts, T0 + dt.timedelta(seconds=1), control=control)
    assert step.action == "wait" and "admitted 1/25 (4.0%) failed vs control 10/475 (2.1%)" in step.reason
    absolute = decide(spec.model_copy(update={"judge": "absolute"}), 0, T0, hosts, T0, control=control)
    assert absolute.action == "halt" and absolute.reason.startswith("1 of 25 canaries failed")


@pytest.mark.parametrize("admitted, control", [(19, (0, 400)), (25, (0, 19))])
def test_a_cohort_too_small_to_test_is_judged_by_the_absolute_rule(admitted: int, control: Tuple[int, int]) -> None:
    """Under JUDGE_MIN_SAMPLE hosts in either group, a failing canary halts as before, and the reason says so."""
    hosts = cohort_of_size(420, admitted=admitted, failed=1)
    step = decide(SPEC.model_copy(update={"canaries": admitted}), 0, T0, hosts, T0, control={"a": control})
    assert step.action == "halt" and step.reason.startswith(f"1 of {admitted} canaries failed")
    assert [j.p_value for j in step.judgements] == [None]


def test_busy_hosts_count_as_not_failed_and_overdue_hosts_as_failed() -> None:
    """An admitted host still waiting (busy) is in the admitted group without a failure; an overdue one (its
    evidence a failure) is a failure: 20 overdue of 25 halts against a healthy control."""
    busy = [h.model_copy(update={"evidence": WAIT}) for h in cohort_of_size(500, admitted=25, failed=0)]
    waiting = decide(SPEC.model_copy(update={"canaries": 25}), 0, T0, busy, T0, control={"a": (5, 475)})
    assert waiting.action == "wait" and "admitted 0/25 (0.0%) failed" in waiting.reason
    overdue = Evidence(result="fail", detail="overdue: no pass within 600s of admission (health busy)")
    late = [h.model_copy(update={"evidence": overdue}) if i < 20 else h for i, h in enumerate(busy)]
    step = decide(SPEC.model_copy(update={"canaries": 25}), 0, T0, late, T0, control={"a": (5, 475)})
    assert step.action == "halt" and "admitted 20/25 (80.0%) failed vs control 5/475 (1.1%)" in step.reason
