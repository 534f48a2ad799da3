"""The daemon's hand-off triggers: no-ops without a scheduler, and never raising when the scheduler fails."""

from __future__ import annotations

from pathlib import Path

from agent.config import parse_settings
from agent.daemon_jobs.handoff import begin_for_change, end_after_check, poll_drain
from agent.host import Host
from agent.integrations.maintenance import read_state
from agent.statepaths import StatePaths
from tests.fakes.runner import FakeRunner


def test_without_a_scheduler_nothing_is_asked(tmp_path: Path) -> None:
    """scheduler = "none" (the default): neither trigger runs a command or writes a hold."""
    runner = FakeRunner()
    settings = parse_settings(f'[agent]\nstate_dir = "{tmp_path}"\n')
    assert begin_for_change(Host(root=Path("/"), runner=runner), settings, "policy bundle serial 3") is None
    assert end_after_check(Host(root=Path("/"), runner=runner), settings, "pass") is None
    assert runner.calls == [] and not (tmp_path / "maintenance.json").exists()


def test_a_missing_scontrol_is_logged_not_raised(tmp_path: Path) -> None:
    """scheduler = "slurm" without scontrol: begin returns None (the job's own result stands); the hold written
    before asking says the node may be held, so the post-change check still asks to give it back."""
    runner = FakeRunner()
    runner.add(["scontrol", "show", "node", "-o", "vm"], not_found=True)
    settings = parse_settings(f'[agent]\nstate_dir = "{tmp_path}"\n[integrations]\nscheduler = "slurm"\n'
                              'slurm_node_name = "vm"\n')
    host = Host(root=Path("/"), runner=runner)
    assert begin_for_change(host, settings, "policy bundle serial 3") is None
    assert read_state(host, StatePaths(str(tmp_path))) is not None
    assert end_after_check(host, settings, "pass") is None  # scontrol still missing: logged, the hold kept
    assert read_state(host, StatePaths(str(tmp_path))) is not None


def test_a_later_fetch_records_the_drain_the_hook_waits_for(tmp_path: Path) -> None:
    """The policy fetch's poll: nothing to do without a hold; a hold begun while a job ran becomes drained (with
    drained_at_seconds) once scontrol shows the node DRAINED."""
    from tests.integrations.test_slurm_handoff import DRAINED, DRAINING, SHOW

    settings = parse_settings(f'[agent]\nstate_dir = "{tmp_path}"\n[integrations]\nscheduler = "slurm"\n'
                              'slurm_node_name = "vm"\ndrain_wait_seconds = 0\n')
    runner = FakeRunner()
    host = Host(root=Path("/"), runner=runner)
    assert poll_drain(host, settings) is None and runner.calls == []
    runner.add(list(SHOW), stdout=DRAINING)  # a job still runs on the node gpuguard drains
    assert begin_for_change(host, settings, "rollout R stage 2") is not None
    state = read_state(host, StatePaths(str(tmp_path)))
    assert state is not None and state.phase == "draining" and state.drained_at_seconds is None
    runner.add(list(SHOW), stdout=DRAINED)
    line = poll_drain(host, settings)
    state = read_state(host, StatePaths(str(tmp_path)))
    assert line is not None and "DRAINED" in line
    assert state is not None and state.phase == "held" and state.drained_at_seconds is not None


def test_only_a_bundle_a_rollout_admitted_this_host_for_drains_the_node(tmp_path: Path) -> None:
    """After a fetch that installed a plain bundle (pushed to the whole scope at once) the node is not drained and no
    hold is written; a bundle installed with the hub's admission notice drains it naming the rollout and stage."""
    from agent.daemon_jobs.handoff import after_fetch
    from tests.integrations.test_slurm_handoff import DRAINED, SHOW

    settings = parse_settings(f'[agent]\nstate_dir = "{tmp_path}"\n[integrations]\nscheduler = "slurm"\n'
                              'slurm_node_name = "vm"\ndrain_wait_seconds = 0\n')
    runner = FakeRunner()
    host = Host(root=Path("/"), runner=runner)
    for notice in (None, "rollout r43-1a2b3c: waiting for stage 1 (0/2 canaries passed, soak ends 01:01 UTC)"):
        assert after_fetch(host, settings, "installed", notice, 44) is None
    assert runner.calls == [] and read_state(host, StatePaths(str(tmp_path))) is None
    runner.add(list(SHOW), stdout=DRAINED)
    assert after_fetch(host, settings, "installed", "rollout r43-1a2b3c: admitted at stage 2", 43) is not None
    state = read_state(host, StatePaths(str(tmp_path)))
    assert state is not None and state.reason == "rollout r43-1a2b3c stage 2"
    assert runner.calls and set(runner.calls) == {SHOW}  # asked; already drained under this hold's reason
