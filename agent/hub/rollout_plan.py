"""Staged rollouts of a policy bundle (issue #33), the pure part: cohorts, each host's evidence, and the next stage
decision. No I/O here: ``agent/hub/rollouts.py`` reads the rows, calls ``decide`` inside a transaction that holds
the rollout's row lock, and writes what it says.

A rollout takes the hosts in its target bundle's scope (narrowed by an optional label selector) and groups them in
cohorts: GPU model, OS release, kernel series and the current pairing, so a change that breaks one kind of host
shows on a canary of that kind first. Stage 0 admits ``canaries`` hosts of every cohort; stage i >= 1 admits, per
cohort, hosts up to ``batches[i-1]`` percent of the cohort (cumulative, rounded up; the last batch is 100). The
next stage opens only when every admitted host passed (or failed within the halt rule's tolerance) and
``soak_seconds`` have elapsed since the current stage opened. The halt rule: any canary failing, or more than
``halt_percent`` of a batch's hosts failing. A host still waiting ``report_deadline_seconds`` after its admission
(powered off, agent dead, cut off, never taking the change, busy for days) fails (``overdue``), so a silent host halts
the rollout with an alert naming it instead of holding its stage open forever.

"After admission" is always on the hub's clock (issue 43): a heartbeat or failure event counts from when the hub
received it, and a check's time is the heartbeat's receipt less how long before the heartbeat the agent says the
check finished, so an agent's clock a day ahead or ten minutes behind neither hides a failure nor lets an old check
pass. A check dated after the heartbeat that carries it (the host's clock was ahead then and was set back since)
cannot be placed and does not pass.

A host's evidence (``host_evidence``): it passes when its heartbeat after admission names the target serial in
force, its last health status is ``pass`` (from a check that finished after admission and followed a change, when
the agent sends ``last_health_at`` / ``last_health_after_change``; older agents do not, and then the heartbeat's
receipt stands for the check's), and no rollback / cpu_fallback / health_regression / health_failed event arrived
since admission;
it fails on such an event, or on a status of regression, cpu_fallback, failed or timeout on the
target serial; anything else (busy, deferred, skipped, not on the target yet, no heartbeat since) is waiting. A check
the agent cannot place (``last_health_at`` sent without ``last_health_after_change``: a result read back after an
agent restart) does not pass. A pass stands (``previous``) until failing evidence arrives: a later periodic check,
which is not a post-change check, or an agent restart does not take it back.

The host's gating workloads (issue 44, ``gating``: their verdicts in that same check, from the verified-stack
matrix) are part of its evidence: a gating workload that failed there fails the host as a failed health status
does (the detail names the workload, its status and the stack), and a pass names the gating workloads that passed.
"""

from __future__ import annotations

import datetime as dt
import math
import re
from itertools import islice
from operator import attrgetter
from typing import AbstractSet, Collection, Dict, Iterable, List, Literal, Mapping, Optional, Sequence, Tuple, Union

from agent.bundle.scope import pairing_text
from agent.hub.judge import CohortJudgement, judge_cohort, summary, testable
from agent.hub.rows import ControlRow, HostRow
from agent.hub.workload_stacks import GatingVerdict
from agent.models import FrozenModel
from agent.wire import (
    FAILED_HEALTH_STATUSES,
    MAX_STORED_INT,
    OFFER_ROLLOUT_STATES,
    ROLLOUT_HEADER,
    ROLLOUT_ID_HEADER,
    ROLLOUT_STAGE_HEADER,
    ROLLOUT_STATE_HEADER,
)

RolloutState = Literal["running", "paused", "halted", "aborted", "done"]
ROLLOUT_STATES = ("running", "paused", "halted", "aborted", "done")
# the target is offered only to admitted hosts; the states an offer names (agent/wire.py)
ACTIVE_STATES = OFFER_ROLLOUT_STATES
FAILURE_EVENT_KINDS = ("rollback", "cpu_fallback", "health_regression", "health_failed")


# The bounds of a spec's numbers beyond their own rules: what the store and the clock arithmetic can hold.
MAX_WAIT_SECONDS = 10 * 365 * 86400
MAX_CANARIES = 100_000


class RolloutSpec(FrozenModel):
    """What an operator asks for: the target, canaries per cohort, cumulative batch percentages, soak, halt rule."""

    target_serial: int
    canaries: int = 1
    batches: Tuple[int, ...] = (5, 25, 100)
    soak_seconds: int = 600
    halt_percent: float = 0.0  # more than this percentage of a batch failing halts (0: any failure halts)
    # how failures are judged: "control" compares every cohort's admitted hosts with its hosts not admitted
    # (agent/hub/judge.py; a cohort too small to test falls back to the absolute rule), "absolute" is the rule
    # alone for every cohort (any failing canary, more than halt_percent of a batch): for small fleets
    judge: Literal["control", "absolute"] = "control"
    # a host admitted this long ago that has not passed fails (0: wait for it forever); two days by default, so a
    # change taken by a daily unattended-upgrades run is not counted as overdue
    report_deadline_seconds: int = 172800
    labels: Dict[str, str] = {}  # narrows the hosts taken (all must be equal)
    # A bundle pushed staged above the target that carries the previous policy, signed in advance (the hub holds
    # no signing key): abort releases it to its whole scope, so admitted hosts go back and their guard rolls the
    # packages back; done withdraws it. None: abort only withdraws the target.
    revert_serial: Optional[int] = None

    def problems(self) -> List[str]:
        """What is wrong with the spec, one line each (empty: fine)."""
        found = []
        for name in ("target_serial", "revert_serial"):
            serial = getattr(self, name)
            if serial is not None and not 1 <= serial <= MAX_STORED_INT:
                found.append(f"{name}: must be a serial in 1..{MAX_STORED_INT}")
        for name in ("soak_seconds", "report_deadline_seconds"):
            if getattr(self, name) > MAX_WAIT_SECONDS:
                found.append(f"{name}: must be at most {MAX_WAIT_SECONDS} (10 years)")
        if self.canaries > MAX_CANARIES:
            found.append(f"canaries: must be at most {MAX_CANARIES}")
        if self.canaries < 1:
            found.append("canaries: must be at least 1")
        if not self.batches or any(not 0 < b <= 100 for b in self.batches) or list(self.batches) != sorted(
                set(self.batches)) or self.batches[-1] != 100:
            found.append("batches: increasing percentages in 1..100 ending with 100, e.g. 5,25,100")
        if self.soak_seconds < 0:
            found.append("soak_seconds: must be 0 or more")
        if not 0 <= self.halt_percent < 100:
            found.append("halt_percent: must be in 0..100 (exclusive)")
        if self.report_deadline_seconds < 0:
            found.append("report_deadline_seconds: must be 0 (no deadline) or more")
        if self.revert_serial is not None and self.revert_serial <= self.target_serial:
            found.append("revert_serial: must be above target_serial (an agent never installs a lower serial)")
        return found


class Evidence(FrozenModel):
    """One admitted host's standing: pass, fail or wait, and the one-line why."""

    result: Literal["pass", "fail", "wait"]
    detail: str


class RolloutHost(FrozenModel):
    """One host of a rollout: its cohort, and when it was admitted (stage None: not yet) and its evidence."""

    host_id: str
    cohort: str
    stage: Optional[int] = None
    admitted_at: Optional[dt.datetime] = None
    evidence: Optional[Evidence] = None


class StageStep(FrozenModel):
    """What to do now: admit hosts into ``stage``, halt (``reason`` names hosts and results), done, or wait; with
    every cohort's judgement against its control (empty under the absolute rule)."""

    action: Literal["admit", "halt", "done", "wait"]
    stage: int
    admit: List[str] = []
    reason: str = ""
    judgements: List[CohortJudgement] = []

    def explained(self) -> str:
        """The judgements in one line (both rates and counts of the closest cohort), empty when none was tested."""
        if not any(j.p_value is not None for j in self.judgements):
            return ""
        return summary(self.judgements)


def kernel_major_minor(kernel: Optional[str]) -> str:
    """``6.8.0-51-generic`` -> ``6.8``; ``?`` when unknown."""
    match = re.match(r"(\d+\.\d+)", kernel or "")
    return match.group(1) if match else "?"


def cohort_of(host: Optional[HostRow]) -> str:
    """The cohort key of a host: GPU model, OS release, kernel series and pairing, from its newest heartbeat."""
    pairing = host.pairing if host else None
    if pairing is None:
        return "unknown"
    os = f"{pairing.os_id or '?'}-{pairing.os_version_id or '?'}"
    return " | ".join((pairing.gpu_models or "no GPU", os, f"kernel {kernel_major_minor(pairing.kernel_running)}",
                       pairing_text(pairing) or "no driver"))


def failures_since(admitted_at: dt.datetime, failure_events: Sequence[Tuple[str, dt.datetime]]) -> List[str]:
    """The kinds of the failure events (kind, received_at: the hub's clock) the hub received at or after the host's
    admission, sorted; the agent's own time of an event decides nothing (issue 43)."""
    return sorted(kind for kind, received_at in failure_events if received_at >= admitted_at)


def heartbeat_since(admitted_at: dt.datetime, host: Optional[HostRow]) -> bool:
    """The hub received the host's newest heartbeat after its admission (on the hub's clock; one received in the
    same instant was sent before the host could know)."""
    return host is not None and host.heartbeat_received_at is not None and host.heartbeat_received_at > admitted_at


def checked_before(admitted_at: dt.datetime, host: HostRow) -> bool:
    """The host's last health check finished before its admission, on the hub's clock (the heartbeat's receipt
    less how long before it the check finished, both read on the agent's clock: any skew cancels out)."""
    checked = host.health_checked_on_hub_clock()
    return checked is not None and checked < admitted_at


def host_evidence(target_serial: int, admitted_at: dt.datetime, host: Optional[HostRow],
                  failure_events: Sequence[Tuple[str, dt.datetime]],
                  previous: Optional[Evidence] = None, gating: Sequence[GatingVerdict] = ()) -> Evidence:
    """An admitted host's evidence from its state, the failure events (kind, received_at) it sent and its gating
    workloads' verdicts, given the evidence it had (a pass stands until failing evidence arrives); pure. Every
    "after admission" is on the hub's clock (``failures_since``, ``heartbeat_since``, ``checked_before``)."""
    failures = failures_since(admitted_at, failure_events)
    if failures:
        return Evidence(result="fail", detail=f"{failures[0]} reported after admission")
    now = _evidence_now(target_serial, admitted_at, host, gating)
    if now.result == "wait" and previous is not None and previous.result == "pass":
        return previous
    return now


def _evidence_now(target_serial: int, admitted_at: dt.datetime, host: Optional[HostRow],
                  gating: Sequence[GatingVerdict] = ()) -> Evidence:
    """What the host's newest heartbeat says on its own, with its gating workloads of the same check."""
    if host is None or not heartbeat_since(admitted_at, host):
        return Evidence(result="wait", detail="no heartbeat since admission")
    if host.policy_serial != target_serial:
        return Evidence(result="wait", detail=f"serial {host.policy_serial} in force, not {target_serial} yet")
    status = host.last_health_status
    same_check = [g for g in gating if host.last_health_at is not None and g.checked_at == host.last_health_at]
    failed_workloads = [g for g in same_check if g.status in FAILED_HEALTH_STATUSES]
    failing = status in FAILED_HEALTH_STATUSES or bool(failed_workloads)
    if host.last_health_at is not None and host.heartbeat_at is not None and host.last_health_at > host.heartbeat_at:
        return Evidence(result="wait", detail=f"last health check ({status or 'none'}) is dated after the heartbeat "
                                              "that carries it (the host's clock moved back): not known to follow "
                                              "admission")
    if checked_before(admitted_at, host):
        return Evidence(result="wait", detail=f"last health check ({status or 'none'}) finished before admission")
    if host.last_health_after_change is False and not failing:
        return Evidence(result="wait", detail=f"health {status or 'not reported'}, not yet a post-change check")
    if host.last_health_at is not None and host.last_health_after_change is None and not failing:
        return Evidence(result="wait", detail=f"health {status or 'not reported'} read back after an agent "
                                              "restart, not known to be a post-change check")
    if failed_workloads:
        named = "; ".join(f"{g.workload} {g.status} on {g.stack}" for g in failed_workloads[:3])
        return Evidence(result="fail", detail=f"gating workload {named} (health {status}, serial {target_serial})")
    if status in FAILED_HEALTH_STATUSES:
        return Evidence(result="fail", detail=f"health {status} on serial {target_serial}")
    if status == "pass":
        passed = [g.workload for g in same_check if g.status == "pass"]
        return Evidence(result="pass", detail=f"health pass on serial {target_serial}"
                        + (f", gating workloads passed: {', '.join(passed)}" if passed else ""))
    return Evidence(result="wait", detail=f"health {status or 'not reported'}")


def overdue(evidence: Evidence, admitted_at: dt.datetime, now: dt.datetime, spec: RolloutSpec) -> Evidence:
    """A waiting host's evidence turned into a failure once ``report_deadline_seconds`` passed since admission."""
    if evidence.result != "wait" or not spec.report_deadline_seconds or \
            now < admitted_at + dt.timedelta(seconds=spec.report_deadline_seconds):
        return evidence
    return Evidence(result="fail", detail=f"overdue: no pass within {spec.report_deadline_seconds}s of admission "
                                          f"({evidence.detail})")


def stage_quota(stage: int, cohort_size: int, spec: RolloutSpec) -> int:
    """How many hosts of a cohort are admitted once ``stage`` is open (cumulative)."""
    if stage == 0:
        return min(spec.canaries, cohort_size)
    percent = spec.batches[min(stage, len(spec.batches)) - 1]
    return max(min(spec.canaries, cohort_size), math.ceil(cohort_size * percent / 100))


def last_stage(spec: RolloutSpec) -> int:
    return len(spec.batches)


def _named(hosts: Sequence[RolloutHost]) -> str:
    return ", ".join(f"{h.host_id} ({h.evidence.detail if h.evidence else '?'})" for h in hosts[:10]) + (
        f" and {len(hosts) - 10} more" if len(hosts) > 10 else "")


def control_failure(window_start: dt.datetime, admitted_at: Optional[dt.datetime],
                    host: Union[HostRow, ControlRow, None],
                    failure_events: Sequence[Tuple[str, dt.datetime]]) -> Optional[str]:
    """Whether a host failed while it was part of its cohort's control: from ``window_start`` (the cohort's first
    admission) until its own admission (None: not admitted, until now), by a failure event (kind, received_at: the
    hub's clock), or, for a host not admitted, by its newest heartbeat's failed health status from a check that
    finished in the window on the hub's clock (``health_checked_on_hub_clock``; else the heartbeat's receipt). An
    admitted host's heartbeats before its admission are not kept: only its events count. The failure's kind, or
    None; the agent's own clock decides nothing (issue 43)."""
    for kind, at in failure_events:
        if at >= window_start and (admitted_at is None or at < admitted_at):
            return kind
    if admitted_at is None and host is not None and host.last_health_status in FAILED_HEALTH_STATUSES:
        checked_at = host.health_checked_on_hub_clock() or host.heartbeat_received_at
        if checked_at is not None and checked_at >= window_start:
            return host.last_health_status
    return None


def control_contribution(start: Optional[dt.datetime], host: RolloutHost,
                         state: Union[HostRow, ControlRow, None], failure_events: Sequence[Tuple[str, dt.datetime]],
                         silent: bool) -> Optional[bool]:
    """What one host adds to its cohort's control (``control_counts``): None when it does not count, else whether
    it failed while part of the control (``control_failure``). ``start``: its cohort's window start (None: nothing
    admitted in the cohort yet)."""
    if start is None:
        return None
    admitted_at = host.admitted_at
    if admitted_at is None:
        if state is None or state.last_seen_at < start or silent:
            return None  # no word from it in the window: nothing to count
    elif admitted_at <= start:
        return None  # admitted when the window opened: never part of the control
    if failure_events or (admitted_at is None and state is not None
                          and state.last_health_status in FAILED_HEALTH_STATUSES):
        return control_failure(start, admitted_at, state, failure_events) is not None
    return False


def window_starts(hosts: Iterable[RolloutHost]) -> Dict[str, dt.datetime]:
    """Per cohort with an admitted host, when its control window opened: its first admission."""
    starts: Dict[str, dt.datetime] = {}
    for h in hosts:
        at = h.admitted_at
        if at is not None and (h.cohort not in starts or at < starts[h.cohort]):
            starts[h.cohort] = at
    return starts


class ControlTally:
    """Every cohort's control (failed, hosts), kept host by host (``put``: a host's state, failure events or silence
    changed), so an evaluation that read k hosts again updates k contributions instead of walking the fleet."""

    def __init__(self, starts: Mapping[str, dt.datetime]) -> None:
        self.starts = dict(starts)
        self._counted: Dict[str, Tuple[str, bool]] = {}  # host_id -> (cohort, failed) of the hosts that count
        self._counts: Dict[str, List[int]] = {cohort: [0, 0] for cohort in starts}  # failed, hosts

    def put(self, host: RolloutHost, state: Union[HostRow, ControlRow, None],
            failure_events: Sequence[Tuple[str, dt.datetime]], silent: bool) -> None:
        """Count ``host`` as it is now (its earlier contribution taken back)."""
        old = self._counted.pop(host.host_id, None)
        if old is not None:
            tally = self._counts[old[0]]
            tally[0] -= old[1]
            tally[1] -= 1
        failed = control_contribution(self.starts.get(host.cohort), host, state, failure_events, silent)
        if failed is not None:
            self._counted[host.host_id] = (host.cohort, failed)
            tally = self._counts[host.cohort]
            tally[0] += failed
            tally[1] += 1

    def counts(self) -> Dict[str, Tuple[int, int]]:
        """Per cohort with an admitted host, its control as (failed, hosts)."""
        return {cohort: (failed, total) for cohort, (failed, total) in self._counts.items()}


def control_counts(hosts: Sequence[RolloutHost], states: Mapping[str, Union[HostRow, ControlRow]],
                   failures: Mapping[str, Sequence[Tuple[str, dt.datetime]]],
                   silent: AbstractSet[str] = frozenset()) -> Dict[str, Tuple[int, int]]:
    """Per cohort with an admitted host, its control as (failed, hosts): every host of the cohort for the part of
    the window (since the cohort's first admission) it spent not admitted. A host not admitted counts when the hub
    heard from it in the window (``states``: its row) and it is not ``silent``; an admitted host counts for the time
    before its admission (none for the first admitted). ``failures``: each host's failure events (kind, time)."""
    tally = ControlTally(window_starts(hosts))
    for h in hosts:
        tally.put(h, states.get(h.host_id), failures.get(h.host_id, ()), h.host_id in silent)
    return tally.counts()


class Tally:
    """The counts ``decide`` reads, kept host by host (``add``, and ``add(..., -1)`` to take a host back), so an
    evaluation that judged k hosts again costs k updates instead of a walk over the fleet: per (cohort, stage) of
    the admitted hosts their number, passes, waits and failures, the failed admitted hosts themselves (few: they
    name a halt), and how many hosts there are."""

    def __init__(self, hosts: Iterable[RolloutHost] = ()) -> None:
        self.cells: Dict[Tuple[str, int], List[int]] = {}  # (cohort, stage) -> [hosts, passed, waiting, failed]
        self.failed: Dict[str, RolloutHost] = {}
        self.hosts = 0
        for h in hosts:
            self.add(h)

    def add(self, host: RolloutHost, sign: int = 1) -> None:
        self.hosts += sign
        if host.stage is None:
            return
        cell = self.cells.setdefault((host.cohort, host.stage), [0, 0, 0, 0])
        cell[0] += sign
        result = host.evidence.result if host.evidence is not None else "wait"
        cell[{"pass": 1, "wait": 2, "fail": 3}[result]] += sign
        if result == "fail":
            if sign > 0:
                self.failed[host.host_id] = host
            else:
                del self.failed[host.host_id]

    def admitted(self) -> int:
        return sum(cell[0] for cell in self.cells.values())

    def waiting(self) -> int:
        """Admitted hosts with no evidence yet or waiting."""
        return sum(cell[2] for cell in self.cells.values())

    def by_cohort(self) -> Dict[str, Tuple[int, int]]:
        """Per cohort with admitted hosts: (failed, admitted)."""
        found: Dict[str, Tuple[int, int]] = {}
        for (cohort, _), cell in self.cells.items():
            if cell[0]:
                failed, total = found.get(cohort, (0, 0))
                found[cohort] = (failed + cell[3], total + cell[0])
        return found

    def in_stage(self, stage: int, leaving: AbstractSet[str] = frozenset()) -> int:
        """Admitted hosts of ``stage``, of cohorts not in ``leaving``."""
        return sum(cell[0] for (cohort, at), cell in self.cells.items() if at == stage and cohort not in leaving)

    def passed_in_stage(self, stage: int) -> int:
        return sum(cell[1] for (_, at), cell in self.cells.items() if at == stage)

    def failed_hosts(self) -> List[RolloutHost]:
        """The failed admitted hosts, by host id."""
        return [self.failed[host_id] for host_id in sorted(self.failed)]


def judge_cohorts(tally: Tally, control: Mapping[str, Tuple[int, int]]) -> List[CohortJudgement]:
    """Every cohort with admitted hosts judged against its control (``control_counts``), by cohort name."""
    admitted = tally.by_cohort()
    tested = sum(testable(total, control.get(cohort, (0, 0))[1]) for cohort, (_, total) in admitted.items())
    return [judge_cohort(cohort, failed, total, *control.get(cohort, (0, 0)), tested_cohorts=tested)
            for cohort, (failed, total) in sorted(admitted.items())]


def decide(spec: RolloutSpec, stage: int, stage_started_at: Optional[dt.datetime], hosts: Collection[RolloutHost],
           now: dt.datetime, silent: AbstractSet[str] = frozenset(),
           control: Optional[Mapping[str, Tuple[int, int]]] = None, tally: Optional[Tally] = None) -> StageStep:
    """The next step of a running rollout at ``now``; ``stage`` is the open stage (-1: none opened yet); ``silent``
    the hosts not heard from lately, which are not admitted (they would never report) until they are back;
    ``control`` each cohort's control (failed, hosts) from ``control_counts`` (None: no control, every cohort is
    judged by the absolute rule); ``tally`` the counts of ``hosts`` when the caller keeps them (None: counted here),
    so only admitting walks ``hosts``; pure."""
    if stage < 0:
        return StageStep(action="admit", stage=0, admit=_to_admit(spec, 0, hosts, silent))
    tally = Tally(hosts) if tally is None else tally
    judgements = judge_cohorts(tally, control or {}) if spec.judge == "control" else []
    worse = [j for j in judgements if j.worse]
    failed = tally.failed_hosts()
    if worse:
        worse_cohorts = {j.cohort for j in worse}
        failing = [h for h in failed if h.cohort in worse_cohorts]
        return StageStep(action="halt", stage=stage, judgements=judgements,
                         reason=f"{'; '.join(j.line() for j in worse[:3])}"
                                + (f" (and {len(worse) - 3} more cohorts)" if len(worse) > 3 else "")
                                + f": {_named(failing)}")
    tested = {j.cohort for j in judgements if j.p_value is not None}  # judged against their control
    canaries = tally.in_stage(0, tested)  # the rest judged by the rule alone: no control to compare with
    failed_canaries = [h for h in failed if h.stage == 0 and h.cohort not in tested]
    if failed_canaries:
        return StageStep(action="halt", stage=stage, judgements=judgements,
                         reason=f"{len(failed_canaries)} of {canaries} canaries failed: "
                                f"{_named(failed_canaries)}")
    for batch_stage in range(1, stage + 1):  # a host of an earlier batch failing later counts against its batch
        batch = tally.in_stage(batch_stage, tested)
        failed_batch = [h for h in failed if h.stage == batch_stage and h.cohort not in tested]
        if batch and failed_batch and 100.0 * len(failed_batch) / batch > spec.halt_percent:
            return StageStep(action="halt", stage=stage, judgements=judgements,
                             reason=f"{len(failed_batch)} of {batch} hosts of stage {batch_stage} failed (more "
                                    f"than {spec.halt_percent:g}%): {_named(failed_batch)}")
    admitted = tally.admitted()
    explained = StageStep(action="wait", stage=stage, judgements=judgements).explained()
    # failures the judgement tolerates (not worse than the control, or at or under halt_percent of their batch) do
    # not hold the rollout back
    if tally.waiting() or (
            stage_started_at is not None and now < stage_started_at + dt.timedelta(seconds=spec.soak_seconds)):
        return StageStep(action="wait", stage=stage, judgements=judgements,
                         reason=waiting_line(spec, stage, stage_started_at, tally.passed_in_stage(stage),
                                             tally.in_stage(stage))
                         + (f"; {explained}" if explained else ""))
    following = stage + 1
    while following <= last_stage(spec) and admitted < tally.hosts:
        chosen = _to_admit(spec, following, hosts, silent)
        if chosen:  # a stage that would admit nobody (its quota is already met) is skipped, and so is its soak
            return StageStep(action="admit", stage=following, admit=chosen, judgements=judgements)
        following += 1
    return StageStep(action="done", stage=stage, judgements=judgements,
                     reason=f"{admitted} hosts admitted, {admitted - len(failed)} passed"
                            + (f", {len(failed)} failed within the halt rule: {_named(failed)}"
                               if failed else "")
                            + (f", {tally.hosts - admitted} silent hosts never admitted"
                               if admitted < tally.hosts else "")
                            + (f"; {explained}" if explained else ""))


def _to_admit(spec: RolloutSpec, stage: int, hosts: Collection[RolloutHost],
              silent: AbstractSet[str] = frozenset()) -> List[str]:
    """Per cohort, the hosts (by host id, none of ``silent``) that fill the cohort up to the stage's quota."""
    cohorts: Dict[str, List[RolloutHost]] = {}
    admitted: Dict[str, int] = {}
    for h in sorted(hosts, key=attrgetter("host_id")):  # already in order from the store: a linear pass
        if h.stage is None:
            cohorts.setdefault(h.cohort, []).append(h)
        admitted[h.cohort] = admitted.get(h.cohort, 0) + (h.stage is not None)
    chosen: List[str] = []
    for cohort, waiting in cohorts.items():
        quota = stage_quota(stage, len(waiting) + admitted[cohort], spec) - admitted[cohort]
        chosen += islice((h.host_id for h in waiting if h.host_id not in silent), max(quota, 0))
    return sorted(chosen)


def waiting_line(spec: RolloutSpec, stage: int, stage_started_at: Optional[dt.datetime], passed: int,
                 in_stage: int) -> str:
    """``waiting for stage 2 (3/3 canaries passed, soak ends 14:20)``: why the next stage is not open yet, from how
    many of the stage's ``in_stage`` hosts ``passed``."""
    what = "canaries" if stage == 0 else f"stage {stage} hosts"
    soak = ""
    if stage_started_at is not None:
        ends = stage_started_at + dt.timedelta(seconds=spec.soak_seconds)
        # a soak of half a day or more names the day too: "14:20" alone would be read as today's
        soak = f", soak ends {ends:%Y-%m-%d %H:%M} UTC" if spec.soak_seconds >= 43200 else \
            f", soak ends {ends:%H:%M} UTC"
    return f"waiting for stage {stage + 1} ({passed}/{in_stage} {what} passed{soak})"


def counts_by_stage(hosts: Sequence[RolloutHost]) -> Mapping[str, int]:
    """Hosts per stage ("0", "1", ...) and ``waiting`` (not admitted)."""
    counts: Dict[str, int] = {}
    for h in hosts:
        key = "waiting" if h.stage is None else str(h.stage)
        counts[key] = counts.get(key, 0) + 1
    return counts


class RolloutRow(FrozenModel):
    """One rollout as stored."""

    rollout_id: str
    target_serial: int
    previous_serial: Optional[int] = None
    spec: RolloutSpec
    state: str
    stage: int  # the open stage; -1 before the canaries
    stage_started_at: Optional[dt.datetime] = None
    created_at: dt.datetime
    created_by: str
    updated_at: dt.datetime
    reason: str  # why it waits, halted, was paused or aborted (text for people: nothing decides on it)
    paused_by: Optional[str] = None  # who paused it, while it is paused (a typed column, never read from reason)


class RolloutStatus(FrozenModel):
    """A rollout with its hosts: what ``status`` answers."""

    rollout: RolloutRow
    hosts_by_stage: Dict[str, int]
    hosts: List[RolloutHost]


class HostOffer(FrozenModel):
    """What a host is offered while rollouts exist: the serial (None: none) and the notice it may show."""

    serial: Optional[int] = None
    notice: Optional[str] = None  # display text only
    # The typed fields the agent decides on (agent/wire.py): the active rollout, its state, and the stage that
    # admitted this host (None: held back). None, None, None: no active rollout.
    rollout_id: Optional[str] = None
    state: Optional[str] = None
    admitted_stage: Optional[int] = None

    def headers(self) -> Dict[str, str]:
        """The offer's rollout as the ``X-Gpuguard-Rollout*`` headers of every answer (200, 204, 304); none when
        no rollout is active."""
        found: Dict[str, str] = {}
        if self.notice:
            found[ROLLOUT_HEADER] = self.notice
        if self.rollout_id is not None and self.state is not None:
            found[ROLLOUT_ID_HEADER] = self.rollout_id
            found[ROLLOUT_STATE_HEADER] = self.state
            if self.admitted_stage is not None:
                found[ROLLOUT_STAGE_HEADER] = str(self.admitted_stage)
        return found


class RolloutsResponse(FrozenModel):
    count: int
    rollouts: List[RolloutRow]
