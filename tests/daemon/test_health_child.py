"""The health check in a real job child (``gpuguard _job health``): the schedule's mode and the after-change flag
reach the runner, and the child's summary comes back (a stand-in interpreter prints a CPU-fallback probe result)."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import sys
from pathlib import Path

import pytest

from agent.config import load_settings
from agent.daemon_jobs.children import HealthInChild
from agent.host import Host
from tests.daemon.test_jobs import make_runtime
from tests.health.helpers import hostile_interpreter, shared_directory, small_filesystem

FAKE_PROBE = Path(__file__).resolve().parents[1] / "health/probes/fake_probe.py"

pytestmark = pytest.mark.timeout(120)


def test_functional_after_a_change_runs_in_the_child_and_reports_its_summary(tmp_path: Path) -> None:
    """The functional check after a change runs in a job child under the host's ML interpreter and reports its
    summary."""
    python = tmp_path / "ml-python"
    # The host's "ML interpreter": whatever probe it is handed, it prints a CPU-only build's result.
    python.write_text(f"#!{sys.executable}\nimport os, sys\n"
                      f"os.execv(sys.executable, [sys.executable, {str(FAKE_PROBE)!r}, '--mode', 'cpu'])\n")
    python.chmod(0o755)
    state = tmp_path / "state"
    config = tmp_path / "agent.toml"
    # This machine has no GPU, and a GPU-less host is skipped before any probe runs: require_accelerator = false
    # runs the probe all the same, and expected_gpu_count = 1 stands for the GPU the framework fails to see.
    config.write_text(f'[agent]\nstate_dir = "{state}"\n[health]\npython = "{python}"\ntimeout_seconds = 60\n'
                      f'run_as = "{pwd.getpwuid(os.geteuid()).pw_name}"\nrequire_accelerator = false\n'
                      'expected_gpu_count = 1\n')
    rt = make_runtime(tmp_path, Host(root=Path("/")), load_settings(str(config)))
    summary = HealthInChild(rt, str(config)).run("stack_changed:dpkg", "functional", True)
    assert summary is not None
    assert (summary.status, summary.mode, summary.busy, summary.tenants) == (
        "cpu_fallback", "functional", False, ())
    assert summary.rollback is None  # no compiled policy: after_change is "alert"
    assert rt.state.last_health_status == "cpu_fallback"
    assert {e.kind for e in rt.outbox.pending(20)} == {"cpu_fallback"}


def test_a_failed_post_change_check_in_the_child_keeps_the_node_out(tmp_path: Path) -> None:
    """With [integrations] scheduler = "kubernetes" and a hold begun, a cpu_fallback after a change keeps the
    node's maintenance label and adds the failure (the scheduler never gets a broken node back)."""
    from agent.daemon_jobs.handoff import begin_for_change

    python = tmp_path / "ml-python"
    python.write_text(f"#!{sys.executable}\nimport os, sys\n"
                      f"os.execv(sys.executable, [sys.executable, {str(FAKE_PROBE)!r}, '--mode', 'cpu'])\n")
    python.chmod(0o755)
    features = tmp_path / "features.d"
    features.mkdir()
    config = tmp_path / "agent.toml"
    config.write_text(f'[agent]\nstate_dir = "{tmp_path / "state"}"\n[health]\npython = "{python}"\n'
                      f'timeout_seconds = 60\nrun_as = "{pwd.getpwuid(os.geteuid()).pw_name}"\n'
                      'require_accelerator = false\nexpected_gpu_count = 1\n'
                      f'[report]\nnfd_features_file = "{features / "gpuguard"}"\n'
                      '[integrations]\nscheduler = "kubernetes"\n')
    settings = load_settings(str(config))
    assert begin_for_change(Host(root=Path("/")), settings, "policy bundle serial 7") is not None
    rt = make_runtime(tmp_path, Host(root=Path("/")), settings)
    summary = HealthInChild(rt, str(config)).run("stack_changed:dpkg", "functional", True)
    assert summary is not None and summary.status == "cpu_fallback"
    labels = (features / "gpuguard-maintenance").read_text()
    assert "gpuguard.io/maintenance=true\ngpuguard.io/maintenance-reason=policy_bundle_serial_7\n" in labels
    assert "maintenance-rollout" not in labels
    assert "gpuguard.io/maintenance-failed=post-change_check_cpu_fallback" in labels


def test_five_forged_runs_then_an_honest_one_in_the_child_is_not_a_regression(tmp_path: Path) -> None:
    """Through the daemon's job child: five runs forging 9.99e6 TFLOP/s fail corroboration and never become the
    baseline, and the honest run after them passes (before issue 39 they passed and it was a regression)."""
    import json

    from tests.health.baseline_helpers import switchable_interpreter

    python, probe_args = switchable_interpreter(tmp_path)
    state = tmp_path / "state"
    config = tmp_path / "agent.toml"
    # No GPU here: require_accelerator = false runs the probe all the same (the check is judged like a GPU's).
    config.write_text(f'[agent]\nstate_dir = "{state}"\n[health]\npython = "{python}"\ntimeout_seconds = 60\n'
                      f'run_as = "{pwd.getpwuid(os.geteuid()).pw_name}"\nrequire_accelerator = false\n')
    rt = make_runtime(tmp_path, Host(root=Path("/")), load_settings(str(config)))
    child = HealthInChild(rt, str(config))
    probe_args.write_text("--mode pass --gemm 9.99e6")
    for _ in range(5):
        summary = child.run("interval", "full", False)
        assert summary is not None and summary.status == "failed"  # above any SKU's peak: not corroborated
    baselines = state / "health" / "baselines.json"
    stored = json.loads(baselines.read_text())["records"] if baselines.exists() else {}
    assert all(run["metrics"].get("gpu0.gemm_bf16_tflops", 0) < 1e4 for rec in stored.values() for run in rec["runs"])
    probe_args.write_text("--mode pass --gemm 750")
    summary = child.run("interval", "full", False)
    assert summary is not None and summary.status == "pass"
    assert rt.state.last_health_status == "pass"
    (record,) = json.loads(baselines.read_text())["records"].values()
    assert [run["metrics"]["gpu0.gemm_bf16_tflops"] for run in record["runs"]] == [750.0]  # judged, and joined


# --- a probe with nothing to keep, limits on its whole tree (issue #39), through the daemon's job child ---

def hostile_child(shared: Path, python: Path, **settings: object) -> HealthInChild:
    """The daemon's health job child over a state directory in ``shared``, the probe run as nobody."""
    if os.geteuid() != 0:
        pytest.skip("the hostile-probe tests must run as root to start the probe as nobody")
    extra = "".join(f"{key} = {value!r}\n" for key, value in settings.items())
    config = shared / "agent.toml"
    config.write_text(f'[agent]\nstate_dir = "{shared / "state"}"\n[health]\npython = "{python}"\n'
                      'timeout_seconds = 60\nrun_as = "nobody"\nrequire_accelerator = false\n'
                      f"expected_gpu_count = 1\n{extra}")
    rt = make_runtime(shared, Host(root=Path("/")), load_settings(str(config)))
    return HealthInChild(rt, str(config))


def test_a_planted_usercustomize_does_not_reach_the_next_check_in_the_child(tmp_path: Path) -> None:
    """In the job child too: a hostile run plants usercustomize/sitecustomize/.pth, the next honest run (no
    framework) is still skipped."""
    with shared_directory() as shared:
        python, mode = hostile_interpreter(shared)
        child = hostile_child(shared, python)
        mode.write_text("plant")
        child.run("stack_changed:dpkg", "functional", True)
        mode.write_text("skip")
        summary = child.run("stack_changed:dpkg", "functional", True)
        assert summary is not None and summary.status == "skipped", summary


def test_a_setsid_child_over_the_memory_limit_is_killed_in_the_child(tmp_path: Path) -> None:
    """In the job child too: a grandchild in its own session holding 200 MiB under a 64 MiB limit is killed and
    the check is failed, killed_for_memory recorded."""
    with shared_directory() as shared:
        python, mode = hostile_interpreter(shared)
        child = hostile_child(shared, python, memory_max_bytes=64 << 20)
        mode.write_text("setsid-hog --hog-mib 200")
        summary = child.run("stack_changed:dpkg", "functional", True)
        assert summary is not None and summary.status == "failed", summary
        last = json.loads((shared / "state" / "health" / "last.json").read_text())
        assert last["sandbox"]["killed_for_memory"], last["sandbox"]


def test_a_probe_filling_its_home_leaves_the_next_check_in_the_child_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """In the job child too: with the state and the probe's home on one 32 MiB filesystem, a probe writing 64 MiB
    is held to 8 MiB, and the next honest check (a CPU-only build) reads cpu_fallback as before, not a disk error."""
    with small_filesystem(32) as disk:
        python, mode = hostile_interpreter(disk)
        monkeypatch.setenv("TMPDIR", str(disk))  # the child's per-run homes land on the state's filesystem
        child = hostile_child(disk, python, home_max_bytes=8 << 20)
        mode.write_text("fill --fill-mib 64")
        child.run("stack_changed:dpkg", "functional", True)
        mode.write_text("cpu")
        summary = child.run("stack_changed:dpkg", "functional", True)
        assert summary is not None and summary.status == "cpu_fallback", summary
        assert shutil.disk_usage(disk).used < 4 << 20
def forged_child(tmp_path: Path, *probe_args: str, expected_gpus: int = 1):
    """The daemon's health job child after a change, its host interpreter making the probe print ``probe_args``'
    result; this machine has no GPU, so the inventory root holds the claims against is ``expected_gpu_count``."""
    from agent.health.last import load_last_result
    from tests.health.helpers import wrapper_python

    tmp_path.mkdir(parents=True, exist_ok=True)
    python = wrapper_python(tmp_path, *probe_args)
    state = tmp_path / "state"
    config = tmp_path / "agent.toml"
    config.write_text(f'[agent]\nstate_dir = "{state}"\n[health]\npython = "{python}"\ntimeout_seconds = 60\n'
                      f'run_as = "{pwd.getpwuid(os.geteuid()).pw_name}"\nrequire_accelerator = false\n'
                      f'expected_gpu_count = {expected_gpus}\n')
    rt = make_runtime(tmp_path, Host(root=Path("/")), load_settings(str(config)))
    summary = HealthInChild(rt, str(config)).run("stack_changed:dpkg", "functional", True)
    return summary, load_last_result(str(state))


def test_an_honest_result_passes_in_the_child(tmp_path: Path) -> None:
    """An honest result (the H200's real figures, one GPU as configured) passes in the job child."""
    summary, last = forged_child(tmp_path, "--gemm", "792", "--copy", "4269")
    assert summary is not None and summary.status == "pass", last.summary if last else None


@pytest.mark.parametrize("probe_args,kind", [
    pytest.param(("--gpus", "8"), "more_gpus_than_host", id="8-gpus-expected-1"),
    pytest.param(("--gpus", "2", "--forge", "unlisted-index"), "unlisted_index", id="figures-for-an-unlisted-index"),
    pytest.param(("--gpus", "1", "--forge", "duplicate-index"), "duplicate_gpu", id="one-gpu-twice"),
    pytest.param(("--forge", "negative-time"), "impossible_time", id="negative-time"),
    pytest.param(("--name", "NVIDIA H100 80GB HBM3", "--gemm", "5000"), "above_peak", id="5000-tflops-on-an-h100"),
])
def test_the_child_fails_a_result_the_host_cannot_have(tmp_path: Path, probe_args: tuple, kind: str) -> None:
    """The daemon's job child answers failed for a result that disagrees with what root saw, naming the kind."""
    summary, last = forged_child(tmp_path, *probe_args)
    assert summary is not None and summary.status == "failed", last.summary if last else None
    assert last is not None and last.corroboration is not None
    assert kind in [d.kind for d in last.corroboration.disagreements], last.summary


@pytest.mark.parametrize("forge,reason", [("duplicate-key", "duplicate key 'device_count'"),
                                          ("non-utf8", "not UTF-8 (byte 0xff")])
def test_the_child_refuses_a_result_line_that_is_not_strict_json(tmp_path: Path, forge: str, reason: str) -> None:
    """In the job child too, a key named twice or a non-UTF-8 byte in the result line is failed, named."""
    summary, last = forged_child(tmp_path, "--forge", forge)
    assert summary is not None and summary.status == "failed"
    assert last is not None and reason in last.summary


# --- device memory root's SMI library saw during the run (issue #39), through the daemon's job child ---

GIB = 1 << 30


def fake_nvml_for_the_child(directory: Path, monkeypatch: pytest.MonkeyPatch, used_bytes: list) -> None:
    """Put a ``pynvml`` first on the job child's sys.path: tests/fakes/pynvml.py with one H200 at the PCI address
    and UUID the fake probe names, utilization 0, 0 then 97 and memory in use ``used_bytes`` call by call."""
    from tests.health.helpers import H200_BYTES

    data = {"driver_version": "580.159.04", "cuda_driver_version": 13000,
            "gpus": [{"pci_bus_id": "00000000:00:06.0", "name": "NVIDIA H200",
                      "uuid": "GPU-5a1b2c3d-0000-0000-0000-000000000000", "memory_total_bytes": H200_BYTES,
                      "utilization": [0, 0, 97], "memory_used_bytes": used_bytes}]}
    seam = directory / "seam"
    seam.mkdir(parents=True)
    (seam / "pynvml.py").write_text("import json\nimport sys\n\nfrom tests.fakes.pynvml import make_fake_pynvml\n\n"
                                    f"sys.modules[__name__] = make_fake_pynvml(json.loads({json.dumps(data)!r}))\n")
    monkeypatch.syspath_prepend(str(seam))  # the child starts with the daemon's sys.path (child_argv)


@pytest.mark.parametrize("used_bytes,status", [
    pytest.param([GIB // 2, GIB // 2, GIB // 2 + 9 * GIB], "pass", id="memory-rose"),
    pytest.param([GIB // 2], "failed", id="memory-flat"),
])
def test_the_child_holds_the_memory_claim_against_nvmls_readings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                 used_bytes: list, status: str) -> None:
    """In the job child, a result claiming an 8 GiB peak passes where NVML saw 9 GiB more in use during the run and
    is failed (memory_unseen) where memory in use never moved though utilization rose."""
    from tests.health.helpers import memory_unverified

    fake_nvml_for_the_child(tmp_path, monkeypatch, used_bytes)
    for attempt in range(3):
        summary, last = forged_child(tmp_path / str(attempt), "--hold-seconds", "2")
        assert last is not None and last.corroboration is not None, last
        if not memory_unverified(last.corroboration.unverified):
            break  # else a loaded machine left root's readings too sparse to judge: the rule said so, try again
    assert summary is not None and summary.status == status, last.summary
    assert last.activity is not None and last.activity.library == "pynvml", last.activity
    if status == "pass":
        assert any(line.startswith("GPU 0: device memory rose by 9216 MiB") for line in last.corroboration.checked)
    else:
        assert [d.kind for d in last.corroboration.disagreements] == ["memory_unseen"], last.summary
