"""The daemon's hand-off triggers: no-ops without a scheduler, and never raising when the scheduler fails."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Dict, List, Tuple

import pytest

from agent.bundle.rollout_fields import RolloutFields
from agent.config import Settings, parse_settings
from agent.daemon_jobs.handoff import after_fetch, begin_for_change, end_after_check, poll_drain
from agent.host import Host
from agent.integrations.hold import read_state
from agent.log import configure
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
    """After a fetch that installed a plain bundle (pushed to the whole scope at once), or one a rollout holds this
    host back from, the node is not drained and no hold is written; a bundle installed with the offer's fields
    saying a rollout admitted this host drains it, the hold naming the rollout and stage and keeping its id."""
    from tests.integrations.test_slurm_handoff import DRAINED, SHOW

    settings = parse_settings(f'[agent]\nstate_dir = "{tmp_path}"\n[integrations]\nscheduler = "slurm"\n'
                              'slurm_node_name = "vm"\ndrain_wait_seconds = 0\n')
    runner = FakeRunner()
    host = Host(root=Path("/"), runner=runner)
    for fields in (None, RolloutFields("r43-1a2b3c", "running"), RolloutFields("r43-1a2b3c", "paused")):
        assert after_fetch(host, settings, "installed", fields, 44) is None
    assert runner.calls == [] and read_state(host, StatePaths(str(tmp_path))) is None
    runner.add(list(SHOW), stdout=DRAINED)
    assert after_fetch(host, settings, "installed", RolloutFields("r43-1a2b3c", "running", 2), 43) is not None
    state = read_state(host, StatePaths(str(tmp_path)))
    assert state is not None and (state.reason, state.rollout_id) == ("rollout r43-1a2b3c stage 2", "r43-1a2b3c")
    assert runner.calls and set(runner.calls) == {SHOW}  # asked; already drained under this hold's reason


# --- a rollout's hold after a bundle installed outside any admission (the rollout aborted, its revert installed) ---

CTK_POLICY = ('[policy]\nname = "previous"\n[[versions]]\nname = "ctk"\npackages = ["nvidia-container-toolkit"]\n'
              'allow = ">= 1.17.3, << 1.18"\naction = "rollback"\n')
ADMITTED = RolloutFields("R", "running", 2)


def enforcing_root(tmp_path: Path, ctk_version: str) -> Path:
    """A fake host root whose compiled policy is CTK_POLICY and whose dpkg database has nvidia-container-toolkit
    at ``ctk_version``."""
    from agent.policy.load import load_and_compile, write_compiled

    root = tmp_path / "root"
    (root / "var/lib/dpkg").mkdir(parents=True)
    (root / "var/lib/dpkg/status").write_text(f"Package: nvidia-container-toolkit\nStatus: install ok installed\n"
                                               f"Architecture: amd64\nVersion: {ctk_version}\n\n")
    (tmp_path / "policy.toml").write_text(CTK_POLICY)
    write_compiled(str(root / "var/lib/gpuguard/policy.compiled.json"),
                   load_and_compile(str(tmp_path / "policy.toml"))[1])
    return root


def slurm_settings(node: str) -> Settings:
    """The settings that hand node ``node`` to Slurm, the state directory /var/lib/gpuguard under the root."""
    return parse_settings('[agent]\nstate_dir = "/var/lib/gpuguard"\n[integrations]\nscheduler = "slurm"\n'
                          f'slurm_node_name = "{node}"\ndrain_wait_seconds = 0\n')


def _held_root(tmp_path: Path, ctk_version: str, answers: Dict[Tuple[str, ...], List[str]]):
    """enforcing_root, its Slurm node ``vm`` answering ``answers`` (scripted scontrol), and its settings."""
    from tests.integrations.test_slurm_handoff import ScriptedScontrol

    runner = ScriptedScontrol(answers)
    return (Host(root=enforcing_root(tmp_path, ctk_version), runner=runner), slurm_settings("vm"), runner,
            StatePaths("/var/lib/gpuguard"))


def _logged() -> io.StringIO:
    stream = io.StringIO()
    configure(level="info", json_output=True, stream=stream)
    return stream


def _events(stream: io.StringIO, name: str) -> List[dict]:
    return [e for e in (json.loads(line) for line in stream.getvalue().splitlines()) if e["event"] == name]


def test_a_revert_the_packages_already_comply_with_ends_the_rollouts_hold(tmp_path: Path) -> None:
    """Drained for rollout R, whose change never came: the revert (serial 45, no admission) finds the installed
    toolkit compliant, so the hold ends at once, the node is resumed and the step says the rollout no longer
    applies (it used to stay drained forever: no package change, so no post-change check)."""
    from tests.integrations.test_slurm_handoff import DRAIN, DRAINED, IDLE, RESUME, SHOW

    host, settings, runner, paths = _held_root(tmp_path, "1.17.4-1",
                                               {SHOW: [IDLE, DRAINED, DRAINED, IDLE], DRAIN: [""], RESUME: [""]})
    assert after_fetch(host, settings, "installed", ADMITTED, 44) is not None
    held = read_state(host, paths)
    assert held is not None and held.phase == "held" and held.drained_by_us
    stream = _logged()
    line = after_fetch(host, settings, "installed", None, 45)
    assert line is not None and line.startswith("rollout R stage 2 no longer applies to this host: nothing changed")
    assert "resumed" in line and runner.calls[-2:] == [RESUME, SHOW]
    assert read_state(host, paths) is None
    step = _events(stream, "maintenance_step")
    assert [(e["step"], e["reason"]) for e in step] == [("end_unapplied_rollout", "rollout R stage 2")]
    assert after_fetch(host, settings, "installed", None, 46) is None  # nothing held any more: nothing asked
    assert runner.calls.count(RESUME) == 1


@pytest.mark.parametrize("damage", ["violates", "no policy", "corrupt policy", "no package database"])
def test_a_rollouts_hold_stays_while_the_packages_do_not_comply_or_cannot_be_judged(tmp_path: Path,
                                                                                    damage: str) -> None:
    """The toolkit already moved to 1.18 (outside the revert's range): the hold stays for the guard's rollback
    and the post-change check after it; a compiled policy or package database that is missing or damaged keeps
    it too (fail safe). Either way the reason is logged and the node is not resumed."""
    from tests.integrations.test_slurm_handoff import DRAIN, DRAINED, IDLE, SHOW

    ctk = "1.18.0-1" if damage == "violates" else "1.17.4-1"
    host, settings, runner, paths = _held_root(tmp_path, ctk, {SHOW: [IDLE, DRAINED], DRAIN: [""]})
    assert after_fetch(host, settings, "installed", ADMITTED, 44) is not None
    compiled = host.path("/var/lib/gpuguard/policy.compiled.json")
    if damage == "no policy":
        compiled.unlink()
    elif damage == "corrupt policy":
        compiled.write_text("{not json")
    elif damage == "no package database":
        host.path("/var/lib/dpkg/status").unlink()
    stream = _logged()
    assert after_fetch(host, settings, "installed", None, 45) is None  # RESUME unscripted: asking it fails
    held = read_state(host, paths)
    assert held is not None and held.phase == "held" and held.reason == "rollout R stage 2"
    kept = _events(stream, "maintenance_hold_kept")
    assert len(kept) == 1 and kept[0]["reason"] == "rollout R stage 2" and kept[0]["serial"] == 45
    if damage == "violates":
        assert kept[0]["rules"] == ["versions.ctk"] and "guard rolls them back" in kept[0]["why"]
    else:
        assert "fail safe" in kept[0]["why"] and kept[0]["error"]


def test_a_kept_hold_and_an_operators_own_hold_are_left_to_the_operator(tmp_path: Path) -> None:
    """A node kept out after a failed post-change check stays kept (logged: an operator ends it), and a hold an
    operator began by hand (not a rollout's) is not looked at; neither is resumed."""
    from agent.integrations.maintenance import begin_maintenance
    from tests.integrations.test_slurm_handoff import DRAIN, DRAINED, IDLE, SHOW

    keep = ("scontrol", "update", "NodeName=vm", "State=DRAIN",
            "Reason=gpuguard: maintenance: post-change check regression (rollout R stage 2)")
    host, settings, runner, paths = _held_root(tmp_path, "1.17.4-1", {SHOW: [IDLE, DRAINED], DRAIN: [""], keep: [""]})
    assert after_fetch(host, settings, "installed", ADMITTED, 44) is not None
    assert end_after_check(host, settings, "regression") is not None
    stream = _logged()
    assert after_fetch(host, settings, "installed", None, 45) is None
    kept = read_state(host, paths)
    assert kept is not None and kept.phase == "kept"
    assert [e["reason"] for e in _events(stream, "maintenance_hold_kept")] == ["rollout R stage 2"]
    paths_file = host.path(paths.maintenance)
    paths_file.unlink()
    operator = ("scontrol", "update", "NodeName=vm", "State=DRAIN", "Reason=gpuguard: maintenance: swap DIMM 3")
    runner.answers.update({SHOW: [IDLE, DRAINED], operator: [""]})
    begin_maintenance(host, paths, settings.integrations, settings.report.nfd_features_file, "swap DIMM 3", 0.0)
    calls = len(runner.calls)
    assert after_fetch(host, settings, "installed", None, 46) is None
    state = read_state(host, paths)
    assert state is not None and state.reason == "swap DIMM 3" and runner.calls[calls:] == []


def test_a_node_an_operator_drained_is_never_resumed_when_the_rollouts_hold_ends(tmp_path: Path) -> None:
    """The node was already drained by an operator (bad DIMM) when rollout R admitted the host: the compliant
    revert ends gpuguard's hold, but the operator's drain stays (scontrol is never asked to resume it)."""
    from tests.integrations.test_slurm_handoff import OPERATOR, SHOW

    host, settings, runner, paths = _held_root(tmp_path, "1.17.4-1", {SHOW: [OPERATOR]})
    assert after_fetch(host, settings, "installed", ADMITTED, 44) is not None
    held = read_state(host, paths)
    assert held is not None and not held.drained_by_us
    line = after_fetch(host, settings, "installed", None, 45)
    assert line is not None and "no longer applies" in line and "bad DIMM slot 3" in line and "not resumed" in line
    assert read_state(host, paths) is None and set(runner.calls) == {SHOW}


def test_an_operators_hold_whose_reason_reads_like_a_rollouts_survives_an_unrelated_install(tmp_path: Path) -> None:
    """An operator drains the node by hand with the reason "rollout R stage 2" (gpuguard maintenance begin's own
    example): the hold records no rollout, so the next bundle installed outside any admission, with the packages
    compliant, neither ends the hold nor resumes the node (before the typed field it did both)."""
    from agent.integrations.maintenance import begin_maintenance
    from tests.integrations.test_slurm_handoff import DRAIN, DRAINED, IDLE, SHOW

    host, settings, runner, paths = _held_root(tmp_path, "1.17.4-1", {SHOW: [IDLE, DRAINED], DRAIN: [""]})
    # what ``gpuguard maintenance begin --reason "rollout R stage 2"`` calls (agent/commands/maintenance.py)
    begin_maintenance(host, paths, settings.integrations, settings.report.nfd_features_file, "rollout R stage 2", 0.0)
    held = read_state(host, paths)
    assert held is not None and held.phase == "held" and held.drained_by_us and held.rollout_id is None
    calls = len(runner.calls)
    assert after_fetch(host, settings, "installed", None, 45) is None  # RESUME unscripted: asking it would fail
    assert read_state(host, paths) == held and runner.calls[calls:] == []


def test_an_operators_kubernetes_hold_keeps_its_label_through_an_unrelated_install(tmp_path: Path) -> None:
    """The same operator's hold on Kubernetes: its label carries no rollout id, and an unrelated compliant install
    leaves the maintenance label in place."""
    from agent.integrations.maintenance import begin_maintenance

    root = enforcing_root(tmp_path, "1.17.4-1")
    features = root / "etc/kubernetes/node-feature-discovery/features.d"
    features.mkdir(parents=True)
    settings = parse_settings('[agent]\nstate_dir = "/var/lib/gpuguard"\n[integrations]\nscheduler = "kubernetes"\n'
                              '[report]\nnfd_features_file = "/etc/kubernetes/node-feature-discovery/features.d/'
                              'gpuguard"\n')
    host, paths = Host(root=root, runner=FakeRunner()), StatePaths("/var/lib/gpuguard")
    begin_maintenance(host, paths, settings.integrations, settings.report.nfd_features_file, "rollout R stage 2", 0.0)
    label = (features / "gpuguard-maintenance").read_text()
    assert "maintenance-reason=rollout_R_stage_2" in label and "maintenance-rollout" not in label
    assert after_fetch(host, settings, "installed", None, 45) is None
    assert (features / "gpuguard-maintenance").read_text() == label
    held = read_state(host, paths)
    assert held is not None and held.rollout_id is None


def test_a_hold_file_from_before_the_rollout_field_is_an_operators(tmp_path: Path) -> None:
    """A maintenance.json written before rollout_id existed loads as an operator's hold (never a traceback), and
    one whose rollout_id is malformed is refused as damaged, never believed."""
    from agent.errors import InputFileError

    host, paths = Host(root=tmp_path), StatePaths("/state")
    (tmp_path / "state").mkdir()
    record = {"scheduler": "slurm", "node": "vm", "reason": "rollout R stage 2", "began_at_seconds": 1.0,
              "drained_by_us": True, "phase": "held", "detail": "", "drained_at_seconds": 2.0}
    host.path(paths.maintenance).write_text(json.dumps(record))
    state = read_state(host, paths)
    assert state is not None and state.rollout_id is None and state.reason == "rollout R stage 2"
    host.path(paths.maintenance).write_text(json.dumps({**record, "rollout_id": "R stage 2"}))
    with pytest.raises(InputFileError):
        read_state(host, paths)
