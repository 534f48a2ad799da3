"""The probe launcher against hostile fake probes: bounded output, and the whole process tree ended with the probe."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from agent.health.launch import OUTPUT_CAP_BYTES, BoundedCapture, launch_probe
from tests.health.helpers import FAKE_PROBE, gone_within, pids_with

pytestmark = pytest.mark.slow  # real processes per test: left out of `make test-fast`

REPO = Path(__file__).resolve().parents[2]

# Runs the launcher in a fresh interpreter and reports its peak resident memory before and after the probe.
_DRIVER = """
import json, sys
from agent.health.launch import launch_probe

def hwm():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024

before = hwm()
outcome = launch_probe(sys.argv[1:], {"PATH": "/usr/bin:/bin"}, 120.0)
print(json.dumps({"before": before, "after": hwm(), "stdout": len(outcome.stdout), "stderr": len(outcome.stderr),
                  "too_large": outcome.output_too_large, "returncode": outcome.returncode}))
"""


def test_bounded_capture_keeps_the_head_or_the_tail_and_counts_everything() -> None:
    """A capture keeps at most its cap (the first bytes, or the last with keep_tail) and counts every byte fed."""
    head, tail = BoundedCapture(cap_bytes=4), BoundedCapture(cap_bytes=4, keep_tail=True)
    for chunk in (b"abc", b"defgh", b"ij"):
        head.feed(chunk)
        tail.feed(chunk)
    assert (head.text(), tail.text(), head.total_bytes, head.overflowed) == ("abcd", "ghij", 10, True)


@pytest.mark.timeout(120)
def test_a_flooding_probe_does_not_grow_the_agent() -> None:
    """A probe printing 400 MiB on stdout and stderr leaves the launcher's peak memory within a few MiB of before."""
    argv = [sys.executable, str(FAKE_PROBE), "--mode", "flood", "--flood-mib", "400"]
    done = subprocess.run([sys.executable, "-c", _DRIVER, *argv], capture_output=True, text=True, timeout=110,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, check=True)
    report = json.loads(done.stdout.splitlines()[-1])
    assert report["after"] - report["before"] < 32 << 20, report
    assert report["stdout"] <= OUTPUT_CAP_BYTES and report["stderr"] <= OUTPUT_CAP_BYTES
    assert report["returncode"] == 0
    assert f"stderr {400 << 20} bytes > cap" in report["too_large"], report


@pytest.mark.timeout(300)
@pytest.mark.parametrize("pid_namespace", [True, False], ids=["pid-namespace", "subreaper"])
def test_a_setsid_grandchild_ends_with_the_probe(tmp_path: Path, pid_namespace: bool) -> None:
    """A grandchild the probe starts in its own session (sleep 600, pipes closed) is gone once the check returns."""
    token = f"gpuguard-test-escapee-{uuid.uuid4().hex}"
    argv = [sys.executable, str(FAKE_PROBE), "--mode", "setsid", "--token", token]
    try:
        # Not timed out at 120 s: the launch did not wait for the grandchild's 600 s (a bound a loaded machine
        # cannot reach); a grandchild still there 60 s on was left behind, not slow to die.
        outcome = launch_probe(argv, {"PATH": "/usr/bin:/bin"}, 120.0, pid_namespace=pid_namespace)
        assert outcome.returncode == 0 and not outcome.timed_out
        assert "GPUGUARD_PROBE_RESULT" in outcome.stdout
        assert gone_within(token, 60.0) == []
    finally:
        for pid in pids_with(token):  # only what this test started
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


@pytest.mark.timeout(300)
def test_a_timeout_ends_the_tree_in_subreaper_mode(tmp_path: Path) -> None:
    """Without a PID namespace, a hung probe's setsid grandchild still dies with it at the timeout."""
    token = f"gpuguard-test-escapee-{uuid.uuid4().hex}"
    code = ("import subprocess, sys, time\n"
            "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)', sys.argv[1]],"
            " start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
            "time.sleep(600)\n")
    try:
        outcome = launch_probe([sys.executable, "-c", code, token], {"PATH": "/usr/bin:/bin"}, 1.5,
                               pid_namespace=False)
        assert outcome.timed_out
        assert gone_within(token, 60.0) == []  # killed, not ended by its 600 s sleep
    finally:
        for pid in pids_with(token):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_a_command_that_cannot_start_is_a_start_error() -> None:
    """A missing interpreter is reported as the old launcher did: 'PATH: not found', no returncode."""
    outcome = launch_probe(["/nonexistent/python3", "probe.py"], {"PATH": "/usr/bin:/bin"}, 10.0)
    assert outcome.start_error == "/nonexistent/python3: not found" and outcome.returncode is None


def test_the_reaper_is_standalone_and_shares_the_launchers_marker() -> None:
    """reaper.py imports only the standard library (it runs as python -I -S) and words start errors as launch reads."""
    import ast

    from agent.health import launch, reaper

    tree = ast.parse(launch.REAPER_PATH.read_text())
    imported = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
                for alias in node.names}
    imported |= {node.module.split(".")[0] for node in ast.walk(tree)
                 if isinstance(node, ast.ImportFrom) and node.module}
    assert imported <= set(sys.stdlib_module_names), imported
    assert reaper.START_ERROR_MARKER == launch._START_ERROR_MARKER


def test_an_unsupervised_command_runs_itself_in_its_own_session() -> None:
    """supervise=False (a container runtime's client) runs argv directly: its pid is the command's, a session leader."""
    code = "import os; print(os.getpid() == os.getsid(0), os.readlink('/proc/self'))"
    seen = []
    outcome = launch_probe([sys.executable, "-c", code], {"PATH": "/usr/bin:/bin"}, 10.0, supervise=False,
                           on_start=seen.append)
    leader, pid = outcome.stdout.split()
    assert leader == "True" and [int(pid)] == seen


@pytest.mark.parametrize("pid_namespace", [True, False], ids=["pid-namespace", "subreaper"])
@pytest.mark.parametrize("code, returncode", [("import os, signal; os.kill(os.getpid(), signal.SIGTERM)", -15),
                                              ("import os, signal; os.kill(os.getpid(), signal.SIGKILL)", -9),
                                              ("import sys; sys.exit(3)", 3)])
def test_the_supervisor_ends_as_the_probe_did(pid_namespace: bool, code: str, returncode: int) -> None:
    """A probe that signals itself dies of it (it is no namespace init) and the launcher sees its code or signal."""
    outcome = launch_probe([sys.executable, "-c", code], {"PATH": "/usr/bin:/bin"}, 20.0, pid_namespace=pid_namespace)
    assert (outcome.returncode, outcome.timed_out, outcome.stderr) == (returncode, False, "")


def test_a_probe_in_its_pid_namespace_reads_its_own_proc_and_the_hosts_is_untouched() -> None:
    """The probe's PID and its /proc agree, as CUDA needs (with the host's /proc in a PID namespace torch saw no GPU
    on the H200): in a PID namespace the /proc is the namespace's own (PID 2, nothing but its init beside it); where
    no private mounts can be made (a chroot whose / is no mount point) no namespace is made either, and the probe
    reads the host's. The host's /proc is never remounted."""
    code = "import os; print(os.getpid(), os.readlink('/proc/self'), len([p for p in os.listdir('/proc') " \
           "if p.isdigit()]))"
    outcome = launch_probe([sys.executable, "-c", code], {"PATH": "/usr/bin:/bin"}, 20.0, pid_namespace=True)
    assert outcome.returncode == 0, outcome.stderr
    pid, self_link, processes = outcome.stdout.split()
    assert pid == self_link, outcome.stdout
    if pid == "2":  # in a PID namespace: its own /proc shows its init, the probe (and nothing else)
        assert int(processes) <= 3, outcome.stdout
    assert os.readlink("/proc/self") == str(os.getpid())
    with open("/proc/mounts") as mounts:
        assert sum(1 for line in mounts if line.split()[1] == "/proc") == 1
