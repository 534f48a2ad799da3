"""The readable table and the report events of health results."""

from __future__ import annotations

import datetime as dt

from agent.health.events import payloads_for
from agent.health.model import (
    ActivityReport,
    BaselineComparison,
    FallbackReason,
    Fingerprint,
    GpuActivity,
    HealthResult,
    MetricRegression,
)
from agent.health.render import render_result
from tests.health.probe_results import gpu_row, probe

FP = Fingerprint(gpu_models="NVIDIA H200", driver="nvidia 580.159.04", gpu_stack="CUDA 13.0", kernel="6.18.44",
                 framework="torch 2.11.0", framework_build="cuda 13.0")
REG = MetricRegression(metric="gemm_bf16_tflops", gpu=1, against="baseline", baseline_value=760.0,
                       current_value=640.0, drop_fraction=0.157895, threshold_fraction=0.1,
                       baseline_fingerprint="0123456789abcdef")


def result(**fields) -> HealthResult:
    values = dict(status="pass", summary="pass: 2 GPUs checked", started_at=dt.datetime(2026, 1, 1,
                  tzinfo=dt.timezone.utc), wall_seconds=11.9, probe_wall_seconds=11.8, fingerprint=FP,
                  fingerprint_id=FP.id, inventory_gpu_count=2, probe=probe([gpu_row(0), gpu_row(1)]))
    values.update(fields)
    return HealthResult(**values)


def test_table_has_one_row_per_gpu_with_regressions_marked() -> None:
    """Each GPU gets a row; a regressed figure is marked with its drop; activity shows idle->peak."""
    activity = ActivityReport(library="pynvml", interval_seconds=0.02, gpus=[
        GpuActivity(smi_index=0, bdf="00000000:00:06.0", idle_percent=0.0, max_percent=81.0, samples=9),
        GpuActivity(smi_index=1, bdf="00000000:00:07.0", idle_percent=0.0, max_percent=77.0, samples=9)])
    text = render_result(result(status="regression", summary="regression: GPU 1 ...", regressions=[REG],
                                activity=activity, baseline=BaselineComparison(
                                    fingerprint_id=FP.id, reference_fingerprint_id=FP.id, reference_runs=5,
                                    own_runs=5, runs_needed=5, established=True,
                                    noise_band_fraction={"gpu0.gemm_bf16_tflops": 0.1})))
    lines = text.splitlines()
    assert lines[0] == "health   REGRESSION  regression: GPU 1 ..."
    assert "baseline established; compared with its own, noise band 10.0%" in text
    row1 = next(line for line in lines if line.strip().startswith("gpu1"))
    assert "(-15.8%!)" in row1 and "0->77%" in row1
    assert "regression GPU 1 gemm_bf16_tflops: 640.0 vs 760.0 (baseline), -15.8% > band 10.0%" in text


def test_events_for_regression_and_fallback() -> None:
    """A regression raises a HealthRegression per figure; a fallback a CpuFallback per reason; a pass none."""
    regs = payloads_for(result(status="regression", regressions=[REG]))
    assert [(p.kind, p.metric, p.gpu, p.baseline_fingerprint) for p in regs] == [
        ("health_regression", "gemm_bf16_tflops", "1", "0123456789abcdef")]
    reason = FallbackReason(code="smi_activity_flat", gpu=0, message="GPU 0: flat")
    falls = payloads_for(result(status="cpu_fallback", fallback_reasons=[reason]))
    assert [(p.kind, p.reason, p.fingerprint) for p in falls] == [("cpu_fallback", "smi_activity_flat", FP.id)]
    assert payloads_for(result()) == []


def test_a_failed_or_timed_out_check_raises_a_health_failed_event() -> None:
    """A failed check and a timed-out one each raise one health_failed event with its status, summary and
    failures; busy and deferred raise none."""
    failed = payloads_for(result(status="failed", summary="failed: gemm gave NaN on GPU 1",
                                 failures=["GPU 1: gemm_bf16 gave NaN"]))
    assert [(p.kind, p.status, p.summary, p.failures, p.fingerprint) for p in failed] == [  # type: ignore[union-attr]
        ("health_failed", "failed", "failed: gemm gave NaN on GPU 1", ["GPU 1: gemm_bf16 gave NaN"], FP.id)]
    [timed_out] = payloads_for(result(status="timeout", summary="timeout: probe ran over 300 s", fingerprint_id=None))
    assert (timed_out.kind, timed_out.status, timed_out.fingerprint) == (  # type: ignore[union-attr]
        "health_failed", "timeout", "unknown")
    assert payloads_for(result(status="busy")) == payloads_for(result(status="deferred")) == []
