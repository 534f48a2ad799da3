"""The verified-stack matrix (issue 44): per registered workload, the stacks it passed and failed on, from every
host's heartbeats (``Heartbeat.workloads``).

    workload_stacks  one row per (workload, stack_id, host_id) (schema version 6): the stack's parts, whether the
                     workload gates, its last verdict there and when that check finished, and how many checks passed
                     and failed there (with the time of the last of each)

A heartbeat repeats the last check's verdicts until the next check, so a check counts once, by when it finished
(the heartbeat's ``last_health_at``, text time): a row moves only forward in that time, and a heartbeat without it
(an agent that does not know) counts nothing. Only ``pass`` verifies a stack; the failed statuses of
``agent.wire.FAILED_HEALTH_STATUSES`` count as failures; busy and deferred (the figures not judged) count neither.

``stack_runs`` (pure) turns a set of events into the rows' updates, ``UPSERT`` folds them in at the same group
commit as the events; ``matrix`` reads the table back for people, ``verified_listing`` for the hosts (what
``GET /v1/workloads/verified`` answers and a host caches for its ``[workloads]`` rule: agent/hostfacts/
verified_stacks.py parses it).
"""

from __future__ import annotations

import datetime as dt
from typing import Any, Dict, List, NamedTuple, Optional, Protocol, Sequence, Tuple

from agent.hub.dialects import text_time
from agent.hub.rows import utc
from agent.models import FrozenModel
from agent.report.events import Event, WorkloadStackReport
from agent.wire import FAILED_HEALTH_STATUSES, MAX_VERIFIED_STACKS, MAX_VERIFIED_WORKLOADS, VERIFIED_FORMAT


def table(timestamp_type: str) -> str:
    """CREATE TABLE IF NOT EXISTS workload_stacks (its times are text in either database: ``text_time``)."""
    del timestamp_type  # the check times are text, as hosts.last_health_at: compared as strings, ordered
    return """CREATE TABLE IF NOT EXISTS workload_stacks (
            workload TEXT NOT NULL,
            stack_id TEXT NOT NULL,
            host_id TEXT NOT NULL,
            gpu_models TEXT,
            driver TEXT,
            gpu_stack TEXT,
            framework TEXT,
            image TEXT,
            gates BOOLEAN NOT NULL,
            last_status TEXT NOT NULL,
            last_checked_at TEXT NOT NULL,
            passes BIGINT NOT NULL,
            failures BIGINT NOT NULL,
            last_pass_at TEXT,
            last_failure_at TEXT,
            PRIMARY KEY (workload, stack_id, host_id))"""


class StackRun(NamedTuple):
    """One host's verdict of one workload on one stack in one check: a row's update."""

    workload: str
    stack_id: str
    host_id: str
    gpu_models: Optional[str]
    driver: Optional[str]
    gpu_stack: Optional[str]
    framework: Optional[str]
    image: Optional[str]
    gates: bool
    status: str
    checked_at: str  # text_time of when the check finished

    @property
    def passed(self) -> int:
        return 1 if self.status == "pass" else 0

    @property
    def failed(self) -> int:
        return 1 if self.status in FAILED_HEALTH_STATUSES else 0


def stack_runs(events: Sequence[Event]) -> List[StackRun]:
    """The workload verdicts of every heartbeat among ``events`` that says when its check finished, oldest check
    first (so that each check of a group counts), repeats of a check left to the upsert."""
    runs: Dict[Tuple[str, str, str, str], StackRun] = {}
    for event in events:
        payload = event.payload
        if payload.kind != "heartbeat" or not payload.workloads or payload.last_health_at is None:
            continue
        checked_at = text_time(utc(payload.last_health_at))
        for w in payload.workloads:
            if w.stack_id is None:
                continue
            stack = w.stack or WorkloadStackReport()
            run = StackRun(workload=w.name, stack_id=w.stack_id, host_id=event.host_id, gpu_models=stack.gpu_models,
                           driver=stack.driver, gpu_stack=stack.gpu_stack, framework=stack.framework,
                           image=stack.image, gates=w.gates, status=w.status, checked_at=checked_at)
            runs[(run.workload, run.stack_id, run.host_id, checked_at)] = run
    return sorted(runs.values(), key=lambda r: (r.checked_at, r.host_id, r.workload, r.stack_id))


_NEWER = "excluded.last_checked_at > workload_stacks.last_checked_at"


def _pick(column: str) -> str:
    return f"{column} = CASE WHEN {_NEWER} THEN excluded.{column} ELSE workload_stacks.{column} END"


def _count(column: str) -> str:
    return f"{column} = workload_stacks.{column} + CASE WHEN {_NEWER} THEN excluded.{column} ELSE 0 END"


def _last(column: str, counter: str) -> str:
    return (f"{column} = CASE WHEN {_NEWER} AND excluded.{counter} > 0 THEN excluded.{column} "
            f"ELSE workload_stacks.{column} END")


UPSERT = f"""
INSERT INTO workload_stacks (workload, stack_id, host_id, gpu_models, driver, gpu_stack, framework, image, gates,
                             last_status, last_checked_at, passes, failures, last_pass_at, last_failure_at)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
ON CONFLICT (workload, stack_id, host_id) DO UPDATE SET
    {_count("passes")},
    {_count("failures")},
    {_last("last_pass_at", "passes")},
    {_last("last_failure_at", "failures")},
    {_pick("gates")},
    {_pick("last_status")},
    {_pick("last_checked_at")}
"""


def params(run: StackRun) -> List[Any]:
    """The parameters of ``UPSERT`` for one run."""
    return [run.workload, run.stack_id, run.host_id, run.gpu_models, run.driver, run.gpu_stack, run.framework,
            run.image, run.gates, run.status, run.checked_at, run.passed, run.failed,
            run.checked_at if run.passed else None, run.checked_at if run.failed else None]


class StackCell(FrozenModel):
    """One workload on one stack across the fleet: how many hosts and checks passed and failed there."""

    workload: str
    stack_id: str
    stack: WorkloadStackReport
    gates: bool  # gating on at least one host
    hosts_passed: int
    hosts_failed: int
    passes: int
    failures: int
    last_checked_at: dt.datetime
    last_pass_at: Optional[dt.datetime] = None
    last_failure_at: Optional[dt.datetime] = None

    @property
    def verified(self) -> bool:
        """Passed on at least one host."""
        return self.passes > 0


class Reads(Protocol):
    """What the matrix needs of the store (``SqlStore.query``)."""

    def query(self, operation: str, sql: str, params: Sequence[Any] = ()) -> List[Tuple[Any, ...]]: ...


MATRIX_SQL = """
SELECT workload, stack_id, MAX(gpu_models), MAX(driver), MAX(gpu_stack), MAX(framework), MAX(image),
       MAX(CASE WHEN gates THEN 1 ELSE 0 END), SUM(CASE WHEN passes > 0 THEN 1 ELSE 0 END),
       SUM(CASE WHEN failures > 0 THEN 1 ELSE 0 END), SUM(passes), SUM(failures), MAX(last_checked_at),
       MAX(last_pass_at), MAX(last_failure_at)
FROM workload_stacks GROUP BY workload, stack_id ORDER BY workload, stack_id"""


def _time(value: Optional[str]) -> Optional[dt.datetime]:
    return None if value is None else dt.datetime.fromisoformat(value[:-1]).replace(tzinfo=dt.timezone.utc)


def matrix(store: Reads) -> List[StackCell]:
    """Every workload and stack the fleet reported, by workload and stack id."""
    cells = []
    for row in store.query("workload_stacks", MATRIX_SQL):
        (workload, stack_id, gpu_models, driver, gpu_stack, framework, image, gates, hosts_passed, hosts_failed,
         passes, failures, last_checked, last_pass, last_failure) = row
        checked = _time(last_checked)
        assert checked is not None  # NOT NULL
        cells.append(StackCell(workload=workload, stack_id=stack_id,
                               stack=WorkloadStackReport(gpu_models=gpu_models, driver=driver, gpu_stack=gpu_stack,
                                                         framework=framework, image=image),
                               gates=bool(gates), hosts_passed=int(hosts_passed), hosts_failed=int(hosts_failed),
                               passes=int(passes), failures=int(failures), last_checked_at=checked,
                               last_pass_at=_time(last_pass), last_failure_at=_time(last_failure)))
    return cells


class GatingVerdict(NamedTuple):
    """A host's gating workload in one check, for a rollout's evidence (agent/hub/rollout_plan.py)."""

    workload: str
    status: str
    stack: str  # ``describe`` of its stack
    checked_at: dt.datetime


def gating_verdicts_sql(rollout_hosts_filter: str) -> str:
    """SELECT of each gating workload's last verdict per host (host_id, workload, status, the stack's parts, check
    time), for the hosts ``rollout_hosts_filter`` (a condition on ``r``, the rollout_hosts row) names."""
    return ("SELECT w.host_id, w.workload, w.last_status, w.gpu_models, w.driver, w.gpu_stack, w.framework, w.image, "
            "w.last_checked_at FROM workload_stacks w JOIN rollout_hosts r ON r.host_id = w.host_id "
            f"WHERE w.gates AND {rollout_hosts_filter} ORDER BY w.host_id, w.workload")


def gating_verdict_of(row: Sequence[Any]) -> Tuple[str, GatingVerdict]:
    """(host_id, its verdict) from a row of ``gating_verdicts_sql``."""
    host_id, workload, status, gpu_models, driver, gpu_stack, framework, image, checked = row
    stack = WorkloadStackReport(gpu_models=gpu_models, driver=driver, gpu_stack=gpu_stack, framework=framework,
                                image=image)
    when = _time(checked)
    assert when is not None  # NOT NULL
    return host_id, GatingVerdict(workload, status, describe(stack), when)


class StacksResponse(FrozenModel):
    """GET /v1/workloads/stacks: the verified-stack matrix."""

    workload_count: int
    stack_count: int
    stacks: List[StackCell]


def stacks_response(cells: Sequence[StackCell]) -> StacksResponse:
    return StacksResponse(workload_count=len({c.workload for c in cells}), stack_count=len(cells), stacks=list(cells))


def describe(stack: WorkloadStackReport) -> str:
    """A stack for people: ``driver nvidia 580.159.04, CUDA 13.0, torch 2.9.1 (CUDA 13.0), image ...``."""
    parts = [f"driver {stack.driver or '?'}", stack.gpu_stack or "no ROCm/CUDA", stack.framework or "no framework"]
    if stack.image:
        parts.append(f"image {stack.image}")
    return ", ".join(parts)


VERIFIED_SQL = """
SELECT workload, driver, gpu_stack, MAX(last_pass_at) FROM workload_stacks WHERE passes > 0
GROUP BY workload, driver, gpu_stack ORDER BY workload, MAX(last_pass_at) DESC, driver, gpu_stack"""


class VerifiedEntry(FrozenModel):
    """A stack a workload passed on, as the host's rule matches it."""

    driver: Optional[str] = None
    gpu_stack: Optional[str] = None


class VerifiedListing(FrozenModel):
    """GET /v1/workloads/verified: what a host caches as workloads-verified.json."""

    format: int
    fetched_at: str
    workloads: Dict[str, List[VerifiedEntry]]


def verified_listing(store: Reads, now: dt.datetime) -> VerifiedListing:
    """Per workload, the (driver, ROCm/CUDA) stacks a check of it passed on, newest pass first, at most
    MAX_VERIFIED_WORKLOADS workloads (by name) of MAX_VERIFIED_STACKS stacks: the verified list a host caches."""
    workloads: Dict[str, List[VerifiedEntry]] = {}
    for workload, driver, gpu_stack, _ in store.query("workloads_verified", VERIFIED_SQL):
        if workload not in workloads and len(workloads) >= MAX_VERIFIED_WORKLOADS:
            break
        stacks = workloads.setdefault(workload, [])
        if len(stacks) < MAX_VERIFIED_STACKS:
            stacks.append(VerifiedEntry(driver=driver, gpu_stack=gpu_stack))
    return VerifiedListing(format=VERIFIED_FORMAT, fetched_at=text_time(now), workloads=workloads)
