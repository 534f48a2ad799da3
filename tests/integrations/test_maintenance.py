"""The maintenance hand-off's state and verdicts: begin, end, the post-change check, a restart mid-change, the
Kubernetes label and the ``gpuguard maintenance`` command."""

from __future__ import annotations

import datetime as dt
import io
from pathlib import Path
from typing import Tuple

import pytest

from agent import cli
from agent.errors import InputFileError
from agent.host import Host
from agent.integrations.hold import read_state
from agent.integrations.maintenance import (
    EXIT_MAINTENANCE_KEPT,
    EXIT_MAINTENANCE_NOT_READY,
    EXIT_MAINTENANCE_OK,
    after_check,
    begin_maintenance,
    end_maintenance,
    maintenance_status,
    poll_drain,
)
from agent.integrations.settings import IntegrationsSettings
from agent.integrations.slurm_handoff import maintenance_reason
from agent.statepaths import StatePaths
from tests.integrations.test_slurm_handoff import (
    DRAIN,
    DRAINED,
    DRAINING,
    IDLE,
    OPERATOR,
    RESUME,
    SHOW,
    ScriptedScontrol,
)

SLURM = IntegrationsSettings(scheduler="slurm", slurm_node_name="vm", drain_wait_seconds=0, drain_poll_seconds=0.01)
NOW = dt.datetime(2026, 12, 4, 23, 0, tzinfo=dt.timezone.utc)


def setup(tmp_path: Path, runner: ScriptedScontrol) -> Tuple[Host, StatePaths]:
    return Host(root=Path("/"), runner=runner, clock=lambda: NOW), StatePaths(str(tmp_path / "state"))


def test_begin_persists_the_hold_before_and_after_asking_slurm(tmp_path: Path) -> None:
    """begin writes maintenance.json (drained by gpuguard, draining while a job runs: exit 40)."""
    host, paths = setup(tmp_path, ScriptedScontrol({SHOW: [IDLE, DRAINING], DRAIN: [""]}))
    outcome = begin_maintenance(host, paths, SLURM, "", "rollout R stage 2")
    assert outcome.exit_code == EXIT_MAINTENANCE_NOT_READY
    state = read_state(host, paths)
    assert state is not None and (state.scheduler, state.node, state.drained_by_us, state.phase) == \
        ("slurm", "vm", True, "draining")


def test_a_restart_mid_change_takes_up_its_own_hold(tmp_path: Path) -> None:
    """begin again after a restart finds its own drain (no second drain), waits, and still owns the node."""
    host, paths = setup(tmp_path, ScriptedScontrol({SHOW: [IDLE, DRAINING], DRAIN: [""]}))
    begin_maintenance(host, paths, SLURM, "", "rollout R stage 2")
    again = ScriptedScontrol({SHOW: [DRAINED]})
    host2 = Host(root=Path("/"), runner=again, clock=lambda: NOW)
    assert begin_maintenance(host2, paths, SLURM, "", "ignored").exit_code == EXIT_MAINTENANCE_OK
    state = read_state(host2, paths)
    assert state is not None and state.drained_by_us and state.phase == "held" and DRAIN not in again.calls


def test_poll_drain_records_drained_at_once_slurm_shows_drained(tmp_path: Path) -> None:
    """A hold still draining is looked at again without waiting: still DRAINING keeps it draining (no second
    drain); the recorded DRAINED line makes it held with drained_at_seconds, which the apt hook lets through."""
    host, paths = setup(tmp_path, ScriptedScontrol({SHOW: [IDLE, DRAINING], DRAIN: [""]}))
    begin_maintenance(host, paths, SLURM, "", "rollout R stage 2")
    still = ScriptedScontrol({SHOW: [DRAINING]})
    outcome = poll_drain(Host(root=Path("/"), runner=still, clock=lambda: NOW), paths, SLURM, "")
    state = read_state(host, paths)
    assert outcome is not None and outcome.exit_code == EXIT_MAINTENANCE_NOT_READY and DRAIN not in still.calls
    assert state is not None and state.phase == "draining" and state.drained_at_seconds is None
    drained = ScriptedScontrol({SHOW: [DRAINED]})
    outcome = poll_drain(Host(root=Path("/"), runner=drained, clock=lambda: NOW), paths, SLURM, "")
    state = read_state(host, paths)
    assert outcome is not None and outcome.exit_code == EXIT_MAINTENANCE_OK
    assert state is not None and (state.phase, state.drained_at_seconds, state.reason) == \
        ("held", NOW.timestamp(), "rollout R stage 2")
    from agent.guard.hotpath.maintenance import drain_wait

    assert drain_wait(paths.maintenance) == (None, False)
    nothing = ScriptedScontrol({})
    assert poll_drain(Host(root=Path("/"), runner=nothing, clock=lambda: NOW), paths, SLURM, "") is None
    assert nothing.calls == []  # held already: no scontrol at all


def test_a_passing_check_resumes_and_forgets_the_hold(tmp_path: Path) -> None:
    """after_check(pass) resumes the node gpuguard drained and removes maintenance.json."""
    host, paths = setup(tmp_path, ScriptedScontrol({SHOW: [IDLE, DRAINED], DRAIN: [""]}))
    begin_maintenance(host, paths, SLURM, "", "rollout R stage 2")
    runner = ScriptedScontrol({SHOW: [DRAINED, IDLE], RESUME: [""]})
    outcome = after_check(Host(root=Path("/"), runner=runner), paths, SLURM, "", "busy")
    assert outcome is not None and outcome.exit_code == EXIT_MAINTENANCE_OK and RESUME in runner.calls
    assert read_state(host, paths) is None


def test_a_failed_check_keeps_the_node_drained_with_the_reason(tmp_path: Path) -> None:
    """after_check(cpu_fallback) never resumes: the drain reason names the check, the hold is kept (exit 41),
    and a later begin refuses until someone ends it."""
    host, paths = setup(tmp_path, ScriptedScontrol({SHOW: [IDLE, DRAINED], DRAIN: [""]}))
    begin_maintenance(host, paths, SLURM, "", "rollout R stage 2")
    why = "post-change check cpu_fallback: torch sees no GPU (rollout R stage 2)"
    keep = ("scontrol", "update", "NodeName=vm", "State=DRAIN", f"Reason={maintenance_reason(why)}")
    runner = ScriptedScontrol({SHOW: [DRAINED], keep: [""]})
    outcome = after_check(Host(root=Path("/"), runner=runner), paths, SLURM, "", "cpu_fallback",
                          "torch sees no GPU")
    assert outcome is not None and outcome.exit_code == EXIT_MAINTENANCE_KEPT and RESUME not in runner.calls
    assert maintenance_status(host, paths).exit_code == EXIT_MAINTENANCE_KEPT
    assert begin_maintenance(host, paths, SLURM, "", "next").exit_code == EXIT_MAINTENANCE_KEPT


def test_no_verdict_changes_nothing(tmp_path: Path) -> None:
    """A deferred or skipped check is no verdict: the hold stays as it was, scontrol is not asked."""
    host, paths = setup(tmp_path, ScriptedScontrol({SHOW: [IDLE, DRAINED], DRAIN: [""]}))
    begin_maintenance(host, paths, SLURM, "", "rollout R stage 2")
    runner = ScriptedScontrol({})
    assert after_check(Host(root=Path("/"), runner=runner), paths, SLURM, "", "deferred") is None
    assert runner.calls == [] and maintenance_status(host, paths).exit_code == EXIT_MAINTENANCE_OK


def test_an_operator_drain_found_at_begin_is_never_resumed(tmp_path: Path) -> None:
    """A node an operator had drained stays drained after a passing check: the hold records it is not ours."""
    host, paths = setup(tmp_path, ScriptedScontrol({SHOW: [OPERATOR]}))
    begin_maintenance(host, paths, SLURM, "", "rollout R stage 2")
    runner = ScriptedScontrol({SHOW: [OPERATOR]})
    outcome = end_maintenance(Host(root=Path("/"), runner=runner), paths, SLURM, "")
    assert "not resumed" in outcome.line and RESUME not in runner.calls


def test_no_scheduler_is_a_no_op(tmp_path: Path) -> None:
    """[integrations] scheduler = "none": begin runs nothing and writes no hold."""
    host, paths = setup(tmp_path, ScriptedScontrol({}))
    outcome = begin_maintenance(host, paths, IntegrationsSettings(), "", "r")
    assert outcome.exit_code == EXIT_MAINTENANCE_OK and read_state(host, paths) is None


def test_a_damaged_hold_is_one_error_naming_the_file(tmp_path: Path) -> None:
    """A maintenance.json that is not a hold is an InputFileError naming the file, not a traceback."""
    host, paths = setup(tmp_path, ScriptedScontrol({}))
    Path(paths.state_dir).mkdir()
    Path(paths.maintenance).write_text('{"scheduler": "slurm"}')
    with pytest.raises(InputFileError, match="maintenance.json: not a maintenance record"):
        read_state(host, paths)
    from agent.guard.hotpath.maintenance import drain_wait

    line, damaged = drain_wait(paths.maintenance)
    assert damaged and line is not None and "maintenance.json: not a maintenance record" in line


def test_kubernetes_labels_keep_and_remove(tmp_path: Path) -> None:
    """Kubernetes: begin for a rollout writes maintenance=true with the reason and the hold's rollout id beside the
    NFD labels, a failed check adds -failed, a passing one removes the file."""
    features = tmp_path / "features.d"
    features.mkdir()
    nfd_file = str(features / "gpuguard")
    host, paths = setup(tmp_path, ScriptedScontrol({}))
    k8s = IntegrationsSettings(scheduler="kubernetes")
    assert begin_maintenance(host, paths, k8s, nfd_file, "rollout r2-1a2b3c stage 2",
                             rollout_id="r2-1a2b3c").exit_code == \
        EXIT_MAINTENANCE_OK
    label_file = features / "gpuguard-maintenance"
    assert label_file.read_text() == ("gpuguard.io/maintenance=true\n"
                                      "gpuguard.io/maintenance-reason=rollout_r2-1a2b3c_stage_2\n"
                                      "gpuguard.io/maintenance-rollout=r2-1a2b3c\n"
                                      "gpuguard.io/maintenance-since=20261204T230000Z\n")
    after_check(host, paths, k8s, nfd_file, "regression")
    assert "gpuguard.io/maintenance=true\n" in label_file.read_text()
    assert "gpuguard.io/maintenance-rollout=r2-1a2b3c\n" in label_file.read_text()
    assert "gpuguard.io/maintenance-failed=post-change_check_regression_rollout_r2-1a2b3c_stage_2" in \
        label_file.read_text()
    end_maintenance(host, paths, k8s, nfd_file)
    assert not label_file.exists() and read_state(host, paths) is None


def test_the_command_begins_reports_and_ends(tmp_path: Path) -> None:
    """gpuguard maintenance begin/status/end through the CLI: one line each, exit codes 0 and 40."""
    config = tmp_path / "agent.toml"
    config.write_text(f'[agent]\nstate_dir = "{tmp_path / "state"}"\n[integrations]\nscheduler = "slurm"\n'
                      'slurm_node_name = "vm"\ndrain_poll_seconds = 0.01\n')
    runner = ScriptedScontrol({SHOW: [IDLE, DRAINING, DRAINING, DRAINED, DRAINED, IDLE], DRAIN: [""], RESUME: [""]})

    def run(*argv: str) -> Tuple[int, str]:
        out = io.StringIO()
        code = cli.main([*argv, "--config", str(config)],
                        make_host=lambda root: Host(root=Path(root), runner=runner, clock=lambda: NOW), out=out)
        return code, out.getvalue()

    code, line = run("maintenance", "begin", "--reason", "rollout R stage 2", "--wait-seconds", "0")
    assert code == EXIT_MAINTENANCE_NOT_READY and "DRAINING" in line
    assert run("maintenance", "status")[0] == EXIT_MAINTENANCE_NOT_READY
    assert run("maintenance", "begin", "--reason", "x", "--wait-seconds", "5")[0] == EXIT_MAINTENANCE_OK
    code, line = run("maintenance", "end", "--check", "pass")
    assert code == EXIT_MAINTENANCE_OK and "resumed" in line and RESUME in runner.calls
    assert run("maintenance", "status") == (0, "gpuguard: maintenance: none\n")


def test_the_command_reports_scheduler_and_file_trouble_in_one_line(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture) -> None:
    """A missing scontrol is gpuguard's one-line error (exit 6); a damaged maintenance.json names the file
    (exit 4); neither prints a traceback."""
    from tests.fakes.runner import FakeRunner

    config = tmp_path / "agent.toml"
    config.write_text(f'[agent]\nstate_dir = "{tmp_path / "state"}"\n[integrations]\nscheduler = "slurm"\n'
                      'slurm_node_name = "vm"\n')
    runner = FakeRunner()
    runner.add(list(SHOW), not_found=True)

    def run(*argv: str) -> int:
        return cli.main([*argv, "--config", str(config)], make_host=lambda root: Host(root=Path(root), runner=runner),
                        out=io.StringIO())

    assert run("maintenance", "begin", "--reason", "r") == 6
    assert "scontrol" in capsys.readouterr().err
    (tmp_path / "state" / "maintenance.json").write_text("[1]")
    assert run("maintenance", "status") == 4
    err = capsys.readouterr().err
    assert "maintenance.json: not a maintenance record" in err and "Traceback" not in err
