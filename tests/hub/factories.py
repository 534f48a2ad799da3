"""Events and batches for hub tests: real schema objects, a few fields varied per test."""

from __future__ import annotations

import datetime as dt
import itertools
import json
from typing import Any, Dict, List, Optional, Sequence

from agent.report.events import (
    CpuFallback,
    Event,
    EventBatch,
    HealthRegression,
    Heartbeat,
    PolicyViolation,
    Rollback,
    SnapshotChanged,
)
from agent.snapshot.pairing import Pairing

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
_ids = itertools.count(1)

ROCM_62 = Pairing(os_id="ubuntu", os_version_id="22.04", kernel_running="5.15.0-119-generic",
                  amdgpu_loaded="6.8.5", rocm="6.2.0", gpu_count=8, gpu_models="AMD Instinct MI300X")
ROCM_63 = ROCM_62.model_copy(update={"amdgpu_loaded": "6.10.5", "rocm": "6.3.1"})
CUDA_12 = Pairing(os_id="debian", os_version_id="12", kernel_running="6.1.0-25-amd64", nvidia_loaded="550.90.07",
                  cuda_driver_api="12.4", gpu_count=4, gpu_models="NVIDIA H100 80GB HBM3")


def payload_of(kind: str, pairing: Optional[Pairing] = None, compliant: Optional[bool] = True) -> Any:
    """A valid payload of ``kind``."""
    if kind == "heartbeat":
        return Heartbeat(agent_version="0.1.0", uptime_seconds=12.5, pairing=pairing, compliant=compliant,
                         content_hash="c" * 64)
    if kind == "snapshot_changed":
        return SnapshotChanged(old_hash="a" * 64, new_hash="b" * 64, pairing=pairing or ROCM_62)
    if kind == "health_regression":
        return HealthRegression(metric="gemm_tflops", baseline_value=100.0, current_value=70.0, drop_fraction=0.3,
                                threshold_fraction=0.1, fingerprint="f2", baseline_fingerprint="f1")
    if kind == "cpu_fallback":
        return CpuFallback(reason="torch.cuda.is_available() is False", fingerprint="f2")
    if kind == "policy_violation":
        return PolicyViolation(rule="rocm-pin", message="rocm-core 6.3.1 is not 6.2.0",
                               packages={"rocm-core": "6.3.1"})
    if kind == "rollback":
        return Rollback(reason="health", from_versions={"rocm-core": "6.3.1"}, to_versions={"rocm-core": "6.2.0"},
                        succeeded=True)
    raise ValueError(kind)


def event(host_id: str = "host-a", kind: str = "heartbeat", at: dt.datetime = T0, sequence: Optional[int] = None,
          event_id: Optional[str] = None, hostname: Optional[str] = None, **payload_args: Any) -> Event:
    """One event of ``host_id``; ids and sequences are unique unless given."""
    number = next(_ids)
    return Event(event_id=event_id or f"ev{number:012d}", host_id=host_id, hostname=hostname or f"{host_id}.lab",
                 sequence=number if sequence is None else sequence, occurred_at=at,
                 payload=payload_of(kind, **payload_args))


def batch_json(events: Sequence[Event]) -> bytes:
    """The JSON body the agent's sender posts."""
    return EventBatch(events=list(events)).model_dump_json().encode()


def batch_dict(events: Sequence[Event]) -> Dict[str, Any]:
    return json.loads(batch_json(events))


def ids(events: Sequence[Event]) -> List[str]:
    return [e.event_id for e in events]
