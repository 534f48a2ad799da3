"""``gpuguard status`` and a stored baseline beyond what the host's GPUs can do: attention, named, in --json."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent.health.model import Fingerprint
from agent.health.sku_limits import fastest_known
from tests.health.baseline_helpers import poisoned_file
from tests.status.test_command import StateDir, run_status

FP = Fingerprint(gpu_models="NVIDIA H200", driver="nvidia 570.86.15", gpu_stack="CUDA 12.8")


@pytest.fixture
def state(tmp_path: Path) -> StateDir:
    return StateDir(tmp_path)


def with_h200_snapshot(state: StateDir) -> None:
    """The daemon's last snapshot names the host's GPUs: one H200 (root's view, NVML)."""
    path = state.state / "last-snapshot.json"
    snapshot = json.loads(path.read_text())
    snapshot["nvidia"] = {"status": "ok", "data": {"gpus": [{"index": 0, "bdf": "0000:00:06.0",
                                                             "name": "NVIDIA H200"}]}}
    path.write_text(json.dumps(snapshot))


def test_a_poisoned_baseline_is_attention_named_in_the_table_and_json(state: StateDir) -> None:
    """A baselines.json established at 9.99e6 TFLOP/s makes status attention (30), naming it, in the JSON too."""
    state.healthy()
    poisoned_file(state.state / "health" / "baselines.json", FP.id, FP)
    code, text = run_status(state, "--offline")
    assert code == 30, text
    line = next(ln for ln in text.splitlines() if "health" in ln.split()[:2])
    assert line.startswith("WARN  health      pass 59 min ago: 8 GPUs ok; SUSPICIOUS baseline, not used: baseline "
                           f"{FP.id} gpu0 gemm_bf16_tflops 9.99e+06 > ")
    assert line.endswith("(gpuguard health baseline show|reset)")
    code, text = run_status(state, "--offline", "--json")
    document = json.loads(text)
    assert code == 30 and document["verdict"] == "attention"
    (figure,) = document["facts"]["health"]["suspicious_baseline"]
    bound = fastest_known().ceiling("gemm_bf16_tflops")
    assert figure.startswith(f"baseline {FP.id} gpu0 gemm_bf16_tflops 9.99e+06 > {bound:g} (any known SKU")


def test_the_limits_are_the_snapshots_gpus(state: StateDir) -> None:
    """1,200 TFLOP/s is beyond an H200 (the snapshot's GPU) though not beyond every SKU: attention."""
    state.healthy()
    with_h200_snapshot(state)
    poisoned_file(state.state / "health" / "baselines.json", FP.id, FP, gemm=1200.0)
    code, text = run_status(state, "--offline")
    assert code == 30 and "gemm_bf16_tflops 1200 > 1137.92 (H200 SXM datasheet peak x 1.15)" in text


def test_an_honest_baseline_is_ok(state: StateDir) -> None:
    """A baseline at an H200's measured figures leaves status ok."""
    state.healthy()
    with_h200_snapshot(state)
    poisoned_file(state.state / "health" / "baselines.json", FP.id, FP, gemm=790.0)
    code, text = run_status(state, "--offline")
    assert code == 0, text
    assert "SUSPICIOUS" not in text
