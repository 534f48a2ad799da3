"""The real probe against the installed PyTorch with every GPU hidden: it must report cpu_fallback; its gloo
multi-process path, slow and failing ranks.

The torch that ``pip install -e '.[probe]'`` brings depends on where it comes from: PyPI's Linux x86_64 wheel is a
CUDA build (it runs on the CPU when no GPU is visible), a CPU wheel index gives a CPU-only build. The expectations
about the framework build follow the torch found, and the probe runs with the GPUs hidden, so these tests mean the
same on a GPU host.

Without torch installed they skip locally and fail in CI (tests/needs.py).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from agent.health.runner import PROBE_PATH, run_health_check
from tests import needs
from tests.health.helpers import fake_probe_settings, make_host, make_snapshot

pytestmark = [pytest.mark.slow, pytest.mark.timeout(110)]

# No GPU visible to the probe, whatever the host has (CUDA and ROCm builds both read these).
NO_GPU_ENV = {"CUDA_VISIBLE_DEVICES": "", "HIP_VISIBLE_DEVICES": "", "ROCR_VISIBLE_DEVICES": ""}
# The fallback reasons a run on no GPU gets, by framework build, on a host whose inventory is one NVIDIA GPU.
REASONS_ON_ONE_NVIDIA_GPU: dict[str, list[str]] = {
    "cpu": ["cpu_only_build", "fewer_gpus_than_inventory"],
    "cuda": ["fewer_gpus_than_inventory"],
    "rocm": ["wrong_vendor_build", "fewer_gpus_than_inventory"],
}


@pytest.fixture(autouse=True)
def _torch_installed() -> None:
    if importlib.util.find_spec("torch") is None:
        needs.unavailable("probe tests with PyTorch", "torch is not installed (pip install -e '.[probe]')")


@pytest.fixture(scope="module")
def installed_torch() -> dict[str, Any]:
    """The installed torch as torch itself reports it (in a child, with the probe's hidden GPUs): version, build."""
    code = ("import json, torch\n"
            "v = torch.version\n"
            "print(json.dumps({'version': str(torch.__version__), 'cuda': getattr(v, 'cuda', None),\n"
            "                  'hip': getattr(v, 'hip', None), 'gpu_visible': bool(torch.cuda.is_available())}))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=100, check=False,
                          env={**os.environ, **NO_GPU_ENV})
    assert done.returncode == 0, done.stderr[-2000:]
    info = json.loads(done.stdout.strip().splitlines()[-1])
    info["build"] = "rocm" if info["hip"] else ("cuda" if info["cuda"] else "cpu")
    return info


def run_real(tmp_path: Path, *probe_args: str, gpus: int = 0, **overrides):
    settings = fake_probe_settings(*probe_args, **{"timeout_seconds": 100.0, "extra_env": NO_GPU_ENV, **overrides})
    return run_health_check(make_host(), settings, str(tmp_path / "state"), snapshot=make_snapshot(nvidia_gpus=gpus),
                            probe_path=PROBE_PATH)


def test_run_without_a_gpu_is_cpu_fallback_and_its_checks_pass(tmp_path: Path,
                                                                 installed_torch: dict[str, Any]) -> None:
    """With no GPU visible the probe runs every check on the CPU and the check says cpu_fallback, for any build.

    A CPU-only build adds cpu_only_build; a CUDA build on this one-NVIDIA-GPU inventory is only short of GPUs.
    """
    assert installed_torch["gpu_visible"] is False, "the GPUs should be hidden from the probe"
    build = installed_torch["build"]
    result = run_real(tmp_path, gpus=1)
    assert result.status == "cpu_fallback", result.summary
    assert [r.code for r in result.fallback_reasons] == REASONS_ON_ONE_NVIDIA_GPU[build]
    probe = result.probe
    assert probe is not None and probe.framework is not None
    assert probe.framework.build == build
    assert probe.framework.version == installed_torch["version"]
    assert probe.framework.cuda == installed_torch["cuda"] and probe.framework.hip == installed_torch["hip"]
    assert probe.ran_on == "cpu" and probe.device_count == 0
    cpu = probe.gpus[0]
    assert cpu.errors == []
    assert cpu.gemm_reference_ok and cpu.copy_verified and cpu.train_ok and cpu.checkpoint_ok
    assert cpu.gemm_bf16_tflops and cpu.gemm_bf16_tflops > 0 and cpu.copy_bandwidth_gbps > 0
    assert result.baseline is None  # a fallback never touches the baselines


def test_gloo_ranks_name_the_slow_one(tmp_path: Path) -> None:
    """Three gloo processes all-reduce a correct sum; the one slowed rank is named as an outlier."""
    result = run_real(tmp_path, "--cpu-ranks", "3", "--slow-rank", "1:0.8", require_accelerator=False)
    probe = result.probe
    assert probe is not None and probe.collective is not None, result.summary
    assert probe.collective.backend == "gloo" and probe.collective.world_size == 3
    assert probe.collective.sum_correct is True
    assert [r.status for r in probe.collective.ranks] == ["ok", "ok", "ok"]
    assert [g.index for g in probe.gpus] == [0, 1, 2]
    assert result.status == "regression", result.summary
    slow = [r for r in result.regressions if r.against == "peers" and r.metric == "gemm_bf16_tflops"]
    assert 1 in [r.gpu for r in slow]
    assert max(slow, key=lambda r: r.drop_fraction).gpu == 1


@pytest.mark.timeout(600)
def test_gloo_failing_rank_is_named_and_the_others_are_stopped(tmp_path: Path) -> None:
    """When one rank fails before the all-reduce the check fails naming it; the waiting ranks are aborted."""
    # A 400 s check has a 300 s rank deadline: far beyond what three ranks take on a loaded machine, so a stop at
    # the deadline (also called aborted once a rank failed) is told from the stop 3 s after the failure.
    result = run_real(tmp_path, "--cpu-ranks", "3", "--fail-rank", "2", require_accelerator=False,
                      timeout_seconds=400.0)
    assert result.status == "failed", result.summary
    assert "rank 2: all-reduce failed: RuntimeError: injected failure on rank 2" in result.failures
    probe = result.probe
    assert probe is not None and probe.collective is not None
    assert [r.status for r in probe.collective.ranks] == ["aborted", "aborted", "failed"]
    assert result.wall_seconds < 150  # well inside the 300 s rank deadline: stopped, not timed out; load-proof


def test_budget_shrinks_the_work_to_fit(tmp_path: Path) -> None:
    """With a 20 MiB device-memory budget the full-size problems shrink to fit: GEMM, copy, short loops; checks pass."""
    budget = 20 << 20  # small enough for a bf16 GEMM on two shared CPU cores
    env = {**os.environ, **NO_GPU_ENV}
    done = subprocess.run([sys.executable, str(PROBE_PATH), "--size", "full", "--device-memory-budget-bytes",
                           str(budget)], capture_output=True, text=True, timeout=100, check=False, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    line = [ln for ln in done.stdout.splitlines() if ln.startswith("GPUGUARD_PROBE_RESULT ")][-1]
    result = json.loads(line.split(" ", 1)[1])
    assert result["device_memory_budget_bytes"] == budget
    (gpu,) = result["gpus"]
    assert gpu["errors"] == [] and gpu["gemm_reference_ok"] and gpu["copy_verified"] and gpu["train_ok"]
    assert gpu["checkpoint_ok"]
    assert 3 * gpu["gemm_size"] ** 2 * 2 <= budget and 2 * gpu["copy_bytes"] <= budget
    assert gpu["gemm_size"] < 8192 and gpu["copy_bytes"] < 4 << 30
