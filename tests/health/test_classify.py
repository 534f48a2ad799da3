"""Classification precedence: timeout, failed to run, skipped, cpu_fallback, failed checks, regression, pass."""

from __future__ import annotations

from agent.health.classify import check_failures, classify
from agent.health.launch import ProbeOutcome
from agent.health.model import FallbackReason, MetricRegression
from agent.health.parse import ParseFailure
from tests.health.probe_results import gpu_row, probe

OK = ProbeOutcome(("python", "probe.py"), 0, "", "", False, 1.0)
FALLBACK = [FallbackReason(code="cpu_only_build", message="torch 2.13.0+cpu is a CPU-only build")]
REGRESSION = [MetricRegression(metric="gemm_bf16_tflops", gpu=0, against="baseline", baseline_value=750.0,
                               current_value=600.0, drop_fraction=0.2, threshold_fraction=0.1)]


def test_timeout_beats_everything() -> None:
    """A killed probe is a timeout whatever else is known."""
    hung = ProbeOutcome(("p",), None, "", "", True, 120.0)
    assert classify(hung, probe(), FALLBACK, REGRESSION).status == "timeout"


def test_start_error_and_parse_failure_are_failed() -> None:
    """A probe that did not start, or printed nothing usable, fails; a crash quotes stderr's last line."""
    missing = ProbeOutcome(("p",), None, "", "", False, 0.0, start_error="/opt/venv/bin/python: not found")
    assert classify(missing, None, [], []).summary == "the probe could not start: /opt/venv/bin/python: not found"
    crash = ProbeOutcome(("p",), 139, "", "boom\nSegmentation fault\n", False, 1.0)
    verdict = classify(crash, ParseFailure("no result line"), [], [])
    assert verdict.status == "failed" and verdict.summary.endswith("(exit 139): Segmentation fault")


def test_skipped_and_import_error() -> None:
    """No framework is skipped; a framework that fails to import is failed."""
    assert classify(OK, probe(skipped_reason="no framework", framework=None), [], []).status == "skipped"
    broken = probe(framework={"name": "torch", "import_error": "OSError: libcudart.so.13: cannot open"})
    verdict = classify(OK, broken, [], [])
    assert verdict.status == "failed" and "libcudart" in verdict.summary


def test_fallback_beats_failed_checks_and_regressions() -> None:
    """A CPU fallback is reported as such even when checks also failed; the failures are kept."""
    bad = probe([gpu_row(0, train_ok=False)])
    verdict = classify(OK, bad, FALLBACK, REGRESSION)
    assert verdict.status == "cpu_fallback" and verdict.failures


def test_failed_checks_beat_regressions() -> None:
    """A wrong checkpoint round trip is failed even if a figure also regressed."""
    verdict = classify(OK, probe([gpu_row(0, checkpoint_ok=False)]), [], REGRESSION)
    assert verdict.status == "failed" and "checkpoint" in verdict.summary


def test_regression_and_pass() -> None:
    """A regression names the GPU and the metric; otherwise the check passes."""
    assert classify(OK, probe(), [], REGRESSION).summary.startswith("regression: GPU 0 gemm_bf16_tflops dropped 20.0%")
    assert classify(OK, probe(), [], []).status == "pass"


def test_nonzero_exit_with_a_result_is_a_failure() -> None:
    """A probe that printed a result but exited non-zero fails with that exit in the failures."""
    verdict = classify(ProbeOutcome(("p",), 1, "", "late crash", False, 1.0), probe(), [], [])
    assert verdict.status == "failed" and verdict.failures == ["the probe exited 1: late crash"]


def test_check_failures_name_ranks_and_gpus() -> None:
    """Collective failures are named by rank; missing ranks are listed; a wrong sum is a failure."""
    collective = {"world_size": 3, "bytes": 1024, "sum_correct": False,
                  "ranks": [{"rank": 0, "status": "ok"}, {"rank": 1, "status": "failed", "error": "NCCL error"},
                            {"rank": 2, "status": "aborted", "error": "killed: another rank failed"}]}
    result = probe([gpu_row(0), gpu_row(1, errors=["copy: RuntimeError: CUDA out of memory"])], collective=collective)
    failures = check_failures(result)
    assert "GPU 1: copy: RuntimeError: CUDA out of memory" in failures
    assert "rank 2: reported no figures" in failures
    assert "rank 1: all-reduce failed: NCCL error" in failures
    assert "all-reduce over 3 ranks gave a wrong sum" in failures


def test_output_over_the_cap_is_failed_whatever_it_said() -> None:
    """A probe whose output passed the launcher's cap fails, saying so, even when a valid result was read."""
    flood = ProbeOutcome(("p",), 0, "", "", False, 1.0, output_too_large="stdout 419430400 bytes > cap 1048576 bytes")
    verdict = classify(flood, probe(), [], [])
    assert verdict.status == "failed"
    assert verdict.summary == "the probe's output was too large: stdout 419430400 bytes > cap 1048576 bytes"
