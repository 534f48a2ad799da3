"""Slurm: the verdict per state (busy and deferred never drain), scontrol's node text, drain and resume."""

from __future__ import annotations

import datetime as dt
import io
from pathlib import Path
from typing import List, Optional

import pytest

from agent import cli
from agent.errors import CommandError
from agent.host import Host
from agent.integrations.slurm import EXIT_DRAIN, EXIT_OK, apply_to_node, node_name, parse_node
from agent.status.assess import assess
from agent.status.facts import DaemonFacts, GuardFacts, HealthFacts, LastSnapshot, MetricsFacts, OutboxFacts
from agent.status.slurm import slurm_verdict
from tests.fakes.runner import FakeRunner
from tests.status.test_assess import MIN, NOW, healthy
from tests.status.test_command import StateDir

NODE_TEMPLATE = """NodeName=gpu01 Arch=x86_64 CoresPerSocket=32
   CPUAlloc=0 CPUEfctv=128 CPUTot=128 CPULoad=0.50
   Gres=gpu:mi300x:8
   State={state} ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A
   Partitions=gpu
   BootTime=2026-12-01T08:00:00 SlurmdStartTime=2026-12-01T08:01:00
{reason}"""


def node_text(state: str, reason: Optional[str] = None) -> str:
    return NODE_TEMPLATE.format(state=state, reason=f"   Reason={reason} [root@2026-12-03T15:55:00]\n"
                                if reason else "")


@pytest.mark.parametrize("changes, drain, words", [
    ({}, False, "health: pass"),
    ({"health": HealthFacts(status="busy", finished_at=NOW - MIN, summary="functional ok; speed not judged")},
     False, "busy"),
    ({"health": HealthFacts(status="deferred", finished_at=NOW - MIN)}, False, "deferred"),
    ({"health": HealthFacts(status="skipped", finished_at=NOW - MIN)}, False, "skipped"),
    ({"health": HealthFacts(status="pass", finished_at=NOW - 3 * 21600 * dt.timedelta(seconds=1))}, False,
     "stale"),
    ({"outbox": OutboxFacts(depth=5000, oldest_enqueued_at=NOW - 600 * MIN, dropped_total=3)}, False, "pass"),
    ({"snapshot": LastSnapshot()}, False, "pass"),
    ({"metrics": MetricsFacts(compliant=False)}, True, "compliance: NOT compliant"),
    ({"health": HealthFacts(status="cpu_fallback", finished_at=NOW - MIN)}, True, "health: cpu_fallback"),
    ({"health": HealthFacts(status="regression", finished_at=NOW - MIN)}, True, "health: regression"),
    ({"health": HealthFacts(status="failed", finished_at=NOW - MIN)}, True, "health: failed"),
    ({"health": HealthFacts(status="timeout", finished_at=NOW - MIN)}, True, "health: timeout"),
    ({"daemon": DaemonFacts(systemd_state="failed")}, True, "daemon: gpuguard.service is failed"),
    ({"snapshot": LastSnapshot(taken_at=NOW - 60 * MIN)}, True, "snapshot: stale"),
    ({"guard": GuardFacts(last_kind="rollback", last_at=NOW - MIN, last_succeeded=False)}, True, "guard:"),
])
def test_verdict_drains_for_real_failures_only(changes: dict, drain: bool, words: str) -> None:
    """A busy or deferred GPU, a backlog, stale health or no snapshot yet never drain; failures do."""
    facts = healthy(**changes)
    verdict = slurm_verdict(facts, assess(facts))
    assert verdict.drain is drain and verdict.exit_code == (EXIT_DRAIN if drain else EXIT_OK)
    assert words in verdict.reason and "\n" not in verdict.reason and len(verdict.reason) <= 200


def test_several_failures_are_one_line() -> None:
    """Every failing check is named, in the assessment's order."""
    facts = healthy(metrics=MetricsFacts(compliant=False), health=HealthFacts(status="failed", finished_at=NOW,
                                                                               summary="x\ny" * 100))
    verdict = slurm_verdict(facts, assess(facts))
    assert verdict.reason.startswith("compliance: NOT compliant") and "; health: failed" in verdict.reason
    assert "\n" not in verdict.reason and len(verdict.reason) == 200 and verdict.reason.endswith("...")


@pytest.mark.parametrize("state, reason, drained, seen", [
    ("IDLE", None, False, None),
    ("MIXED", None, False, None),
    ("IDLE+DRAIN", "gpuguard: health: failed", True, "gpuguard: health: failed"),
    ("ALLOCATED+DRAIN", "maintenance [ticket 42]", True, "maintenance [ticket 42]"),
    ("DOWN+DRAIN+NOT_RESPONDING", "Not responding", True, "Not responding"),
    ("DRAINED", "x", True, "x"),
])
def test_parse_node(state: str, reason: Optional[str], drained: bool, seen: Optional[str]) -> None:
    """State flags and the reason without slurmctld's [user@time]."""
    assert parse_node(node_text(state, reason)) == (drained, seen)


def scontrol_host(state: str, reason: Optional[str] = None, update_rc: int = 0) -> "tuple[Host, FakeRunner]":
    runner = FakeRunner()
    runner.add(["scontrol", "show", "node", "gpu01"], stdout=node_text(state, reason))
    runner.add(["scontrol", "update", "nodename=gpu01", "state=resume"], returncode=update_rc)
    runner.add(["scontrol", "update", "nodename=gpu01", "state=drain",
                "reason=gpuguard: health: failed 60 s ago"], returncode=update_rc,
               stderr="slurm_update error: Invalid user id" if update_rc else "")
    return Host(root=Path("/nonexistent"), runner=runner, env={}), runner


def verdict(drain: bool):  # noqa: ANN201 - a SlurmVerdict
    facts = healthy(health=HealthFacts(status="failed", finished_at=NOW - MIN)) if drain else healthy()
    return slurm_verdict(facts, assess(facts))


def updates(runner: FakeRunner) -> List[tuple]:
    return [call for call in runner.calls if call[1] == "update"]


def test_a_failure_drains_an_idle_node_with_the_gpuguard_reason() -> None:
    """state=drain with reason "gpuguard: ..." as argv, no shell quoting."""
    host, runner = scontrol_host("IDLE")
    assert apply_to_node(host, "gpu01", verdict(True)) == "drained"
    assert updates(runner) == [("scontrol", "update", "nodename=gpu01", "state=drain",
                                "reason=gpuguard: health: failed 60 s ago")]


@pytest.mark.parametrize("drain", [True, False])
def test_a_node_drained_by_someone_else_is_never_touched(drain: bool) -> None:
    """Neither resumed when gpuguard is happy nor re-reasoned when it is not."""
    host, runner = scontrol_host("IDLE+DRAIN", "maintenance: swap PSU")
    assert apply_to_node(host, "gpu01", verdict(drain)) == "drained by someone else (maintenance: swap PSU): left alone"
    assert updates(runner) == []


def test_a_node_gpuguard_drained_is_resumed_once_all_is_well() -> None:
    """Our own prefix, a good verdict: state=resume."""
    host, runner = scontrol_host("IDLE+DRAIN", "gpuguard: health: failed 3 h ago")
    assert apply_to_node(host, "gpu01", verdict(False)) == "resumed"
    assert updates(runner) == [("scontrol", "update", "nodename=gpu01", "state=resume")]


def test_still_failing_and_already_drained_by_gpuguard_is_left() -> None:
    """No second drain."""
    host, runner = scontrol_host("MIXED+DRAIN", "gpuguard: compliance: NOT compliant")
    assert apply_to_node(host, "gpu01", verdict(True)) == "already drained by gpuguard"
    assert updates(runner) == []


def test_a_healthy_undrained_node_gets_no_update() -> None:
    """A healthy node that is not drained gets no scontrol update."""
    host, runner = scontrol_host("IDLE")
    assert apply_to_node(host, "gpu01", verdict(False)) == "nothing to do"
    assert updates(runner) == []


def test_scontrol_refusing_is_a_command_error() -> None:
    """A non-zero scontrol is CommandError with its message."""
    host, _ = scontrol_host("IDLE", update_rc=1)
    with pytest.raises(CommandError, match="Invalid user id"):
        apply_to_node(host, "gpu01", verdict(True))


def test_node_name_prefers_the_option_then_slurmd_then_the_short_host_name(tmp_path: Path) -> None:
    """The Slurm node name is the option's, else SLURMD_NODENAME, else the short host name."""
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc/hostname").write_text("gpu07.cluster.example\n")
    assert node_name(Host(root=tmp_path, env={"SLURMD_NODENAME": "n7"}), "given") == "given"
    assert node_name(Host(root=tmp_path, env={"SLURMD_NODENAME": "n7"}), None) == "n7"
    assert node_name(Host(root=tmp_path, env={}), None) == "gpu07"


# --- the command ------------------------------------------------------------------------------------------------

def run_slurm(state: StateDir, *args: str, runner: Optional[FakeRunner] = None) -> "tuple[int, str]":
    out = io.StringIO()

    def host_of(root: str) -> Host:
        return Host(root=Path(root), clock=lambda: NOW, env={}, runner=runner or FakeRunner())

    code = cli.main(["status", "--slurm", "--config", str(state.config), "--root", str(state.root), *args],
                    host_of, out)
    return code, out.getvalue()


@pytest.fixture
def state(tmp_path: Path) -> StateDir:
    return StateDir(tmp_path)


def set_health(state: StateDir, status: str) -> None:
    (state.state / "health/last.json").write_text(
        f'{{"status": "{status}", "started_at": "{(NOW - MIN).isoformat()}", "wall_seconds": 3}}')


@pytest.mark.parametrize("status, code", [("pass", 0), ("busy", 0), ("deferred", 0), ("skipped", 0),
                                          ("failed", 1), ("cpu_fallback", 1), ("regression", 1), ("timeout", 1)])
def test_exit_code_per_health_status(state: StateDir, status: str, code: int) -> None:
    """busy/deferred exit 0 (never drain for a GPU another job uses); failures exit 1 with one line."""
    state.healthy()
    set_health(state, status)
    got, out = run_slurm(state)
    assert got == code
    assert out.count("\n") == 1 and out.startswith("gpuguard: ok: " if code == 0 else "gpuguard: drain: health:")


def test_no_daemon_is_a_drain(state: StateDir) -> None:
    """A dead agent says nothing about the stack: drain."""
    code, out = run_slurm(state)
    assert code == 1 and out.startswith("gpuguard: drain: daemon: not running")


def test_drain_option_drains_through_scontrol_on_one_line(state: StateDir) -> None:
    """--drain --node-name: the node is drained with the gpuguard reason; one line says so."""
    state.healthy()
    set_health(state, "failed")
    runner = FakeRunner()
    runner.add(["scontrol", "show", "node", "gpu01"], stdout=node_text("IDLE"))
    runner.add(["scontrol", "update", "nodename=gpu01", "state=drain", "reason=gpuguard: health: failed 57 s ago"])
    code, out = run_slurm(state, "--drain", "--node-name", "gpu01", runner=runner)
    assert code == 1 and out == "gpuguard: drain: health: failed 57 s ago (node gpu01: drained)\n"


def test_drain_option_on_a_busy_gpu_leaves_the_node(state: StateDir) -> None:
    """busy: exit 0 and no update, even with --drain."""
    state.healthy()
    set_health(state, "busy")
    runner = FakeRunner()
    runner.add(["scontrol", "show", "node", "gpu01"], stdout=node_text("IDLE"))
    code, out = run_slurm(state, "--drain", "--node-name", "gpu01", runner=runner)
    assert code == 0 and out.endswith("(node gpu01: nothing to do)\n") and updates(runner) == []


def test_scontrol_missing_prints_the_verdict_then_one_error_line(state: StateDir,
                                                                 capsys: pytest.CaptureFixture) -> None:
    """No scontrol on the host: the verdict line, then gpuguard's one-line error and exit 6."""
    runner = FakeRunner()
    runner.add(["scontrol", "show", "node", "gpu01"], not_found=True)
    code, out = run_slurm(state, "--drain", "--node-name", "gpu01", runner=runner)
    assert code == 6 and out.startswith("gpuguard: drain: daemon")
    assert capsys.readouterr().err.count("\n") == 1
