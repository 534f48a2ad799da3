"""Builders of ProbeResult objects for the pure-rule tests."""

from __future__ import annotations

from typing import Any, Dict, List, Optional

from agent.health.model import ProbeResult


def gpu_row(index: int, gemm: Optional[float] = 750.0, copy: Optional[float] = 4200.0, **extra: Any) -> Dict:
    row = {"index": index, "device": f"cuda:{index}", "name": "NVIDIA H200", "gemm_dtype": "bf16",
           "gemm_bf16_tflops": gemm, "copy_bandwidth_gbps": copy, "gemm_reference_ok": True,
           "gemm_reference_rel_error": 0.002, "copy_verified": True, "train_ok": True, "checkpoint_ok": True}
    row.update(extra)
    return row


def probe(gpus: Optional[List[Dict]] = None, build: str = "cuda", device_count: Optional[int] = None,
          ran_on: str = "gpu", **extra: Any) -> ProbeResult:
    """A probe result with H200 devices at 0000:00:06.0, 0000:00:07.0, ... and the given per-GPU rows."""
    gpus = [gpu_row(0)] if gpus is None else gpus
    count = len(gpus) if device_count is None else device_count
    data: Dict[str, Any] = {
        "probe_schema_version": 1, "python": "3.12.3",
        "framework": {"name": "torch", "version": "2.11.0", "build": build,
                      "cuda": "13.0" if build == "cuda" else None, "hip": "7.0" if build == "rocm" else None},
        "accelerator_available": count > 0, "device_count": count,
        "devices": [{"index": i, "name": "NVIDIA H200", "pci_bus_id": f"0000:00:0{6 + i}.0",
                     "uuid": f"5a1b2c3d-0000-0000-0000-00000000000{i}"} for i in range(count)],
        "ran_on": ran_on, "gpus": gpus}
    data.update(extra)
    return ProbeResult.model_validate(data)
