"""The heartbeat carries the registered workloads' last verdicts with their stacks (issue 44): from the check the
daemon ran, through the health child's result, and from last.json after a restart."""

from __future__ import annotations

import datetime as dt
import json
import types
from pathlib import Path
from typing import Any, List, Optional

from agent.daemon_jobs.health import HealthJob
from agent.daemon_jobs.heartbeat import HeartbeatJob
from agent.daemon_jobs.hooks import Hooks
from agent.daemon_jobs.protocol import HealthChildResult, HealthSeen
from agent.health.last import load_last_result
from agent.health.model import HealthResult, WorkloadResult, WorkloadStack
from agent.host import Host
from agent.report.events import Event
from agent.report.plain import PlainEvent
from tests.daemon.test_jobs import make_runtime

STACK = WorkloadStack(gpu_models="NVIDIA H200", driver="nvidia 580.159.04", gpu_stack="CUDA 13.0",
                      framework="torch 2.9.1 (CUDA 13.0)")


def _workload(name: str, status: str, gates: bool = True, stack: WorkloadStack = STACK) -> WorkloadResult:
    return WorkloadResult(name=name, status=status, summary=f"{name}: {status}", gates=gates, wall_seconds=1.0,
                          stack=stack, stack_id=stack.id)


def _runner(workloads: List[WorkloadResult]) -> Any:
    def run(host: Host, settings: Any, state_dir: str, snapshot: Any = None, mode: Optional[str] = None) -> Any:
        return types.SimpleNamespace(status="cpu_fallback", occupancy=None, workloads=workloads)
    return run


def test_the_heartbeat_carries_each_workloads_verdict_and_stack(tmp_path: Path) -> None:
    """After a check with two workloads, the next heartbeat names both with status, gating, stack id and parts, and
    validates as the published Heartbeat."""
    workloads = [_workload("resnet-train", "cpu_fallback"), _workload("llm-decode", "pass", gates=False)]
    job = HealthJob(make_runtime(tmp_path, Host(root=Path("/"))),
                    Hooks(health_run=_runner(workloads), health_payloads=lambda result: []))
    job.check("interval", None)
    HeartbeatJob(job.runtime).run()
    beat = job.runtime.outbox.pending(10)[-1].payload
    assert [(w.name, w.status, w.gates, w.stack_id) for w in beat.workloads] == [
        ("resnet-train", "cpu_fallback", True, STACK.id), ("llm-decode", "pass", False, STACK.id)]
    assert beat.workloads[0].stack.driver == "nvidia 580.159.04" and beat.workloads[0].stack.gpu_stack == "CUDA 13.0"


def test_a_long_stack_text_is_cut_to_its_bound(tmp_path: Path) -> None:
    """A framework string longer than 300 characters goes out cut to 300, so the hub does not refuse the batch."""
    long = STACK.model_copy(update={"framework": "torch " + "9" * 400})
    job = HealthJob(make_runtime(tmp_path, Host(root=Path("/"))),
                    Hooks(health_run=_runner([_workload("resnet-train", "pass", stack=long)]),
                          health_payloads=lambda result: []))
    job.check("interval", None)
    HeartbeatJob(job.runtime).run()
    stored = job.runtime.outbox.pending(10)[-1]
    assert len(stored.payload.workloads[0].stack.framework) == 300
    event = PlainEvent.of(stored.payload, "h-1", "node-1", dt.datetime.now(dt.timezone.utc))
    assert Event.model_validate_json(event.to_json_text()).payload.workloads[0].stack_id == long.id


def test_the_workloads_cross_the_child_boundary_and_survive_a_restart(tmp_path: Path) -> None:
    """The health child's result carries the workloads as JSON read back checked, and a daemon restarted over
    last.json sends the stored check's workloads."""
    result = HealthResult(status="pass", summary="ok", started_at=dt.datetime(2026, 12, 6, tzinfo=dt.timezone.utc),
                          wall_seconds=3.0, workloads=[_workload("resnet-train", "pass")])
    (tmp_path / "state/health").mkdir(parents=True)
    (tmp_path / "state/health/last.json").write_text(result.to_json())
    restarted = HealthJob(make_runtime(tmp_path, Host(root=Path("/"))), Hooks(health_last=load_last_result))
    seen = HealthSeen("pass", 1.0, None, restarted.runtime.state.last_workloads)
    back = HealthChildResult.from_json(json.loads(json.dumps(HealthChildResult(events=0, last=seen).to_json())))
    assert back.last is not None and back.last.workloads == seen.workloads
    HeartbeatJob(restarted.runtime).run()
    [workload] = restarted.runtime.outbox.pending(10)[-1].payload.workloads
    assert (workload.name, workload.status, workload.stack_id) == ("resnet-train", "pass", STACK.id)


def test_a_check_without_workloads_sends_none(tmp_path: Path) -> None:
    """A host that registers no workload sends no workloads field (None), as an older agent does."""
    job = HealthJob(make_runtime(tmp_path, Host(root=Path("/"))),
                    Hooks(health_run=_runner([]), health_payloads=lambda result: []))
    job.check("interval", None)
    HeartbeatJob(job.runtime).run()
    assert job.runtime.outbox.pending(10)[-1].payload.workloads is None
