"""The maintenance hand-off against a real Slurm: Debian's slurm-wlm (slurmctld + slurmd) and munge on 127.0.0.1,
started by the test in a temporary configuration with one node, killed by PID afterwards."""

from __future__ import annotations

import io
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator, List, Tuple

import pytest

from agent import cli
from agent.host import Host, SubprocessRunner
from agent.integrations.slurm_handoff import parse_node_line
from tests.needs import unavailable

pytestmark = pytest.mark.slow

PROGRAMS = ("munged", "slurmctld", "slurmd", "scontrol", "srun")
START_SECONDS = 30.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class SlurmCluster:
    """munged, slurmctld and slurmd of one node, in ``base``; each started here and stopped by its PID."""

    def __init__(self, base: Path, extra_conf: Tuple[str, ...] = ()) -> None:
        self.base = base
        self.extra_conf = extra_conf
        self.prolog_out = base / "prolog.out"  # where a test's Prolog writes what it printed
        self.node = socket.gethostname().split(".")[0]
        self.conf = base / "slurm.conf"
        self.env = dict(os.environ, SLURM_CONF=str(self.conf))
        self.processes: List[subprocess.Popen] = []

    def start(self) -> None:
        b = self.base
        for sub in ("munge", "state", "spool", "log"):
            (b / sub).mkdir(mode=0o700)
        key = b / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        socket_path = b / "munge" / "munge.socket"
        self.conf.write_text("\n".join([
            "ClusterName=gpuguardtest", f"SlurmctldHost={self.node}(127.0.0.1)",
            f"SlurmctldPort={_free_port()}", f"SlurmdPort={_free_port()}", "SlurmUser=root", "SlurmdUser=root",
            "AuthType=auth/munge", f"AuthInfo=socket={socket_path}", "CredType=cred/munge",
            f"StateSaveLocation={b}/state", f"SlurmdSpoolDir={b}/spool",
            f"SlurmctldPidFile={b}/slurmctld.pid", f"SlurmdPidFile={b}/slurmd.pid",
            f"SlurmctldLogFile={b}/log/slurmctld.log", f"SlurmdLogFile={b}/log/slurmd.log",
            "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none", "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none", "SchedulerType=sched/builtin",
            "SelectType=select/linear", "MpiDefault=none", "ReturnToService=2",
            f"NodeName={self.node} NodeAddr=127.0.0.1 NodeHostname={self.node} CPUs=1 RealMemory=1 State=UNKNOWN",
            f"PartitionName=debug Nodes={self.node} Default=YES MaxTime=10 State=UP", *self.extra_conf, ""]))
        self._spawn(["munged", "-F", "-f", f"--socket={socket_path}", f"--key-file={key}",
                     f"--pid-file={b}/munge/munged.pid", f"--log-file={b}/log/munged.log",
                     f"--seed-file={b}/munge/seed"])
        self._wait(lambda: socket_path.exists(), "munged's socket")
        self._spawn(["slurmctld", "-D", "-f", str(self.conf)])
        self._wait(lambda: self.scontrol("ping").returncode == 0, "slurmctld answering")
        self._spawn(["slurmd", "-D", "-f", str(self.conf), "-N", self.node])
        self._wait(lambda: self.state() == "IDLE", "the node IDLE")

    def _spawn(self, argv: List[str]) -> None:
        log = open(self.base / "log" / f"{argv[0]}.out", "wb")
        self.processes.append(subprocess.Popen(argv, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                               stdin=subprocess.DEVNULL))
        log.close()

    def _wait(self, ready: "object", what: str, seconds: float = START_SECONDS) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if ready():  # type: ignore[operator]
                return
            for process in self.processes:
                if process.poll() is not None:
                    raise AssertionError(f"{process.args[0]} exited {process.returncode} waiting for {what}: "
                                         f"{self.logs()}")
            time.sleep(0.2)
        raise AssertionError(f"no {what} after {seconds:g} s: {self.logs()}")

    def logs(self) -> str:
        return " | ".join(f"{p.name}: {p.read_text(errors='replace')[-600:]}"
                          for p in sorted((self.base / "log").iterdir()))

    def scontrol(self, *argv: str) -> subprocess.CompletedProcess:
        return subprocess.run(["scontrol", *argv], env=self.env, capture_output=True, text=True, timeout=15,
                              check=False)

    def state(self) -> str:
        result = self.scontrol("show", "node", "-o", self.node)
        return parse_node_line(result.stdout).state if result.returncode == 0 else ""

    def reason(self) -> str:
        return parse_node_line(self.scontrol("show", "node", "-o", self.node).stdout).reason or ""

    def stop(self) -> None:
        for process in reversed(self.processes):  # slurmd, slurmctld, then munged
            if process.poll() is None:
                process.terminate()
                try:
                    process.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait(timeout=10)


def _cluster(tmp_path_factory: pytest.TempPathFactory, *extra_conf: str) -> Iterator[SlurmCluster]:
    if os.geteuid() != 0:
        unavailable("the real Slurm tests", "root (slurmd runs jobs as root here)")
    missing = [p for p in PROGRAMS if shutil.which(p) is None]
    if missing:
        unavailable("the real Slurm tests", f"{', '.join(missing)} (apt-get install slurm-wlm munge)")
    # A short directory: munge's socket path is bounded.
    cluster = SlurmCluster(Path(tmp_path_factory.mktemp("slurm")), extra_conf)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    yield from _cluster(tmp_path_factory)


REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def slurm_with_prolog(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    """A cluster whose Prolog is ``gpuguard status --slurm`` on a host root where no daemon runs (a drain verdict)."""
    base = Path(tmp_path_factory.mktemp("prolog"))
    (base / "root/proc").mkdir(parents=True)
    (base / "root/var/lib/gpuguard").mkdir(parents=True)
    (base / "agent.toml").write_text(f'[agent]\nstate_dir = "{base}/root/var/lib/gpuguard"\n')
    prolog = base / "prolog"
    prolog.write_text(f"#!/bin/sh\ncd {REPO}\nPYTHONPATH={REPO} {sys.executable} -m agent status --slurm "
                      f"--config {base}/agent.toml --root {base}/root > {base}/prolog.out 2>&1\n")
    prolog.chmod(0o755)
    for cluster in _cluster(tmp_path_factory, f"Prolog={prolog}"):
        cluster.prolog_out = base / "prolog.out"
        yield cluster


def gpuguard(cluster: SlurmCluster, tmp: Path, *argv: str) -> Tuple[int, str]:
    config = tmp / "agent.toml"
    if not config.exists():
        config.write_text(f'[agent]\nstate_dir = "{tmp / "state"}"\n[integrations]\nscheduler = "slurm"\n'
                          f'slurm_node_name = "{cluster.node}"\ndrain_poll_seconds = 0.5\n')
    out = io.StringIO()
    runner = SubprocessRunner(extra_env={"SLURM_CONF": str(cluster.conf)})
    code = cli.main([*argv, "--config", str(config)], make_host=lambda root: Host(root=Path(root), runner=runner),
                    out=out)
    return code, out.getvalue()


def test_begin_waits_for_the_running_job_then_a_passing_check_resumes(slurm: SlurmCluster, tmp_path: Path) -> None:
    """A running srun job keeps the node DRAINING until it finishes (DRAINED, the job not killed); a passing
    post-change check resumes the node gpuguard drained."""
    job = subprocess.Popen(["srun", "-N1", "-t", "1", "sleep", "5"], env=slurm.env, stdout=subprocess.DEVNULL,
                           stderr=subprocess.PIPE)
    try:
        slurm._wait(lambda: slurm.state() == "ALLOCATED", "the srun job running")
        code, line = gpuguard(slurm, tmp_path, "maintenance", "begin", "--reason", "rollout R stage 2",
                              "--wait-seconds", "0")
        assert code == 40 and "ALLOCATED+DRAIN" in line, line
        assert slurm.reason() == "gpuguard: maintenance: rollout R stage 2"
        code, line = gpuguard(slurm, tmp_path, "maintenance", "begin", "--reason", "rollout R stage 2",
                              "--wait-seconds", "30")
        assert code == 0 and "IDLE+DRAIN" in line, line
        assert job.wait(timeout=10) == 0  # the job ran to its end
    finally:
        if job.poll() is None:
            job.kill()
            job.wait(timeout=10)
    code, line = gpuguard(slurm, tmp_path, "maintenance", "end", "--check", "pass")
    assert code == 0 and "resumed" in line, line
    assert slurm.state().split("+")[0] == "IDLE" and "DRAIN" not in slurm.state()


def test_a_failed_check_keeps_the_drain_and_an_operator_drain_is_never_resumed(slurm: SlurmCluster,
                                                                               tmp_path: Path) -> None:
    """A failed post-change check keeps the node drained with a reason naming it; a node an operator drained
    stays drained, its reason untouched, through a whole hand-off."""
    assert gpuguard(slurm, tmp_path, "maintenance", "begin", "--reason", "rollout R stage 2")[0] == 0
    code, line = gpuguard(slurm, tmp_path, "maintenance", "end", "--check", "cpu_fallback", "--summary",
                          "torch sees no GPU")
    assert code == 41 and "DRAIN" in slurm.state(), line
    assert slurm.reason().startswith("gpuguard: maintenance: post-change check cpu_fallback: torch sees no GPU")
    assert gpuguard(slurm, tmp_path, "maintenance", "end")[0] == 0  # an operator's explicit end resumes
    assert "DRAIN" not in slurm.state()

    assert slurm.scontrol("update", f"NodeName={slurm.node}", "State=DRAIN", "Reason=bad DIMM").returncode == 0
    assert gpuguard(slurm, tmp_path, "maintenance", "begin", "--reason", "rollout R stage 3")[0] == 0
    code, line = gpuguard(slurm, tmp_path, "maintenance", "end", "--check", "pass")
    assert code == 0 and "not resumed" in line, line
    assert "DRAIN" in slurm.state() and slurm.reason() == "bad DIMM"


def test_a_failing_gpuguard_prolog_drains_the_node_and_requeues_the_job(slurm_with_prolog: SlurmCluster,
                                                                         tmp_path: Path) -> None:
    """``gpuguard status --slurm`` as the Prolog, judging a host whose daemon is not running, exits 1: slurmd
    drains the node and the batch job goes back to the queue instead of running on it; gpuguard's hand-off never
    resumes that drain (it is slurmd's, not gpuguard's)."""
    cluster = slurm_with_prolog
    submitted = subprocess.run(["sbatch", "--parsable", "-o", "/dev/null", "--wrap", "true"], env=cluster.env,
                               capture_output=True, text=True, timeout=15, check=True)
    job_id = submitted.stdout.strip().split(";")[0]
    cluster._wait(lambda: "DRAIN" in cluster.state(), "the node drained by the failing Prolog")
    assert cluster.prolog_out.read_text().startswith("gpuguard: drain: daemon")
    assert "prolog" in cluster.reason().lower()

    def job() -> str:
        return cluster.scontrol("show", "job", "-o", job_id).stdout

    cluster._wait(lambda: "JobState=PENDING" in job() and "Restarts=1" in job(), "the job requeued")
    reason = cluster.reason()
    code, line = gpuguard(cluster, tmp_path, "maintenance", "begin", "--reason", "rollout R stage 2")
    assert code == 0 and "someone else" in line, line
    code, line = gpuguard(cluster, tmp_path, "maintenance", "end", "--check", "pass")
    assert "not resumed" in line and "DRAIN" in cluster.state() and cluster.reason() == reason


def test_a_revert_after_an_aborted_rollout_resumes_the_node_it_drained(slurm: SlurmCluster, tmp_path: Path) -> None:
    """The daemon's fetch drains the node for rollout R (admitted at stage 1); R is aborted before the host's
    packages moved, and the revert (serial 45, no admission) finds them compliant: the real node is resumed, its
    maintenance reason gone, instead of staying drained for good."""
    from agent.bundle.rollout_fields import RolloutFields
    from agent.daemon_jobs.handoff import after_fetch
    from agent.integrations.hold import read_state
    from agent.statepaths import StatePaths
    from tests.daemon.test_handoff import enforcing_root, slurm_settings

    host = Host(root=enforcing_root(tmp_path, "1.17.4-1"),
                runner=SubprocessRunner(extra_env={"SLURM_CONF": str(slurm.conf)}))
    settings = slurm_settings(slurm.node)
    assert after_fetch(host, settings, "installed", RolloutFields("R", "running", 1), 44) is not None
    slurm._wait(lambda: "DRAIN" in slurm.state(), "the node drained for the rollout")
    assert slurm.reason() == "gpuguard: maintenance: rollout R stage 1"
    line = after_fetch(host, settings, "installed", None, 45)
    assert line is not None and "no longer applies to this host: nothing changed" in line and "resumed" in line
    assert "DRAIN" not in slurm.state() and read_state(host, StatePaths("/var/lib/gpuguard")) is None


def test_an_operators_rollout_like_hold_keeps_the_real_node_drained_through_an_unrelated_install(
        slurm: SlurmCluster, tmp_path: Path) -> None:
    """An operator drains the real node with ``gpuguard maintenance begin --reason "rollout R stage 2"``; the next
    bundle installed outside any admission (the packages compliant) leaves the hold and the drain alone."""
    from agent.daemon_jobs.handoff import after_fetch
    from agent.integrations.hold import read_state
    from agent.statepaths import StatePaths
    from tests.daemon.test_handoff import enforcing_root, slurm_settings

    root = enforcing_root(tmp_path, "1.17.4-1")
    (tmp_path / "agent.toml").write_text('[agent]\nstate_dir = "/var/lib/gpuguard"\n[integrations]\n'
                                         f'scheduler = "slurm"\nslurm_node_name = "{slurm.node}"\n')
    code, line = gpuguard(slurm, tmp_path, "maintenance", "begin", "--reason", "rollout R stage 2", "--root",
                          str(root))
    assert code == 0 and "DRAIN" in slurm.state(), line
    host = Host(root=root, runner=SubprocessRunner(extra_env={"SLURM_CONF": str(slurm.conf)}))
    held = read_state(host, StatePaths("/var/lib/gpuguard"))
    assert held is not None and held.rollout_id is None
    assert after_fetch(host, slurm_settings(slurm.node), "installed", None, 45) is None
    assert "DRAIN" in slurm.state() and slurm.reason() == "gpuguard: maintenance: rollout R stage 2"
    assert read_state(host, StatePaths("/var/lib/gpuguard")) == held
    assert gpuguard(slurm, tmp_path, "maintenance", "end", "--root", str(root))[0] == 0  # the operator's to end
    assert "DRAIN" not in slurm.state()
