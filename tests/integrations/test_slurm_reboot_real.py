"""Reboots through a real Slurm: the hand-off asks slurmctld to reboot the node gpuguard drained, a RebootProgram
(written here) restarts the slurmd this test started, by its PID, as a reboot would (``slurmd -b``, a new boot time
under the host root), and ``gpuguard status --slurm --drain`` as the HealthCheckProgram is the gate after the boot."""

from __future__ import annotations

import datetime as dt
import io
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Iterator, List, Tuple

import pytest

from agent import cli
from agent.host import Host, SubprocessRunner
from tests.integrations.test_slurm_real import PROGRAMS, REPO, SlurmCluster
from tests.needs import unavailable

pytestmark = pytest.mark.slow

HEALTH_INTERVAL_SECONDS = 3
NODE_WAIT_SECONDS = 60.0
FAKE_DAEMON_PID = 4242


class RebootSetup:
    """The host root the gate judges (a daemon process in its /proc, /proc/stat's boot time), gpuguard's state
    directory and configuration, and the reboot and health programs slurm.conf names."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.root = base / "root"
        self.state = base / "state"
        self.config = base / "agent.toml"
        self.slurmd_pid_file = base / "slurmd.test.pid"  # the PID of the slurmd this test (or its reboot) started
        self.gate_out = base / "gate.out"
        self.reboots = base / "reboots"
        self.restarted = base / "restarted"  # one PID a line: each slurmd a reboot started

    def prepare(self, node: str, conf: Path) -> Tuple[str, ...]:
        (self.root / "proc" / str(FAKE_DAEMON_PID)).mkdir(parents=True)
        (self.root / "proc" / str(FAKE_DAEMON_PID) / "cmdline").write_bytes(b"gpuguard\0run\0")
        self.set_boot_time(time.time() - 3600)
        for sub in ("health", "metrics"):
            (self.state / sub).mkdir(parents=True)
        # The state directory as the status command reads it (directly) and as the hand-off does (under the root).
        linked = self.root / str(self.state).lstrip("/")
        linked.parent.mkdir(parents=True)
        linked.symlink_to(self.state)
        self.config.write_text(f'[agent]\nstate_dir = "{self.state}"\n[integrations]\nscheduler = "slurm"\n'
                               f'slurm_node_name = "{node}"\n')
        self.write_snapshot(reboot_pending=True)
        self.write_health("pass", time.time() - 60)
        self.write_compliant()
        gate = self.base / "gate"
        gate.write_text(f"#!/bin/sh\nexport SLURM_CONF={conf}\ncd {REPO}\nPYTHONPATH={REPO} exec {sys.executable} "
                        f"-m agent status --slurm --drain --config {self.config} --root {self.root} --node-name "
                        f"{node} >> {self.gate_out} 2>&1\n")
        reboot = self.base / "reboot"
        # Returns at once, as reboot(8) does; the restart runs detached: stop the test's slurmd by its PID, "boot"
        # (a new btime under the host root), start slurmd again with -b (report a reboot to slurmctld).
        reboot.write_text(f"""#!/bin/sh
# the jobs still running or completing when slurmctld issued the reboot (none: it waited for the node to be idle)
echo "reboot running=[$(SLURM_CONF={conf} squeue -h -t R,CG -w {node} -o %i | tr -d '\\n')]" >> {self.reboots}
setsid sh -c '
pid=$(cat {self.slurmd_pid_file})
kill -TERM "$pid"
i=0
while [ $i -lt 100 ] && [ -e /proc/$pid ] && ! grep -q "^$pid ([^)]*) Z" /proc/$pid/stat; do sleep 0.1; i=$((i+1)); done
sleep 1.5  # a reboot takes time: btime has whole seconds, and the boot comes after the second of the ask
printf "btime %s\\n" "$(date +%s)" > {self.root}/proc/stat.new && mv {self.root}/proc/stat.new {self.root}/proc/stat
slurmd -D -b -f {conf} -N {node} >> {self.base}/slurmd-rebooted.out 2>&1 &
echo $! > {self.slurmd_pid_file}
echo $! >> {self.restarted}
' < /dev/null > /dev/null 2>&1 &
exit 0
""")
        for program in (gate, reboot):
            program.chmod(0o755)
        return (f"RebootProgram={reboot}", f"HealthCheckProgram={gate}",
                f"HealthCheckInterval={HEALTH_INTERVAL_SECONDS}", "HealthCheckNodeState=ANY", "ResumeTimeout=120")

    def set_boot_time(self, seconds: float) -> None:
        (self.root / "proc" / "stat").write_text(f"cpu  1 2 3 4\nbtime {int(seconds)}\n")

    def boot_time(self) -> int:
        return int((self.root / "proc" / "stat").read_text().split("btime ")[1].split()[0])

    def _write(self, path: Path, data: object) -> None:
        path.with_suffix(".tmp").write_text(json.dumps(data))
        os.replace(path.with_suffix(".tmp"), path)

    def write_snapshot(self, reboot_pending: bool) -> None:
        """The daemon's last snapshot: before the boot the next-boot kernel is not the running one."""
        findings = [{"kind": "reboot_pending", "severity": "info", "component": "kernel",
                     "message": "next boot uses kernel 6.8.0-45-generic, running 6.8.0-40-generic",
                     "details": {"running": "6.8.0-40-generic", "next_boot": "6.8.0-45-generic"}}]
        self._write(self.state / "last-snapshot.json",
                    {"taken_at": dt.datetime.now(dt.timezone.utc).isoformat(),
                     "findings": findings if reboot_pending else []})

    def write_compliant(self) -> None:
        """The daemon's metrics textfile: the stack complies with the pairing policy."""
        path = self.state / "metrics" / "gpuguard.prom"
        path.with_suffix(".tmp").write_text("gpuguard_compliant 1\n")
        os.replace(path.with_suffix(".tmp"), path)

    def write_health(self, status: str, started_at_seconds: float, summary: str = "") -> None:
        """The daemon's last health result, as it stores it."""
        started = dt.datetime.fromtimestamp(started_at_seconds, dt.timezone.utc).isoformat()
        self._write(self.state / "health" / "last.json",
                    {"status": status, "started_at": started, "wall_seconds": 1.0, "summary": summary})

    def stop_restarted_slurmd(self) -> None:
        """Stop each slurmd a reboot started (by the PIDs it wrote), never another process; a reboot still under way
        when a test ends is waited for (bounded) so that its slurmd is not left behind."""
        def lines(path: Path) -> List[str]:
            return path.read_text().splitlines() if path.exists() else []

        deadline = time.monotonic() + 15
        while len(lines(self.restarted)) < len(lines(self.reboots)) and time.monotonic() < deadline:
            time.sleep(0.2)
        for pid in (int(p) for p in lines(self.restarted)):
            if not _running(pid):
                continue
            os.kill(pid, signal.SIGTERM)
            stop = time.monotonic() + 10
            while _running(pid) and time.monotonic() < stop:
                time.sleep(0.1)
            if _running(pid):
                os.kill(pid, signal.SIGKILL)


def _running(pid: int) -> bool:
    """The process exists and is not a zombie."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


@pytest.fixture
def rebootable(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tuple[SlurmCluster, RebootSetup]]:
    """A one-node cluster whose RebootProgram restarts its slurmd and whose HealthCheckProgram is gpuguard's gate."""
    if os.geteuid() != 0:
        unavailable("the real Slurm reboot tests", "root (slurmd runs jobs as root here)")
    missing = [p for p in (*PROGRAMS, "sbatch", "squeue", "setsid") if shutil.which(p) is None]
    if missing:
        unavailable("the real Slurm reboot tests", f"{', '.join(missing)} (apt-get install slurm-wlm munge)")
    setup = RebootSetup(Path(tmp_path_factory.mktemp("reboot")))
    base = Path(tmp_path_factory.mktemp("slurm"))  # short: munge's socket path is bounded
    cluster = SlurmCluster(base, setup.prepare(socket.gethostname().split(".")[0], base / "slurm.conf"))
    try:
        cluster.start()
        setup.slurmd_pid_file.write_text(str(cluster.processes[-1].pid))
        yield cluster, setup
    finally:
        cluster.stop()
        setup.stop_restarted_slurmd()


def gpuguard(cluster: SlurmCluster, setup: RebootSetup, *argv: str) -> Tuple[int, str]:
    out = io.StringIO()
    runner = SubprocessRunner(extra_env={"SLURM_CONF": str(cluster.conf)})
    code = cli.main([*argv, "--config", str(setup.config), "--root", str(setup.root)],
                    make_host=lambda root: Host(root=Path(root), runner=runner), out=out)
    return code, out.getvalue()


def _job_state(cluster: SlurmCluster, job_id: str) -> str:
    return cluster.scontrol("show", "job", "-o", job_id).stdout


def _drain_to_reboot(cluster: SlurmCluster, setup: RebootSetup) -> None:
    """Drain the node for a rollout, pass the post-change check on a host whose next boot has another kernel:
    slurmctld is asked to reboot it; wait until it has "booted" and slurmd registered again; the boot time."""
    code, line = gpuguard(cluster, setup, "maintenance", "begin", "--reason", "rollout R stage 2",
                          "--wait-seconds", "0")
    assert code in (0, 40) and "DRAIN" in cluster.state(), line
    code, line = gpuguard(cluster, setup, "maintenance", "end", "--check", "pass")
    assert code == 42 and "reboot asked: kernel: next boot 6.8.0-45-generic, running 6.8.0-40-generic" in line, line


def _until(cluster: SlurmCluster, ready: Callable[[], bool], what: str, seconds: float = 30.0) -> None:
    """Poll ``ready`` (bounded); after the reboot the first slurmd has exited, so not the cluster's own wait."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if ready():
            return
        time.sleep(0.3)
    raise AssertionError(f"no {what} after {seconds:g} s: {cluster.state()} {cluster.reason()}: {cluster.logs()}")


def _phase(setup: RebootSetup) -> str:
    hold = setup.state / "maintenance.json"
    return str(json.loads(hold.read_text())["phase"]) if hold.exists() else ""


def _gate_runs(setup: RebootSetup) -> int:
    return setup.gate_out.read_text().count("\n") if setup.gate_out.exists() else 0


def _wait_rebooted(cluster: SlurmCluster, setup: RebootSetup, booted_before: int) -> None:
    """Until the reboot program ran and the restarted slurmd registered (the first slurmd has exited by then, so
    not the cluster's own wait, which fails on any exited daemon)."""
    def back() -> bool:
        state = cluster.state()
        return setup.boot_time() > booted_before and bool(state) and not any(w in state for w in ("REBOOT", "DOWN"))

    _until(cluster, back, "return from the reboot", NODE_WAIT_SECONDS)


def test_reboot_waits_for_the_job_and_the_node_returns_only_after_a_passing_check(
        rebootable: Tuple[SlurmCluster, RebootSetup]) -> None:
    """A running job finishes before the asked reboot (not killed); after the boot the node stays drained until a
    health check after the boot passes, then gpuguard's HealthCheckProgram gives it back."""
    cluster, setup = rebootable
    submitted = subprocess.run(["sbatch", "--parsable", "-o", "/dev/null", "--wrap", "sleep 6"], env=cluster.env,
                               capture_output=True, text=True, timeout=15, check=True)
    job_id = submitted.stdout.strip().split(";")[0]
    cluster._wait(lambda: "JobState=RUNNING" in _job_state(cluster, job_id), "the job running")
    booted_before = setup.boot_time()
    _drain_to_reboot(cluster, setup)
    assert "REBOOT_REQUESTED" in cluster.state() and "JobState=RUNNING" in _job_state(cluster, job_id)
    assert cluster.reason().startswith("gpuguard: maintenance: reboot: kernel: next boot 6.8.0-45-generic")
    cluster._wait(lambda: "JobState=COMPLETED" in _job_state(cluster, job_id), "the job completed", 30)
    assert "ExitCode=0:0" in _job_state(cluster, job_id)  # ran to its end: not killed, not requeued
    _wait_rebooted(cluster, setup, booted_before)
    assert setup.reboots.read_text() == "reboot running=[]\n"  # issued once the job had ended
    # Booted, but no health check since the boot: gpuguard's gate keeps it drained over several of its runs.
    runs = _gate_runs(setup)
    _until(cluster, lambda: _gate_runs(setup) >= runs + 2, "two more gate runs")
    assert "DRAIN" in cluster.state(), cluster.state()
    assert "health: no check since the boot" in setup.gate_out.read_text()
    setup.write_snapshot(reboot_pending=False)  # the daemon's snapshot after the boot: the new kernel runs
    setup.write_compliant()
    setup.write_health("pass", time.time())
    _until(cluster, lambda: "DRAIN" not in cluster.state() and _phase(setup) == "",
           "the node given back by the gate and the hold gone")
    assert cluster.state().split("+")[0] == "IDLE"
    assert setup.reboots.read_text() == "reboot running=[]\n"  # once: the passing check asked for no other


def test_a_failing_check_after_the_reboot_keeps_the_node_drained_with_its_reason(
        rebootable: Tuple[SlurmCluster, RebootSetup]) -> None:
    """A health check after the boot that finds no GPU keeps the rebooted node drained, the reason naming the
    check; the hold is kept for an operator."""
    cluster, setup = rebootable
    booted_before = setup.boot_time()
    _drain_to_reboot(cluster, setup)
    _wait_rebooted(cluster, setup, booted_before)
    setup.write_snapshot(reboot_pending=False)
    setup.write_compliant()
    setup.write_health("cpu_fallback", time.time(), "torch sees no GPU")
    _until(cluster, lambda: "post-boot check" in cluster.reason() and _phase(setup) == "kept",
           "the gate's reason and a kept hold")
    assert "DRAIN" in cluster.state()
    assert cluster.reason().startswith("gpuguard: maintenance: post-boot check: health: cpu_fallback"), \
        cluster.reason()
    assert "torch sees no GPU" in cluster.reason()
    time.sleep(HEALTH_INTERVAL_SECONDS * 2)  # later gate runs leave a kept node out
    assert "DRAIN" in cluster.state() and "post-boot check" in cluster.reason()
