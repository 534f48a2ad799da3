"""Per-workload baselines keyed by the stack (WorkloadStack): a regression names the workload, the metric, and the
stack it moved from.

The first ``[health] baseline_runs`` passing runs of a workload on one stack establish that stack's baseline; a run
is held against its own stack's established baseline, else against the most recently established other stack's
(the stack before the change). Established baselines never move (a slower stack is what they are there to catch);
the operator clears them with ``gpuguard health baseline reset``. Runs that did not pass never join. The file is
written only under the health-check lock (checklock.py), so two writers never meet.
"""

from __future__ import annotations

import datetime as dt
import json
import statistics
from typing import Dict, List, Optional, Tuple

from pydantic import ValidationError

from agent.errors import InputFileError
from agent.files import read_json_file, write_atomically
from agent.health.model import MetricRegression, WorkloadStack
from agent.health.workload_settings import WorkloadSettings
from agent.models import FrozenModel, first_validation_problem

# Runs kept per stack once established (the median of the first ones is the baseline; later ones are history).
_KEPT_RUNS = 20


class StackRecord(FrozenModel):
    stack: WorkloadStack
    runs: List[Dict[str, float]] = []
    first_seen: dt.datetime
    established_at: Optional[dt.datetime] = None
    baseline: Dict[str, float] = {}


class WorkloadRecord(FrozenModel):
    stacks: Dict[str, StackRecord] = {}


class WorkloadBaselineFile(FrozenModel):
    schema_version: int = 1
    workloads: Dict[str, WorkloadRecord] = {}


def load(path: str) -> WorkloadBaselineFile:
    """The stored baselines; empty when there are none yet; InputFileError naming the file when it is damaged."""
    data = read_json_file(path)
    if data is None:
        return WorkloadBaselineFile()
    try:
        loaded = WorkloadBaselineFile.model_validate(data)
    except ValidationError as exc:
        raise InputFileError(path, f"not a workload baselines file: {first_validation_problem(exc)}") from None
    if loaded.schema_version != 1:
        raise InputFileError(path, f"schema_version {loaded.schema_version} is not 1 (written by a newer gpuguard)")
    return loaded


def save(path: str, data: WorkloadBaselineFile) -> None:
    write_atomically(path, json.dumps(data.model_dump(mode="json"), sort_keys=True, indent=1) + "\n")


def reference(data: WorkloadBaselineFile, name: str, stack_id: str) -> Optional[Tuple[str, StackRecord]]:
    """The baseline a run on ``stack_id`` is held against: its own once established, else the newest other one."""
    record = data.workloads.get(name)
    if record is None:
        return None
    own = record.stacks.get(stack_id)
    if own is not None and own.established_at is not None:
        return stack_id, own
    others = [(sid, r) for sid, r in record.stacks.items() if sid != stack_id and r.established_at is not None]
    if not others:
        return None
    return max(others, key=lambda item: item[1].established_at or item[1].first_seen)


def compare(metrics: Dict[str, float], settings: WorkloadSettings, ref: Tuple[str, StackRecord]
            ) -> List[MetricRegression]:
    """The workload's metric against the reference baseline: worse by more than its noise band is a regression."""
    if settings.metric is None or settings.metric not in metrics:
        return []
    base = ref[1].baseline.get(settings.metric)
    if base is None or base == 0:
        return []
    current = metrics[settings.metric]
    worse = (base - current) / abs(base) if settings.higher_is_better else (current - base) / abs(base)
    if worse <= settings.noise_band_fraction:
        return []
    return [MetricRegression(metric=f"{settings.name}.{settings.metric}", against="baseline", baseline_value=base,
                             current_value=current, drop_fraction=round(worse, 4),
                             threshold_fraction=settings.noise_band_fraction,
                             baseline_fingerprint=f"{ref[1].stack.describe()} ({ref[0]})")]


def record(data: WorkloadBaselineFile, name: str, stack: WorkloadStack, metrics: Dict[str, float],
           now: dt.datetime, runs_needed: int) -> WorkloadBaselineFile:
    """A passing run joins its stack's record; the ``runs_needed``-th establishes the baseline (medians)."""
    workload = data.workloads.get(name, WorkloadRecord())
    sid = stack.id
    current = workload.stacks.get(sid) or StackRecord(stack=stack, first_seen=now)
    runs = [*current.runs, dict(metrics)][-_KEPT_RUNS:]
    update: Dict[str, object] = {"runs": runs}
    if current.established_at is None and len(runs) >= runs_needed:
        keys = set.intersection(*(set(r) for r in runs[:runs_needed])) if runs else set()
        update["baseline"] = {k: statistics.median(r[k] for r in runs[:runs_needed]) for k in sorted(keys)}
        update["established_at"] = now
    stacks = {**workload.stacks, sid: current.model_copy(update=update)}
    return data.model_copy(update={"workloads": {**data.workloads, name: WorkloadRecord(stacks=stacks)}})


def runs_on(data: WorkloadBaselineFile, name: str, stack_id: str) -> int:
    record_ = data.workloads.get(name)
    stack = record_.stacks.get(stack_id) if record_ is not None else None
    return len(stack.runs) if stack is not None else 0


def cleared(data: WorkloadBaselineFile, name: Optional[str] = None) -> WorkloadBaselineFile:
    """Every workload's baselines, or one's, forgotten (``gpuguard health baseline reset``)."""
    if name is None:
        return WorkloadBaselineFile()
    return data.model_copy(update={"workloads": {k: v for k, v in data.workloads.items() if k != name}})
