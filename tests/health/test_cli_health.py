"""``gpuguard health run``: config and flags reach the check, table or JSON is printed, the status is the exit code."""

from __future__ import annotations

import contextlib
import io
import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from types import ModuleType
from typing import Any, Dict, Iterator, Optional
from unittest.mock import ANY

import pytest

from agent.cli import main
from agent.health.launch import ProbeOutcome
from agent.health.runner import run_health_check
from agent.health.sandbox import probe_user_command, remove_temporary_home, resolve_sandbox
from agent.health.settings import HealthSettings
from tests import needs
from tests.conftest import fill_disk
from tests.health.helpers import (
    fake_probe_settings,
    hostile_interpreter,
    make_fake_nvml,
    make_host,
    memory_unverified,
    shared_directory,
    small_filesystem,
    without_pid_namespace,
)

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.timeout(60)


def config_without_torch(tmp_path: Path) -> Path:
    """A config whose probe environment shadows torch with a package that cannot be imported."""
    site = tmp_path / "site" / "torch"
    site.mkdir(parents=True)
    (site / "__init__.py").write_text("raise ImportError(\"No module named 'torch'\")\n")
    config = tmp_path / "agent.toml"
    me = pwd.getpwuid(os.geteuid()).pw_name  # the probe runs as the test's user (root here: configured explicitly)
    config.write_text(f"[health]\ntimeout_seconds = 30\nrun_as = \"{me}\"\n"
                      f"python_path = [\"{tmp_path / 'site'}\"]\n")
    return config


def gpu_root(tmp_path: Path) -> Path:
    """A host root with one NVIDIA GPU's device node (/dev/nvidia0): a host the check has something to check on."""
    root = tmp_path / "gpu-root"
    (root / "dev").mkdir(parents=True)
    (root / "dev" / "nvidia0").write_text("")
    return root


def run_cli(tmp_path: Path, *args: str, modules: Optional[Dict[str, ModuleType]] = None,
            config: Optional[Path] = None, root: Optional[Path] = None) -> tuple:
    out = io.StringIO()
    host_root = root or gpu_root(tmp_path)
    code = main(["health", "run", "--config", str(config or config_without_torch(tmp_path)), "--state-dir",
                 str(tmp_path / "state"), "--python", sys.executable, *args],
                make_host=lambda _: make_host(modules, root=host_root), out=out)
    return code, out.getvalue()


def test_table_and_exit_code(tmp_path: Path) -> None:
    """Without a framework the command prints a SKIPPED table and exits 24."""
    code, text = run_cli(tmp_path)
    assert code == 24
    assert text.startswith("health   SKIPPED  skipped: no framework")


def test_json_output(tmp_path: Path) -> None:
    """--json prints the whole result as JSON, including the probe's argv (isolated, -I) with the throttle flag."""
    code, text = run_cli(tmp_path, "--json", "--throttle-fraction", "0.15", "--timeout-seconds", "20")
    data = json.loads(text)
    assert code == 24 and data["status"] == "skipped"
    assert data["probe_argv"][:6] == [sys.executable, "-I", "-u", data["probe_argv"][3], "--throttle-fraction",
                                      "0.15"]
    assert data["probe_argv"][data["probe_argv"].index("--rank-timeout-seconds") + 1] == "15"
    assert (tmp_path / "state" / "health" / "last.json").exists()


def test_bad_flag_value_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """A throttle outside [0, 1) is refused with one line and exit code 2."""
    code, _ = run_cli(tmp_path, "--throttle-fraction", "1.5")
    assert code == 2
    assert "throttle_fraction" in capsys.readouterr().err


def test_mode_full_on_a_busy_gpu_is_deferred(tmp_path: Path) -> None:
    """--mode full waits while another job uses the GPU: DEFERRED, exit 26, the tenant named in the table."""
    nvml = make_fake_nvml([[80.0]], processes=[[[(4242, 1 << 30)]]])
    code, text = run_cli(tmp_path, "--mode", "full", modules={"pynvml": nvml})
    assert code == 26
    assert text.startswith("health   DEFERRED  deferred: busy, waiting for idle GPUs (GPU 0: in use by pid 4242")
    assert "busy     GPU 0" in text


def config_with_missing_probe_user(tmp_path: Path) -> Path:
    """A config as a source install has it: the default probe user's place taken by one that does not exist."""
    config = tmp_path / "missing-user.toml"
    config.write_text("[health]\ntimeout_seconds = 30\nrun_as = \"gpuguard-no-such-probe-user\"\n")
    return config


def test_gpuless_host_is_skipped_before_the_probe_user_is_looked_up(tmp_path: Path) -> None:
    """As root without the probe user on a host without GPUs, health run says skipped (24), no probe, no failure."""
    gpuless = tmp_path / "gpuless-root"
    (gpuless / "sys" / "bus" / "pci" / "devices").mkdir(parents=True)
    code, text = run_cli(tmp_path, "--json", config=config_with_missing_probe_user(tmp_path), root=gpuless)
    data = json.loads(text)
    assert (code, data["status"]) == (24, "skipped")
    assert data["summary"].startswith("skipped: no GPU on this host")
    assert data["probe_argv"] == [] and data["failures"] == [] and data["sandbox"] is None


def test_missing_probe_user_as_root_is_a_setup_error_with_the_packages_useradd_line(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """As root with GPUs and no probe user, health run exits 15 with one line: the packages' own useradd command."""
    if os.geteuid() != 0:
        needs.unavailable("the missing-probe-user test", "it must run as root (a non-root agent never switches)")
    code, text = run_cli(tmp_path, "--json", config=config_with_missing_probe_user(tmp_path))
    err = capsys.readouterr().err.strip()
    assert (code, text) == (15, "")
    assert len(err.splitlines()) == 1 and "user 'gpuguard-no-such-probe-user' does not exist" in err
    assert not (tmp_path / "state" / "health" / "last.json").exists()  # no verdict recorded
    packaged = probe_user_command()
    spec = " ".join((REPO / "packaging" / "rpm" / "gpuguard.spec.in").read_text().replace("\\\n", " ").split())
    assert packaged in spec  # the line the rpm's %post runs, word for word
    assert probe_user_command("gpuguard-no-such-probe-user") in err


def test_not_root_runs_the_probe_as_itself_whatever_run_as_says(tmp_path: Path) -> None:
    """A non-root agent never looks up run_as: even a missing probe user leaves the probe running as the agent."""
    nobody = pwd.getpwnam("nobody")
    settings = HealthSettings(run_as="gpuguard-no-such-probe-user")
    sandbox = resolve_sandbox(settings, str(tmp_path), euid=nobody.pw_uid)
    remove_temporary_home(sandbox)
    assert (sandbox.user, sandbox.uid, sandbox.dropped, sandbox.popen_kwargs()) == ("nobody", nobody.pw_uid, False, {})


HOLD_LOCK = r"""
import fcntl, json, os, sys, time
path, hold_seconds = sys.argv[1], float(sys.argv[2])
os.makedirs(os.path.dirname(path), exist_ok=True)
stream = open(path, "a+")
fcntl.flock(stream.fileno(), fcntl.LOCK_EX)
stream.truncate(0)
stream.write(json.dumps({"pid": os.getpid(), "started_at": "2026-01-01T00:00:00+00:00", "probe_session": None,
                         "probe_uid": None}))
stream.flush()
print("held", flush=True)
time.sleep(hold_seconds)
"""


@contextlib.contextmanager
def lock_held_by_another_process(state: Path, hold_seconds: float) -> Iterator[subprocess.Popen]:
    """A second process (as the daemon's health child would be) holding the health-check lock of ``state``."""
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(state / "health" / "check.lock"),
                               str(hold_seconds)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        yield holder
    finally:
        holder.kill()
        holder.wait(timeout=10)


def test_a_check_still_running_after_the_wait_is_deferred_and_named(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """While another process holds the check lock past --wait-seconds, health run waits (saying so), then answers
    deferred (exit 26) naming the holder's pid, records no last result and starts no probe."""
    with lock_held_by_another_process(tmp_path / "state", 60) as holder:
        started = time.monotonic()
        code, text = run_cli(tmp_path, "--json", "--wait-seconds", "0.5")
        waited = time.monotonic() - started
    data = json.loads(text)
    err = capsys.readouterr().err
    assert (code, data["status"]) == (26, "deferred")
    assert f"another health check is still running (pid {holder.pid}" in data["summary"]
    assert f"another health check is running (pid {holder.pid}" in err and "waiting up to 0.5 s" in err
    assert 0.5 <= waited < 10 and data["probe_argv"] == []
    assert not (tmp_path / "state" / "health" / "last.json").exists()


def test_health_run_waits_for_the_running_check_then_runs(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """A check lock released after about 1.5 s: health run says it waits, then runs its own check (the probe ran)."""
    with lock_held_by_another_process(tmp_path / "state", 1.5) as holder:
        started = time.monotonic()
        code, text = run_cli(tmp_path, "--json", "--wait-seconds", "30")
        waited = time.monotonic() - started
    data = json.loads(text)
    assert f"another health check is running (pid {holder.pid}" in capsys.readouterr().err
    assert (code, data["status"]) == (24, "skipped") and data["summary"].startswith("skipped: no framework")
    assert waited >= 1.0 and data["probe_argv"]
    record = json.loads((tmp_path / "state" / "health" / "check.lock").read_text())
    assert record["pid"] == os.getpid() and record["probe_session"] is not None  # this check's probe, recorded


def test_the_lock_is_held_for_the_whole_check(tmp_path: Path) -> None:
    """While the probe runs, another process cannot take the check lock, and the record names the probe."""
    seen: Dict[str, object] = {}
    try_lock = ("import fcntl, sys\nstream = open(sys.argv[1], 'a+')\n"
                "try:\n    fcntl.flock(stream.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)\n    print('free')\n"
                "except BlockingIOError:\n    print('held')\n")

    def launcher(argv: Any, env: Any, timeout_seconds: float, on_timeout: Any = None, sandbox: Any = None,
                 on_start: Any = None, supervise: bool = True) -> ProbeOutcome:
        probe = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], start_new_session=True)
        try:
            on_start(probe.pid)
            lock = tmp_path / "state" / "health" / "check.lock"
            seen["other"] = subprocess.run([sys.executable, "-c", try_lock, str(lock)], capture_output=True,
                                           text=True, timeout=30, check=True).stdout.strip()
            seen["record"], seen["probe"] = json.loads(lock.read_text()), probe.pid
        finally:
            probe.kill()
            probe.wait(timeout=10)
        return ProbeOutcome(tuple(argv), 0, "", "", False, 0.1)

    run_health_check(make_host(root=gpu_root(tmp_path)), fake_probe_settings(), str(tmp_path / "state"),
                     launcher=launcher)
    assert seen["other"] == "held"
    assert seen["record"] == {"pid": os.getpid(), "started_at": ANY, "probe_session": seen["probe"],
                              "probe_uid": os.geteuid()}


# --- a probe with nothing to keep, limits on its whole tree, a full disk (issue #39) ---

def run_hostile(state: Path, python: Path, mode_file: Path, mode: str, tmp_path: Path, run_as: str = "nobody",
                **settings: Any) -> tuple:
    """``gpuguard health run --json`` with the hostile interpreter in ``mode`` on a GPU host whose GPU worked."""
    if os.geteuid() != 0:
        needs.unavailable("the hostile-probe tests", "they must run as root to start the probe as nobody")
    mode_file.write_text(mode)
    config = tmp_path / f"agent-{uuid.uuid4().hex[:6]}.toml"
    extra = "".join(f"{key} = {value!r}\n" for key, value in settings.items())
    config.write_text(f'[health]\npython = "{python}"\nrun_as = "{run_as}"\ntimeout_seconds = 30\n'
                      "activity_interval_seconds = 0.01\nbusy_utilization_confirm_seconds = 0.01\n"
                      f"baseline_runs = 3\n{extra}")
    out = io.StringIO()
    root = tmp_path / "gpu-root" if (tmp_path / "gpu-root").exists() else gpu_root(tmp_path)
    code = main(["health", "run", "--json", "--config", str(config), "--state-dir", str(state)],
                make_host=lambda _: make_host({"pynvml": make_fake_nvml([[0.0], [97.0]])}, root=root), out=out)
    return code, (json.loads(out.getvalue()) if out.getvalue().strip() else None)


def test_a_planted_usercustomize_does_not_make_the_next_run_lie(tmp_path: Path) -> None:
    """A hostile run plants usercustomize.py, sitecustomize.py and a .pth in its home; the next honest run (no
    framework) is still skipped: a fresh home each run, and the interpreter starts isolated (-I)."""
    with shared_directory() as shared:
        python, mode = hostile_interpreter(shared)
        state = shared / "state"
        code, hostile = run_hostile(state, python, mode, "plant", tmp_path)
        assert code == 0, hostile
        code, honest = run_hostile(state, python, mode, "skip", tmp_path)
        assert (code, honest["status"]) == (24, "skipped"), honest["summary"]
        assert not Path(hostile["sandbox"]["home"]).exists(), "the hostile run's home was removed"


def test_a_setsid_child_over_the_memory_limit_is_killed(tmp_path: Path) -> None:
    """A grandchild in its own session holding 200 MiB under memory_max_bytes = 64 MiB is killed within seconds and
    the check is failed, killed_for_memory set: the watchdog counts every process below the supervisor."""
    with shared_directory() as shared:
        python, mode = hostile_interpreter(shared)
        code, result = run_hostile(shared / "state", python, mode, "setsid-hog --hog-mib 200", tmp_path,
                                   memory_max_bytes=64 << 20)
        assert (code, result["status"]) == (22, "failed"), result["summary"]
        assert result["sandbox"]["killed_for_memory"], result["sandbox"]
        assert "killed for its host memory" in result["summary"]
        assert result["wall_seconds"] < 45, "killed well before the probe's own 60 s were up"


@pytest.mark.parametrize("containment", ["as the host allows", "subreaper"])
def test_a_probe_filling_its_home_leaves_the_state_and_the_next_check_alone(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch,
                                                                            containment: str) -> None:
    """The state directory and the probe's home share a 32 MiB filesystem; a probe writing 64 MiB into its home is
    held to home_max_bytes (8 MiB; a tmpfs in a PID namespace, else a watched directory that may fill the disk for
    a moment), its home is removed before any state is written, the next honest check passes and baselines.json is
    whole."""
    if containment == "subreaper":
        without_pid_namespace(monkeypatch)
    with small_filesystem(32) as disk, shared_directory() as shared:
        python, mode = hostile_interpreter(shared)
        monkeypatch.setattr(tempfile, "tempdir", str(disk))  # the per-run homes land on the state's filesystem
        state = disk / "state"
        code, first = run_hostile(state, python, mode, "pass", tmp_path, home_max_bytes=8 << 20)
        assert code == 0, first["summary"]
        baselines = (state / "health" / "baselines.json").read_text()
        code, hostile = run_hostile(state, python, mode, "fill --fill-mib 64", tmp_path, home_max_bytes=8 << 20)
        assert hostile is not None and hostile["sandbox"]["home_limit"].startswith(("tmpfs", "directory"))
        usage = shutil.disk_usage(disk)
        assert usage.used < 4 << 20, f"what the probe wrote is gone ({usage.used} bytes used)"
        assert sorted(p.name for p in disk.iterdir()) == ["state"]
        code, honest = run_hostile(state, python, mode, "pass", tmp_path, home_max_bytes=8 << 20)
        assert (code, honest["status"]) == (0, "pass"), honest["summary"]
        after = json.loads((state / "health" / "baselines.json").read_text())
        assert len(json.dumps(after)) >= len(baselines) - 2, "the honest runs are all there"


def test_a_full_state_filesystem_exits_16_and_keeps_the_old_baselines(tmp_path: Path) -> None:
    """With the state directory's filesystem full, `health run` exits 16 (a state write failed) and
    baselines.json stays as it was; it did exit 4 ("baselines.json: No space left on device")."""
    with small_filesystem(4) as disk, shared_directory() as shared:
        python, mode = hostile_interpreter(shared)
        state = disk / "state"
        code, first = run_hostile(state, python, mode, "pass", tmp_path)
        assert code == 0, first["summary"]
        baselines = (state / "health" / "baselines.json").read_bytes()
        fill_disk(disk / "filler")
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            code, _ = run_hostile(state, python, mode, "pass", tmp_path)
        assert code == 16, err.getvalue()
        assert (state / "health" / "baselines.json").read_bytes() == baselines
def forged_cli(tmp_path: Path, *probe_args: str, model: str = "NVIDIA H200", gpus: int = 1,
               config_lines: str = "", modules: Optional[Dict[str, ModuleType]] = None) -> tuple:
    """``gpuguard health run --json`` on a root modelled on a real NVIDIA host (no SMI library unless ``modules``
    gives one: the inventory is the snapshot's /proc/driver/nvidia), with a host interpreter that makes the probe
    print ``probe_args``' result."""
    from tests.health.helpers import nvidia_root, wrapper_python

    tmp_path.mkdir(parents=True, exist_ok=True)
    python = wrapper_python(tmp_path, *probe_args)
    config = tmp_path / "forged.toml"
    config.write_text(f"[health]\ntimeout_seconds = 30\nrun_as = \"{pwd.getpwuid(os.geteuid()).pw_name}\"\n"
                      f"python = \"{python}\"\n{config_lines}")
    out = io.StringIO()
    root = nvidia_root(tmp_path, model, gpus)
    code = main(["health", "run", "--json", "--config", str(config), "--state-dir", str(tmp_path / "state")],
                make_host=lambda _: make_host(modules or {}, root=root), out=out)
    return code, json.loads(out.getvalue())


HONEST = [
    pytest.param(("--gpus", "2", "--name", "NVIDIA H100 80GB HBM3", "--gemm", "700", "--copy", "3000"),
                 "NVIDIA H100 80GB HBM3", 2, id="h100x2"),
    # docs/hardware.md: the real probe on the H200, 792 TFLOP/s bf16 and 4269 GB/s copy at best.
    pytest.param(("--gemm", "792", "--copy", "4269"), "NVIDIA H200", 1, id="h200-real-figures"),
]


@pytest.mark.parametrize("probe_args,model,gpus", HONEST)
def test_an_honest_result_on_a_real_hosts_inventory_passes_and_says_what_was_corroborated(
        tmp_path: Path, probe_args: tuple, model: str, gpus: int) -> None:
    """An honest result on an inventory modelled on a real host passes, and --json lists the checks that held."""
    code, data = forged_cli(tmp_path, *probe_args, model=model, gpus=gpus)
    assert (code, data["status"]) == (0, "pass"), data["summary"]
    corroboration = data["corroboration"]
    assert corroboration["disagreements"] == [] and corroboration["inventory_gpu_count"] == gpus
    assert any(line.startswith(f"GPU count: {gpus} <= {gpus}") for line in corroboration["checked"])
    assert any("datasheet peaks" in line and "(root's inventory)" in line for line in corroboration["checked"])


FORGED_CLI = [
    pytest.param(("--gpus", "3"), 2, "", "more_gpus_than_host", id="3-gpus-on-a-2-gpu-host"),
    pytest.param(("--gpus", "8"), 1, "expected_gpu_count = 1\n", "more_gpus_than_host", id="8-gpus-expected-1"),
    pytest.param(("--forge", "unlisted-index"), 1, "", "unlisted_index", id="figures-for-an-unlisted-index"),
    pytest.param(("--forge", "duplicate-index"), 1, "", "duplicate_gpu", id="one-gpu-twice-by-index"),
    pytest.param(("--gpus", "2", "--forge", "duplicate-uuid"), 2, "", "duplicate_gpu", id="one-gpu-twice-by-uuid"),
    pytest.param(("--forge", "negative-time"), 1, "", "impossible_time", id="negative-time"),
    pytest.param(("--forge", "zero-time"), 1, "", "impossible_time", id="zero-time"),
    pytest.param(("--name", "NVIDIA H100 80GB HBM3", "--gemm", "5000"), 1, "", "above_peak",
                 id="5000-tflops-on-an-h100"),
]


@pytest.mark.parametrize("probe_args,gpus,config_lines,kind", FORGED_CLI)
def test_health_run_fails_a_result_the_host_cannot_have_and_names_why(
        tmp_path: Path, probe_args: tuple, gpus: int, config_lines: str, kind: str) -> None:
    """``health run`` answers failed (exit 22) for a result that disagrees with root's own inventory, naming the
    disagreement's kind, and records nothing of it in the baseline."""
    model = "NVIDIA H100 80GB HBM3" if "above_peak" == kind else "NVIDIA H200"
    code, data = forged_cli(tmp_path, *probe_args, model=model, gpus=gpus, config_lines=config_lines)
    assert (code, data["status"]) == (22, "failed"), data["summary"]
    assert kind in [d["kind"] for d in data["corroboration"]["disagreements"]]
    assert f"not corroborated ({kind})" in data["summary"] or any(kind in f for f in data["failures"])
    assert not (tmp_path / "state" / "health" / "baselines.json").exists()


@pytest.mark.parametrize("forge,reason", [("duplicate-key", "duplicate key 'device_count'"),
                                          ("non-utf8", "not UTF-8 (byte 0xff")])
def test_health_run_refuses_a_result_line_that_is_not_strict_json(tmp_path: Path, forge: str, reason: str) -> None:
    """A result line with a key named twice or a byte that is not UTF-8 is failed, the reason named."""
    code, data = forged_cli(tmp_path, "--forge", forge)
    assert (code, data["status"]) == (22, "failed"), data["summary"]
    assert reason in data["summary"]


# --- device memory root's SMI library saw during the run (issue #39) ---

GIB = 1 << 30


@pytest.mark.parametrize("used_bytes,status,code", [
    pytest.param([[GIB // 2], [GIB // 2], [GIB // 2 + 9 * GIB]], "pass", 0, id="memory-rose"),
    pytest.param([[GIB // 2]], "failed", 22, id="memory-flat"),
])
def test_health_run_holds_the_memory_claim_against_nvmls_readings(tmp_path: Path, used_bytes: list, status: str,
                                                                  code: int) -> None:
    """``health run``: a result claiming an 8 GiB peak passes where NVML saw 9 GiB more in use during the run, and is
    failed (exit 22, memory_unseen) where memory in use never moved though utilization rose."""
    for attempt in range(3):
        nvml = make_fake_nvml([[0.0], [0.0], [97.0]], used_bytes=used_bytes)
        got, data = forged_cli(tmp_path / str(attempt), "--hold-seconds", "1", modules={"pynvml": nvml})
        if not memory_unverified(data["corroboration"]["unverified"]):
            break  # else a loaded machine left root's readings too sparse to judge: the rule said so, try again
    assert (got, data["status"]) == (code, status), data["summary"]
    corroboration = data["corroboration"]
    if status == "pass":
        assert any(line.startswith("GPU 0: device memory rose by 9216 MiB") for line in corroboration["checked"])
    else:
        assert [d["kind"] for d in corroboration["disagreements"]] == ["memory_unseen"]
        assert "not corroborated (memory_unseen)" in data["summary"]
