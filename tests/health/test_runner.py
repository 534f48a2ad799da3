"""The runner end to end against small fake probes run as real processes."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from agent.health.runner import build_probe_argv, probe_env, run_health_check
from agent.health.settings import HealthSettings
from tests.health.helpers import (
    FAKE_PROBE,
    fake_probe_settings,
    gone_within,
    make_fake_amdsmi,
    make_fake_nvml,
    make_host,
    make_snapshot,
    memory_unverified,
)

pytestmark = pytest.mark.slow  # real servers or processes per test: left out of `make test-fast`

BUSY = [[0.0], [97.0]]  # idle before the run, then busy


def check(tmp_path: Path, settings: HealthSettings, nvml_readings=BUSY, gpus: int = 1, snapshot_gpus: int = 1,
          used_bytes=None):
    modules = {"pynvml": make_fake_nvml(nvml_readings, bus_ids=[f"00000000:00:0{6 + i}.0" for i in range(gpus)],
                                        used_bytes=used_bytes)}
    return run_health_check(make_host(modules), settings, str(tmp_path / "state"),
                            snapshot=make_snapshot(nvidia_gpus=snapshot_gpus), probe_path=FAKE_PROBE)


GIB = 1 << 30
# Device memory in use: the look before the probe, the sampler's first reading, then the probe's 9 GiB.
MEMORY_ROSE = [[GIB // 2], [GIB // 2], [GIB // 2 + 9 * GIB]]


def test_pass_probe_passes_and_starts_a_baseline(tmp_path: Path) -> None:
    """A healthy fake probe passes, its figures are recorded, and the result is saved as last.json."""
    result = check(tmp_path, fake_probe_settings())
    assert result.status == "pass", result.summary
    assert result.exit_code == 0
    assert result.baseline is not None and result.baseline.recorded and result.baseline.own_runs == 1
    assert result.activity is not None and result.activity.gpus[0].max_percent == 97.0
    saved = json.loads((tmp_path / "state" / "health" / "last.json").read_text())
    assert saved["status"] == "pass"


def test_throttled_runs_are_regressions_after_the_baseline(tmp_path: Path) -> None:
    """Three good runs establish the baseline; a 15% throttle is then a regression, 3% noise is not."""
    for scale in ("1.0", "0.99", "1.01"):
        assert check(tmp_path, fake_probe_settings("--scale", scale)).status == "pass"
    steady = check(tmp_path, fake_probe_settings("--scale", "0.97"))
    assert steady.status == "pass" and steady.baseline is not None and steady.baseline.established
    slow = check(tmp_path, fake_probe_settings(throttle_fraction=0.15))
    assert slow.status == "regression", slow.summary
    assert slow.exit_code == 20
    metrics = {(r.metric, r.gpu) for r in slow.regressions}
    assert metrics == {("gemm_bf16_tflops", 0), ("copy_bandwidth_gbps", 0)}
    assert all(r.against == "baseline" and r.threshold_fraction == pytest.approx(0.10) for r in slow.regressions)


def test_injected_slowdown_flagged_five_of_five_and_unchanged_runs_never(tmp_path: Path) -> None:
    """With run-to-run noise of about 2%, 10 unchanged runs raise nothing and 5 throttled runs are all flagged."""
    noise = ["1.0", "0.99", "1.01", "0.995", "1.005", "0.985", "1.0", "1.012", "0.99", "1.003", "0.988", "1.0",
             "0.997", "1.008", "0.992"]
    settings = dict(baseline_runs=5)
    statuses = [check(tmp_path, fake_probe_settings("--scale", s, **settings)).status for s in noise]
    assert statuses == ["pass"] * 15
    slowed = [check(tmp_path, fake_probe_settings("--scale", s, throttle_fraction=0.15, **settings)).status
              for s in noise[:5]]
    assert slowed == ["regression"] * 5


def test_throttled_run_never_joins_the_baseline(tmp_path: Path) -> None:
    """A throttled run that passes (no baseline yet) is not recorded as a baseline sample."""
    result = check(tmp_path, fake_probe_settings(throttle_fraction=0.15))
    assert result.status == "pass"
    assert result.baseline is not None and not result.baseline.recorded and result.baseline.own_runs == 0


def test_cpu_build_is_cpu_fallback(tmp_path: Path) -> None:
    """A probe on a CPU-only framework build is cpu_fallback, with the build and the GPU count as reasons."""
    result = check(tmp_path, fake_probe_settings("--mode", "cpu"), nvml_readings=[[0.0]])
    assert result.status == "cpu_fallback"
    assert result.exit_code == 21
    assert [r.code for r in result.fallback_reasons] == ["cpu_only_build", "fewer_gpus_than_inventory"]


def test_flat_smi_activity_is_cpu_fallback(tmp_path: Path) -> None:
    """A probe that claims GPU figures while NVML utilization never rose (its memory did) is cpu_fallback, naming
    the GPU."""
    result = check(tmp_path, fake_probe_settings(), nvml_readings=[[0.0]], used_bytes=MEMORY_ROSE)
    assert result.status == "cpu_fallback"
    assert [(r.code, r.gpu) for r in result.fallback_reasons] == [("smi_activity_flat", 0)]


def test_fewer_gpus_than_nvml_sees_is_cpu_fallback(tmp_path: Path) -> None:
    """When NVML sees two GPUs but the framework only one, the check is cpu_fallback even without a snapshot GPU."""
    result = check(tmp_path, fake_probe_settings(), nvml_readings=[[0.0, 0.0], [97.0, 0.0]], gpus=2,
                   snapshot_gpus=0)
    assert result.status == "cpu_fallback"
    assert result.fallback_reasons[0].code == "fewer_gpus_than_inventory"
    assert "1 of the host's 2 GPUs" in result.fallback_reasons[0].message


def test_wrong_vendor_build_on_amd_host(tmp_path: Path) -> None:
    """A CUDA build of the framework on a host whose SMI library is amdsmi is cpu_fallback (wrong vendor)."""
    # The GPU at the PCI address the fake probe names: the device is root's, only the build is wrong.
    modules = {"amdsmi": make_fake_amdsmi([0], bdfs=("0000:00:06.0",), vram_used_rows=[[512], [512], [10240]])}
    result = run_health_check(make_host(modules), fake_probe_settings(), str(tmp_path),
                              snapshot=make_snapshot(nvidia_gpus=0), probe_path=FAKE_PROBE)
    assert result.status == "cpu_fallback"
    assert "wrong_vendor_build" in [r.code for r in result.fallback_reasons]


def test_no_framework_is_skipped_never_pass(tmp_path: Path) -> None:
    """A probe that finds no framework makes the check 'skipped' with its own exit code."""
    result = check(tmp_path, fake_probe_settings("--mode", "skip"))
    assert result.status == "skipped"
    assert result.exit_code == 24
    assert "no framework" in result.summary


def test_garbage_output_is_failed(tmp_path: Path) -> None:
    """Output without a result line is 'failed' and says what was printed."""
    result = check(tmp_path, fake_probe_settings("--mode", "garbage"))
    assert result.status == "failed"
    assert "no result line" in result.summary


def test_crash_is_failed_with_the_last_stderr_line(tmp_path: Path) -> None:
    """A probe that exits non-zero without a result is 'failed' quoting its last stderr line."""
    result = check(tmp_path, fake_probe_settings("--mode", "crash"))
    assert result.status == "failed"
    assert "exit 3" in result.summary and "illegal memory access" in result.summary
    assert result.probe_exit_code == 3


def test_failed_check_is_failed(tmp_path: Path) -> None:
    """A GEMM that disagrees with its fp32 reference fails the check, naming the GPU."""
    result = check(tmp_path, fake_probe_settings("--mode", "badcheck"))
    assert result.status == "failed"
    assert result.failures[0].startswith("GPU 0: bf16 GEMM differs from the fp32 reference")


@pytest.mark.timeout(300)
def test_hang_is_timeout_and_the_whole_process_group_dies(tmp_path: Path) -> None:
    """A hung probe is killed at its timeout, its grandchild too, and the check is 'timeout'."""
    pid_file = tmp_path / "grandchild.pid"
    started = time.monotonic()
    result = check(tmp_path, fake_probe_settings("--mode", "hang", "--pid-file", str(pid_file), timeout_seconds=1.5))
    assert result.status == "timeout"
    assert result.exit_code == 23
    assert time.monotonic() - started < 60  # its 1.5 s timeout, not the probe's 600 s hang: load-proof
    assert pid_file.read_text()  # the grandchild started (the pid it read in its own namespace's /proc)
    # Found on the host by its command line, which holds the pid file's path.
    assert gone_within(str(pid_file), 60.0) == [], "the grandchild is still alive after the timeout"


def test_missing_interpreter_is_failed(tmp_path: Path) -> None:
    """A configured interpreter that does not exist makes the check 'failed', saying so."""
    result = check(tmp_path, fake_probe_settings(python=str(tmp_path / "no-python")))
    assert result.status == "failed"
    assert "could not start" in result.summary and "not found" in result.summary


def test_probe_env_always_disables_nvlink_multicast(tmp_path: Path) -> None:
    """The probe gets NCCL_NVLS_ENABLE=0 even when the host or the config says otherwise."""
    env_file = tmp_path / "env.json"
    settings = fake_probe_settings("--env-file", str(env_file), extra_env={"NCCL_NVLS_ENABLE": "1", "X": "y"})
    check(tmp_path, settings)
    env = json.loads(env_file.read_text())
    assert env["NCCL_NVLS_ENABLE"] == "0" and env["TORCH_SYMM_MEM_DISABLE_MULTICAST"] == "1"
    assert env["X"] == "y"
    assert probe_env({"NCCL_NVLS_ENABLE": "1"}, HealthSettings())["NCCL_NVLS_ENABLE"] == "0"


def test_previous_fingerprint_baseline_catches_a_regression_after_a_driver_change(tmp_path: Path) -> None:
    """After a driver change the new stack is held against the old stack's baseline until it has its own."""
    state = str(tmp_path / "state")
    old = make_snapshot(driver="570.86.15")
    for _ in range(3):  # a fresh fake per run: its readings start idle (a GPU still at 97% would be busy)
        assert run_health_check(make_host({"pynvml": make_fake_nvml(BUSY)}), fake_probe_settings(), state,
                                snapshot=old, probe_path=FAKE_PROBE).status == "pass"
    new = make_snapshot(driver="580.159.04")
    modules = {"pynvml": make_fake_nvml(BUSY)}
    result = run_health_check(make_host(modules), fake_probe_settings("--scale", "0.8"), state, snapshot=new,
                              probe_path=FAKE_PROBE)
    assert result.status == "regression"
    assert result.baseline is not None and result.baseline.reference_fingerprint_id != result.fingerprint_id
    assert result.regressions[0].baseline_fingerprint == result.baseline.reference_fingerprint_id
    fine = run_health_check(make_host({"pynvml": make_fake_nvml(BUSY)}), fake_probe_settings(), state,
                            snapshot=new, probe_path=FAKE_PROBE)
    assert fine.status == "pass" and fine.baseline is not None and fine.baseline.own_runs == 1


def test_container_argv_passes_gpus_mounts_the_probe_and_never_uses_a_shell() -> None:
    """Container mode runs the runtime with the vendor's device flags, the probe mounted read-only, safe env."""
    settings = HealthSettings(container_image="rocm/pytorch:latest", container_args=["--shm-size=8g"])
    argv = build_probe_argv(settings, Path("/usr/lib/gpuguard/probe.py"), "amd", "gpuguard-probe-x")
    assert argv[:5] == ["docker", "run", "--rm", "--name", "gpuguard-probe-x"]
    assert "--device=/dev/kfd" in argv and "--device=/dev/dri" in argv
    assert "/usr/lib/gpuguard/probe.py:/opt/gpuguard/probe.py:ro" in argv
    assert argv[argv.index("NCCL_NVLS_ENABLE=0") - 1] == "-e"
    image_at = argv.index("rocm/pytorch:latest")
    assert argv[image_at - 1] == "--shm-size=8g"
    assert argv[image_at + 1:image_at + 3] == ["python3", "/opt/gpuguard/probe.py"]
    nvidia = build_probe_argv(HealthSettings(container_image="img", container_runtime="podman"), Path("/p.py"),
                              "nvidia", "n")
    assert "--device=nvidia.com/gpu=all" in nvidia


def test_interpreter_argv_has_throttle_and_rank_deadline() -> None:
    """Interpreter mode is python (isolated, -I), the probe path, the throttle and a rank deadline inside the
    timeout, then [health] python_path as --python-path options."""
    argv = build_probe_argv(HealthSettings(python="/opt/venv/bin/python", timeout_seconds=40, throttle_fraction=0.15),
                            Path("/p.py"), None, "n")
    assert argv == ["/opt/venv/bin/python", "-I", "-u", "/p.py", "--throttle-fraction", "0.15",
                    "--rank-timeout-seconds", "30"]
    argv = build_probe_argv(HealthSettings(python="python3", python_path=["/opt/ml/lib"]), Path("/p.py"), None, "n")
    assert argv[-1] == "--python-path=/opt/ml/lib"


@pytest.mark.timeout(60)
def test_a_probe_printing_past_the_cap_is_failed_as_too_large(tmp_path: Path) -> None:
    """A probe that prints more than the cap before a valid result is 'failed' with a summary saying so."""
    result = check(tmp_path, fake_probe_settings("--mode", "flood", "--flood-mib", "3"))
    assert result.status == "failed"
    assert result.summary.startswith("the probe's output was too large: stdout ")
    assert result.probe_stderr_tail is not None and len(result.probe_stderr_tail) <= 2000


def test_terminal_escapes_from_the_probe_reach_neither_the_result_nor_the_table(tmp_path: Path) -> None:
    """ESC[2J, OSC 52, BEL and CR in the probe's strings and stderr are stored and shown escaped, never raw."""
    from agent.health.render import render_result

    result = check(tmp_path, fake_probe_settings("--mode", "escapes"))
    assert result.status == "failed", result.summary
    assert result.probe is not None
    assert result.probe.gpus[0].name == "H200\\x1b[2J\\x1b]52;c;cm0gLXJmIH4=\\x07\\rok\\x1b[0m"
    stored = (tmp_path / "state" / "health" / "last.json").read_text()
    table = render_result(result)
    for text in (result.to_json(), stored, table, result.probe_stderr_tail or "", result.summary):
        assert not [c for c in text if c in "\x1b\x07\r\x9b"], text[:200]
    assert "\\x1b[2J" in table


def test_a_figure_beyond_any_device_fails_and_never_enters_the_baseline(tmp_path: Path) -> None:
    """A probe claiming 1e300 TFLOP/s is 'failed' and the baseline file records nothing of it."""
    result = check(tmp_path, fake_probe_settings("--gemm", "1e300"))
    assert result.status == "failed" and "gemm_bf16_tflops" in result.summary, result.summary
    baselines = tmp_path / "state" / "health" / "baselines.json"
    assert not baselines.exists() or "1e+300" not in baselines.read_text()


# --- device memory root's SMI library saw during the run (issue #39) ---

@pytest.mark.parametrize("readings", [pytest.param([[0.0], [0.0], [97.0]], id="utilization-rose"),
                                      pytest.param([[0.0]], id="utilization-flat-too")])
def test_a_pass_claiming_8_gib_on_a_gpu_whose_memory_never_moved_is_failed(tmp_path: Path, readings) -> None:
    """A result claiming an 8 GiB device-memory peak while NVML saw memory in use stay at 0.5 GiB is failed,
    memory_unseen named (before any fallback rule reads it), and it never reaches the baseline."""
    for attempt in range(3):
        result = check(tmp_path / str(attempt), fake_probe_settings("--hold-seconds", "0.5"), nvml_readings=readings,
                       used_bytes=[[GIB // 2]])
        if result.corroboration is None or not memory_unverified(result.corroboration.unverified):
            break  # else a loaded machine left root's readings too sparse to judge: the rule said so, try again
    assert result.status == "failed", result.summary
    assert result.corroboration is not None
    assert [d.kind for d in result.corroboration.disagreements] == ["memory_unseen"], result.summary
    assert result.baseline is None or not result.baseline.recorded


def test_a_pass_whose_memory_rose_is_corroborated(tmp_path: Path) -> None:
    """The same result with NVML seeing 9 GiB more in use during the run passes, the memory check listed."""
    result = check(tmp_path, fake_probe_settings("--hold-seconds", "0.5"), nvml_readings=[[0.0], [0.0], [97.0]],
                   used_bytes=MEMORY_ROSE)
    assert result.status == "pass", result.summary
    assert result.corroboration is not None
    assert any(line.startswith("GPU 0: device memory rose by 9216 MiB") for line in result.corroboration.checked)
    assert result.activity is not None and result.activity.gpus[0].memory_before_bytes == GIB // 2


def test_without_an_smi_library_the_memory_claim_is_unverified_not_failed(tmp_path: Path) -> None:
    """No pynvml: the 8 GiB claim cannot be held against root's readings; the check passes and says so."""
    result = run_health_check(make_host({}), fake_probe_settings(), str(tmp_path / "state"),
                              snapshot=make_snapshot(nvidia_gpus=1), probe_path=FAKE_PROBE)
    assert result.status == "pass", result.summary
    assert result.corroboration is not None
    assert any(line.startswith("device memory: no SMI library read it") for line in result.corroboration.unverified)


def test_a_run_with_fewer_than_two_memory_readings_is_unverified_not_failed(tmp_path: Path) -> None:
    """Readings 5 s apart: the fake probe ends before the sampler's first tick, so the flat memory is unverified."""
    result = check(tmp_path, fake_probe_settings(activity_interval_seconds=5.0), nvml_readings=[[0.0], [97.0]],
                   used_bytes=[[GIB // 2]])
    assert result.status != "failed", result.summary
    assert result.corroboration is not None and result.corroboration.disagreements == []
    assert any("reading(s) during the run, 2 needed" in line for line in result.corroboration.unverified)
