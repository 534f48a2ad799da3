"""The probe's user, environment and limits (issue #20): a broken or hostile ML stack must not harm the host."""

from __future__ import annotations

import importlib.util
import json
import os
import pwd
import subprocess
import sys
import sysconfig
import time
from pathlib import Path
from typing import Dict, Iterator, Tuple

import pytest

from agent.errors import SetupError
from agent.health.runner import PROBE_PATH, run_health_check
from agent.health.sandbox import (
    MemoryLimit,
    Sandbox,
    remove_temporary_home,
    resolve_sandbox,
    sandbox_env,
    tree_usage,
)
from agent.health.settings import MIB, HealthSettings
from tests import needs
from tests.health.helpers import (
    FAKE_PROBE,
    fake_probe_settings,
    make_fake_nvml,
    make_host,
    make_snapshot,
    shared_directory,
)

pytestmark = [pytest.mark.timeout(300)]
GIB_ = 1 << 30

NO_GPU_ENV = {"CUDA_VISIBLE_DEVICES": "", "HIP_VISIBLE_DEVICES": "", "ROCR_VISIBLE_DEVICES": ""}


@pytest.fixture
def shared_state() -> Iterator[Path]:
    """A state directory another user can reach (pytest's own tmp tree is root-only)."""
    with shared_directory() as path:
        yield path


def test_not_root_runs_as_the_agents_user_and_says_so(tmp_path: Path) -> None:
    """An agent that is not root cannot drop privileges: the probe runs as its user, and the note says so."""
    nobody = pwd.getpwnam("nobody")
    sandbox = resolve_sandbox(HealthSettings(), str(tmp_path), euid=nobody.pw_uid)
    try:
        assert (sandbox.user, sandbox.dropped) == ("nobody", False)
        assert sandbox.reaper_args() == ["--home", sandbox.home, "--home-max-bytes", str(GIB_)]
        assert "the agent is not root" in sandbox.notes[0]
        assert sandbox.rlimits == {"RLIMIT_CPU": 7200, "RLIMIT_NOFILE": 4096, "RLIMIT_CORE": 0,
                                   "RLIMIT_FSIZE": GIB_}
    finally:
        remove_temporary_home(sandbox)


def test_missing_run_as_user_is_one_line_naming_the_setting(tmp_path: Path) -> None:
    """A run_as user that does not exist is refused (never silently root), naming [health] run_as."""
    with pytest.raises(SetupError, match=r"\[health\] run_as: user 'gpuguard-no-such-user' does not exist"):
        resolve_sandbox(HealthSettings(run_as="gpuguard-no-such-user"), str(tmp_path), euid=0)
    with pytest.raises(ValueError, match="run_as must be a user name"):
        HealthSettings(run_as="a b")


def test_environment_keeps_the_frameworks_variables_only() -> None:
    """Credentials, agents and the agent's HOME stay out; PATH and CUDA/ROCm variables pass; HOME is the probe's."""
    base = {"PATH": "/usr/bin", "LD_LIBRARY_PATH": "/opt/rocm/lib", "CUDA_VISIBLE_DEVICES": "0",
            "HSA_OVERRIDE_GFX_VERSION": "9.4.2", "HOME": "/root", "AWS_SECRET_ACCESS_KEY": "x",
            "SSH_AUTH_SOCK": "/tmp/agent", "SUDO_USER": "admin", "GPUGUARD_HUB_TOKEN": "secret"}
    base["PYTHONPATH"], base["PYTHONSTARTUP"] = "/home/x/site", "/home/x/start.py"
    sandbox = Sandbox("gpuguard-probe", 999, 999, [44, 993], True, "/tmp/gpuguard-probe-x/home", GIB_, {})
    env = sandbox_env(base, sandbox)
    assert env == {"PATH": "/usr/bin", "LD_LIBRARY_PATH": "/opt/rocm/lib", "CUDA_VISIBLE_DEVICES": "0",
                   "HSA_OVERRIDE_GFX_VERSION": "9.4.2", "HOME": "/tmp/gpuguard-probe-x/home",
                   "TMPDIR": "/tmp/gpuguard-probe-x/home", "USER": "gpuguard-probe", "LOGNAME": "gpuguard-probe"}
    assert sandbox.reaper_args() == ["--uid", "999", "--gid", "999", "--groups", "44,993"]


def interpreter_for(user: pwd.struct_passwd) -> Tuple[str, Dict[str, str]]:
    """This test's interpreter with its torch, as ``user`` can run it: itself, or (when it lives where the user cannot
    reach, e.g. under /root) the system's python3 of the same release with this interpreter's site-packages."""
    candidates = [(sys.executable, {}),
                  (f"/usr/bin/python{sys.version_info[0]}.{sys.version_info[1]}",
                   {"PYTHONPATH": sysconfig.get_paths()["purelib"]})]
    for python, env in candidates:
        try:
            done = subprocess.run([python, "-c", "import torch"], user=user.pw_uid, group=user.pw_gid,
                                  extra_groups=[], env={**NO_GPU_ENV, **env}, capture_output=True, timeout=60,
                                  cwd="/", check=False)
        except OSError:
            continue
        if done.returncode == 0:
            return python, env
    needs.unavailable("the privilege-drop test", f"no interpreter with torch that {user.pw_name} can run")


def test_real_probe_runs_as_nobody(shared_state: Path) -> None:
    """As root, the real probe (torch on the CPU, GPUs hidden) runs as nobody and reports nobody's uid."""
    if os.geteuid() != 0:
        needs.unavailable("the privilege-drop test", "it must run as root to start the probe as nobody")
    if importlib.util.find_spec("torch") is None:
        needs.unavailable("probe tests with PyTorch", "torch is not installed (pip install -e '.[probe]')")
    nobody = pwd.getpwnam("nobody")
    python, env = interpreter_for(nobody)
    settings = HealthSettings(python=python, run_as="nobody", probe_args=["--size", "small"],
                              extra_env=NO_GPU_ENV, python_path=[d for d in env.get("PYTHONPATH", "").split(":") if d],
                              timeout_seconds=100, require_accelerator=False, memory_max_bytes=8 << 30)
    result = run_health_check(make_host(), settings, str(shared_state), snapshot=make_snapshot(nvidia_gpus=0),
                              probe_path=PROBE_PATH)
    assert result.probe is not None, (result.summary, result.probe_stderr_tail)
    assert (result.probe.uid, result.probe.gid) == (nobody.pw_uid, nobody.pw_gid)
    assert 0 not in result.probe.groups
    assert result.sandbox is not None and result.sandbox.dropped and result.sandbox.user == "nobody"
    assert result.sandbox.rlimits["RLIMIT_NPROC"] == 4096
    assert result.sandbox.home is not None and not Path(result.sandbox.home).exists(), "removed after the run"
    assert not (shared_state / "health" / "probe-home").exists()
    assert result.status == "pass", result.summary  # torch on the CPU, judged as a CPU run


def test_memory_hog_is_killed_and_reported(tmp_path: Path) -> None:
    """A probe stand-in whose child takes 400 MiB under a 160 MiB limit is killed; the result names the limit."""
    settings = fake_probe_settings("--mode", "hog", "--hog-mib", "400", memory_max_bytes=160 * MIB)
    result = run_health_check(make_host({"pynvml": make_fake_nvml([[0.0]])}), settings, str(tmp_path / "state"),
                              snapshot=make_snapshot(), probe_path=FAKE_PROBE)
    assert result.status == "failed", result.summary
    assert result.sandbox is not None and result.sandbox.killed_for_memory is not None
    assert result.sandbox.memory_limit.startswith(("rss watchdog", "cgroup"))
    assert "killed for its host memory" in result.summary
    assert result.wall_seconds < 60  # the watchdog's kill, not the probe's 120 s timeout: load-proof


def test_limits_reach_the_probe(tmp_path: Path) -> None:
    """RLIMIT_CPU, RLIMIT_NOFILE and RLIMIT_CORE=0 hold in the probe's process."""
    limits = tmp_path / "limits.json"
    settings = fake_probe_settings("--limits-file", str(limits), cpu_seconds_max=321, open_files_max=222)
    result = run_health_check(make_host({"pynvml": make_fake_nvml([[0.0], [97.0]])}), settings,
                              str(tmp_path / "state"), snapshot=make_snapshot(), probe_path=FAKE_PROBE)
    assert result.status == "pass", result.summary
    assert json.loads(limits.read_text()) == {"RLIMIT_CPU": [321, 321], "RLIMIT_NOFILE": [222, 222],
                                              "RLIMIT_CORE": [0, 0]}


def test_cgroup_child_with_memory_max_where_the_agent_may_create_one(tmp_path: Path) -> None:
    """With a delegated cgroup v2 directory (memory enabled for children) the probe gets a child with memory.max."""
    own = tmp_path / "cg" / "system.slice" / "gpuguard.service"
    own.mkdir(parents=True)
    (own / "cgroup.subtree_control").write_text("cpu memory\n")
    (tmp_path / "self-cgroup").write_text("0::/system.slice/gpuguard.service\n")
    sandbox = Sandbox("x", 1, 1, [], False, None, 300 * MIB, {}, cgroup_root=str(tmp_path / "cg"),
                      own_cgroup_file=str(tmp_path / "self-cgroup"))
    limit = MemoryLimit(sandbox)
    assert limit.cgroup is not None and (limit.cgroup / "memory.max").read_text() == str(300 * MIB)
    limit.start(123456789)
    assert (limit.cgroup / "cgroup.procs").read_text() == "123456789"
    (limit.cgroup / "memory.events").write_text("low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\n")
    (limit.cgroup / "cgroup.procs").write_text("")
    description, killed = limit.finish()
    assert description.startswith("cgroup ") and "memory.max=314572800" in description
    assert killed is not None and "OOM kill" in killed
    # Without one (no 0:: line: cgroup v1), the watchdog takes over, and says why.
    (tmp_path / "self-cgroup").write_text("4:memory:/x\n")
    fallback = MemoryLimit(sandbox)
    fallback.start(os.getpid())
    description, killed = fallback.finish()
    assert description.startswith("rss watchdog 314572800 bytes over every process below the supervisor (no "
                                  "cgroup v2 memory.max: no cgroup v2")
    assert killed is None


def test_tree_usage_counts_every_process_below_the_root_sessions_included() -> None:
    """The watchdog's measure: resident memory and count of every process below a root, a setsid() child too."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], start_new_session=True)
    try:
        deadline = time.monotonic() + 10
        while tree_usage(os.getpid())[0] < 5 * MIB and time.monotonic() < deadline:
            time.sleep(0.05)
        rss, count = tree_usage(os.getpid())
        assert count >= 1 and rss > 5 * MIB
    finally:
        child.kill()
        child.wait()
    assert tree_usage(2 ** 22 + 12345) == (0, 0)


def test_every_run_gets_a_fresh_home_outside_the_state_directory(tmp_path: Path) -> None:
    """The probe's home is a new 0700 directory of its user inside a 0711 one of the agent's, never under the state
    directory nor the user's own home, and it is gone after remove_temporary_home."""
    _root_only("the probe-home test")
    state = tmp_path / "state"
    state.mkdir(mode=0o750)
    nobody = pwd.getpwnam("nobody")
    first = resolve_sandbox(HealthSettings(run_as="nobody"), str(state), euid=0)
    second = resolve_sandbox(HealthSettings(run_as="nobody"), str(state), euid=0)
    try:
        assert first.home is not None and second.home is not None and first.home != second.home
        home = Path(first.home)
        assert not first.home.startswith(str(state)) and home.parent == Path(str(first.run_dir))
        assert (home.stat().st_uid, oct(home.stat().st_mode & 0o777)) == (nobody.pw_uid, "0o700")
        assert (home.parent.stat().st_uid, oct(home.parent.stat().st_mode & 0o777)) == (0, "0o711")
        assert list(home.iterdir()) == []
    finally:
        remove_temporary_home(first)
        remove_temporary_home(second)
    assert not home.exists() and not home.parent.exists()


def test_limits_hold_for_a_dropped_user_without_cap_sys_resource(shared_state: Path) -> None:
    """The agent as a container's root (no CAP_SYS_RESOURCE, as on the H200 host): the probe runs as nobody and its
    limits still hold. Set from outside with prlimit(2) they failed there ("Operation not permitted") and the probe
    ran unlimited; its own interpreter now sets them on itself before it becomes the probe."""
    if os.geteuid() != 0:
        needs.unavailable("the privilege-drop test", "it must run as root to start the probe as nobody")
    setpriv = "/usr/bin/setpriv"
    if not os.access(setpriv, os.X_OK):
        needs.unavailable("the CAP_SYS_RESOURCE test", "setpriv (util-linux) is not installed")
    python = f"/usr/bin/python{sys.version_info[0]}.{sys.version_info[1]}"
    if not os.access(python, os.X_OK):
        python = "/usr/bin/python3"
    out = shared_state / "out"
    out.mkdir()
    out.chmod(0o777)  # the probe (nobody) writes its limits here
    script = f"""
import json
from agent.health.runner import run_health_check
from tests.health.helpers import FAKE_PROBE, fake_probe_settings, make_fake_nvml, make_host, make_snapshot
settings = fake_probe_settings("--limits-file", {str(out / "limits.json")!r}, python={python!r}, run_as="nobody",
                               cpu_seconds_max=321, open_files_max=222, processes_max=1234)
result = run_health_check(make_host({{"pynvml": make_fake_nvml([[0.0], [97.0]])}}), settings,
                          {str(shared_state / "state")!r}, snapshot=make_snapshot(), probe_path=FAKE_PROBE)
print(json.dumps({{"status": result.status, "summary": result.summary, "notes": result.sandbox.notes}}))
"""
    repo = str(Path(__file__).resolve().parents[2])
    done = subprocess.run([setpriv, "--bounding-set=-sys_resource", sys.executable, "-c", script],
                          capture_output=True, text=True, timeout=90, check=False,
                          env={**os.environ, "PYTHONPATH": repo}, cwd=repo)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["status"] == "pass", report
    assert not [n for n in report["notes"] if "not set" in n], report["notes"]
    assert json.loads((out / "limits.json").read_text()) == {"RLIMIT_CPU": [321, 321], "RLIMIT_NOFILE": [222, 222],
                                                             "RLIMIT_CORE": [0, 0]}


def test_limits_in_a_container_are_ulimit_options() -> None:
    """Limits become docker --ulimit options in a container, and a limits trampoline around a bare interpreter."""
    from agent.health.sandbox import docker_ulimits, with_limits

    limits = {"RLIMIT_CPU": 7200, "RLIMIT_NOFILE": 4096, "RLIMIT_CORE": 0, "RLIMIT_NPROC": 4096}
    assert docker_ulimits(limits) == ["--ulimit=core=0:0", "--ulimit=cpu=7200:7200", "--ulimit=nofile=4096:4096",
                                      "--ulimit=nproc=4096:4096"]
    argv = with_limits("python3", ["python3", "probe.py"], {"RLIMIT_CORE": 0})
    assert argv[:4] == ["python3", "-I", "-S", "-c"] and argv[5:] == ["RLIMIT_CORE=0", "python3", "probe.py"]
    assert with_limits("python3", ["python3", "probe.py"], {}) == ["python3", "probe.py"]


def _root_only(what: str) -> None:
    if os.geteuid() != 0:
        needs.unavailable(what, "it must run as root to give a directory to nobody")


def test_a_probe_home_owned_by_another_user_is_not_handed_to_the_probe(tmp_path: Path) -> None:
    """An existing probe-home in the state directory (a third user's) keeps its owner and its files; the probe gets a
    fresh one elsewhere."""
    _root_only("the foreign probe-home test")
    state = tmp_path / "state"
    foreign = state / "health" / "probe-home"
    foreign.mkdir(parents=True)
    (foreign / "secret").write_text("someone else's")
    os.chown(foreign, 4242, 4242)
    sandbox = resolve_sandbox(HealthSettings(run_as="nobody"), str(state), euid=0)
    try:
        assert foreign.stat().st_uid == 4242 and sandbox.home != str(foreign)
        assert (foreign / "secret").read_text() == "someone else's"
    finally:
        remove_temporary_home(sandbox)


def test_pythonpath_in_extra_env_is_refused_for_the_isolated_interpreter() -> None:
    """PYTHONPATH in extra_env would be ignored by the isolated interpreter (-I): a config error naming python_path;
    a container's interpreter still gets it."""
    with pytest.raises(ValueError, match=r"extra_env: PYTHONPATH would be ignored.*\[health\] python_path"):
        HealthSettings(extra_env={"PYTHONPATH": "/opt/ml"})
    assert HealthSettings(extra_env={"PYTHONPATH": "/opt/ml"}, container_image="ml:1").extra_env
    with pytest.raises(ValueError, match="not an absolute path"):
        HealthSettings(python_path=["lib"])


def test_without_a_namespace_the_watchdog_bounds_the_home(tmp_path: Path) -> None:
    """In subreaper mode (no private mounts, no tmpfs) a probe writing 64 MiB of 1 MiB files into its home is killed
    by the watchdog at home_max_bytes, and the report says the directory was checked."""
    from agent.health.launch import launch_probe

    me = pwd.getpwuid(os.geteuid()).pw_name
    sandbox = resolve_sandbox(HealthSettings(home_max_bytes=8 * MIB, run_as=me), str(tmp_path))
    try:
        argv = [sys.executable, str(FAKE_PROBE), "--mode", "fill", "--fill-mib", "64"]
        outcome = launch_probe(argv, sandbox_env({"PATH": os.environ["PATH"]}, sandbox), 20, sandbox=sandbox,
                               pid_namespace=False)
    finally:
        remove_temporary_home(sandbox)
    assert outcome.containment == "subreaper"
    assert outcome.killed_for_limit is not None and "its home holds" in outcome.killed_for_limit, outcome
    assert outcome.home_limit is not None and outcome.home_limit.startswith("directory checked by the watchdog")
    assert sandbox.home is not None and not Path(sandbox.home).exists()
