"""Registered workloads end to end: real PyTorch (the CPU build) under gpuguard's shim, run as real processes.

PyTorch's CPU build has no accelerator, so these tests name the CPU as the workload's accelerator device and
PyTorch's ``meta`` device as its host: a ``.to("meta")`` is then the round trip off the accelerator that a
``.cpu()`` is on a GPU host, through the same dispatch hook (docs/hardware.md has the same on a real GPU).
"""

from __future__ import annotations

import importlib.util
import textwrap
from pathlib import Path
from typing import Any, List

import pytest

from agent.health.runner import run_health_check
from agent.health.settings import HealthSettings
from agent.health.workload_settings import WorkloadSettings
from tests import needs
from tests.health.helpers import FAKE_PROBE, fake_probe_settings, make_fake_nvml, make_host, make_snapshot

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

BUSY = [[0.0], [97.0]]
FLAT = [[0.0], [0.0]]

# A small model's training steps; --fallback moves one activation off the "accelerator" and computes on it there;
# --rate N reports N samples/s; --exit-early forges the shim's line and leaves before the shim can report.
WORKLOAD = textwrap.dedent('''
    import json, os, sys
    import torch

    args = sys.argv[1:]
    rate = float(args[args.index("--rate") + 1]) if "--rate" in args else 100.0
    if "--exit-early" in args:
        print('GPUGUARD_WORKLOAD_REPORT {"shim_schema_version": 1, "nonce": "guess", "python": "3", '
              '"instrumented": true, "ended": {"kind": "returned", "code": 0}, "wall_seconds": 1.0, '
              '"ops": [{"op": "aten::mm", "device": "cuda", "calls": 99}]}')
        print(json.dumps({"gpuguard_result": {"samples_per_second": 1e9}}))
        sys.stdout.flush()
        os._exit(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(16, 32)
    for _ in range(3):
        out = model(x)
        if "--fallback" in args:
            torch.nn.functional.gelu(out.to("meta"))
        loss = out.pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    print(json.dumps({"gpuguard_result": {"samples_per_second": rate, "loss": float(loss)}}))
''')


@pytest.fixture(autouse=True)
def _torch_installed() -> None:
    if importlib.util.find_spec("torch") is None:
        needs.unavailable("workload tests with PyTorch", "torch is not installed (pip install -e '.[probe]')")


def workload_script(tmp_path: Path) -> str:
    path = tmp_path / "train_step.py"
    path.write_text(WORKLOAD)
    path.chmod(0o644)
    return str(path)


def settings_with(tmp_path: Path, *args: str, **workload: Any) -> HealthSettings:
    values: dict = {"name": "train-step", "script": workload_script(tmp_path), "args": list(args),
                    "metric": "samples_per_second", "timeout_seconds": 200.0, "accelerator_device": "cpu",
                    "host_device": "meta"}
    values.update(workload)
    return fake_probe_settings(workloads=[WorkloadSettings(**values)], timeout_seconds=60.0)


def check(tmp_path: Path, settings: HealthSettings, readings: List[List[float]] = BUSY, driver: str = "580.159.04"):
    host = make_host({"pynvml": make_fake_nvml(readings)})
    return run_health_check(host, settings, str(tmp_path / "state"), snapshot=make_snapshot(driver=driver),
                            probe_path=FAKE_PROBE)


def test_a_workload_that_computes_on_its_device_passes_with_its_figure(tmp_path: Path) -> None:
    """A training workload with no fallback passes; its figure, its operator calls and its stack are recorded."""
    result = check(tmp_path, settings_with(tmp_path))
    assert result.status == "pass", result.summary
    [run] = result.workloads
    assert run.status == "pass", run.summary
    assert run.metrics["samples_per_second"] == 100.0
    assert run.instrumented and run.accelerator_calls > 20 and run.fallback_ops == []
    assert run.stack is not None and run.stack.framework is not None and run.stack.framework.startswith("torch ")
    assert run.baseline_runs == 1


def test_an_operator_that_ran_off_the_accelerator_is_named_in_the_verdict(tmp_path: Path) -> None:
    """A workload that computes on data copied off its device is cpu_fallback naming the operator and its count."""
    result = check(tmp_path, settings_with(tmp_path, "--fallback"))
    assert result.status == "cpu_fallback", result.summary
    [run] = result.workloads
    assert [(op.op, op.calls) for op in run.fallback_ops] == [("aten::gelu", 3)]
    assert "aten::gelu ran on the META 3 times" in result.summary
    assert "train-step" in result.summary


def test_a_metric_that_drops_after_a_stack_change_is_a_regression_naming_the_old_stack(tmp_path: Path) -> None:
    """Three runs establish the workload's baseline on one driver; a 40% slower run on the next driver regresses."""
    for _ in range(3):
        assert check(tmp_path, settings_with(tmp_path)).status == "pass"
    result = check(tmp_path, settings_with(tmp_path, "--rate", "60"), driver="590.44.01")
    assert result.status == "regression", result.summary
    [run] = result.workloads
    assert run.regressions[0].metric == "train-step.samples_per_second"
    assert "nvidia 580.159.04" in result.summary and "40% worse" in result.summary
    same = check(tmp_path, settings_with(tmp_path, "--rate", "97"), driver="590.44.01")
    assert same.status == "pass", same.summary


def test_a_forged_report_from_a_workload_that_leaves_early_fails(tmp_path: Path) -> None:
    """A report line without this run's nonce (the workload wrote it and left before the shim) is a failure."""
    result = check(tmp_path, settings_with(tmp_path, "--exit-early"))
    assert result.status == "failed", result.summary
    assert "nonce" in result.workloads[0].summary
    assert result.workloads[0].metrics == {}


def test_a_workload_the_smi_saw_idle_is_cpu_fallback_whatever_it_reports(tmp_path: Path) -> None:
    """Root's SMI sampling that saw no GPU activity outvotes the workload's own operator counts."""
    result = check(tmp_path, settings_with(tmp_path), readings=FLAT)
    [run] = result.workloads
    assert run.status == "cpu_fallback", run.summary
    assert "saw no GPU's activity rise" in run.summary


def test_a_hanging_workload_times_out_and_a_non_gating_one_does_not_fail_the_check(tmp_path: Path) -> None:
    """A workload past its timeout is killed and is timeout; when it does not gate, the check still passes."""
    hang = tmp_path / "hang.py"
    hang.write_text("import time\ntime.sleep(600)\n")
    settings = fake_probe_settings(workloads=[WorkloadSettings(name="hang", script=str(hang), timeout_seconds=3,
                                                               gates=False)])
    result = check(tmp_path, settings)
    assert result.status == "pass", result.summary
    assert result.workloads[0].status == "timeout"


@pytest.mark.parametrize("fields, problem", [
    ({"name": "x", "module": "a.b", "script": "/s.py"}, "exactly one of module or script"),
    ({"name": "x", "script": "rel.py"}, "not an absolute path"),
    ({"name": "Bad Name", "module": "m"}, "name 'Bad Name'"),
    ({"name": "x", "module": "m;rm"}, "not a dotted module name"),
])
def test_workload_settings_refuse_what_cannot_run(fields: dict, problem: str) -> None:
    """A workload entry that names no single way to run, or a bad name, is refused with the problem named."""
    with pytest.raises(ValueError, match=problem):
        WorkloadSettings(**fields)


def test_two_workloads_with_one_name_are_refused() -> None:
    """Names key results and baselines: the same name twice is a configuration error."""
    with pytest.raises(ValueError, match="given twice"):
        fake_probe_settings(workloads=[WorkloadSettings(name="a", module="m"), WorkloadSettings(name="a", module="n")])


def test_a_workload_that_floods_its_output_fails_as_the_probe_would(tmp_path: Path) -> None:
    """More than the output cap on stdout ends the workload's run as failed, naming the flood."""
    flood = tmp_path / "flood.py"
    flood.write_text("import sys\nfor _ in range(40):\n    sys.stdout.write('x' * (1 << 16) + '\\n')\n")
    settings = fake_probe_settings(workloads=[WorkloadSettings(name="flood", script=str(flood))])
    result = check(tmp_path, settings)
    assert result.status == "failed", result.summary
    assert result.workloads[0].status == "failed"
    assert "stdout" in result.workloads[0].summary
