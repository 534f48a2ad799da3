"""The Slurm side of the maintenance hand-off: scontrol's one-line node records, drain, wait, resume, keep."""

from __future__ import annotations

from pathlib import Path
from typing import Dict, List, Sequence, Tuple

import pytest

from agent.errors import CommandError
from agent.host import CommandResult, Host
from agent.integrations.slurm import EXIT_OK, SlurmVerdict, apply_to_node
from agent.integrations.slurm_handoff import SlurmHandoff, maintenance_reason, parse_node_line

# Recorded from Debian 12's slurm-wlm 22.05.8 (slurmctld + slurmd on 127.0.0.1, one node, one CPU): idle, running
# a job, draining with the job still running, drained.
_HEAD = ("NodeName=vm Arch=x86_64 CoresPerSocket=1  CPUAlloc={alloc} CPUEfctv=1 CPUTot=1 CPULoad=4.47 "
         "AvailableFeatures=(null) ActiveFeatures=(null) Gres=(null) NodeAddr=127.0.0.1 NodeHostName=vm "
         "Version=22.05.8 OS=Linux 6.18.44-fc-v1252 #1 SMP PREEMPT_DYNAMIC @0  RealMemory=1 AllocMem=0 "
         "FreeMem=20125 Sockets=1 Boards=1 State={state} ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A "
         "MCS_label=N/A Partitions=debug  BootTime=2026-12-04T22:46:14 SlurmdStartTime=2026-12-04T23:41:30 "
         "LastBusyTime=2026-12-04T23:41:30 CfgTRES=cpu=1,mem=1M,billing=1 AllocTRES={tres} CapWatts=n/a "
         "CurrentWatts=0 AveWatts=0 ExtSensorsJoules=n/s ExtSensorsWatts=0 ExtSensorsTemp=n/s")
IDLE = _HEAD.format(alloc=0, state="IDLE", tres="") + "\n"
ALLOCATED = _HEAD.format(alloc=1, state="ALLOCATED", tres="cpu=1,mem=1M,billing=1") + "\n"
OURS = " Reason=gpuguard: maintenance: rollout R stage 2 [root@2026-12-04T23:41:37]"
DRAINING = _HEAD.format(alloc=1, state="ALLOCATED+DRAIN", tres="cpu=1,mem=1M,billing=1") + OURS + "\n"
DRAINED = _HEAD.format(alloc=0, state="IDLE+DRAIN", tres="") + OURS + "\n"
OPERATOR = _HEAD.format(alloc=0, state="IDLE+DRAIN", tres="") + " Reason=bad DIMM slot 3 [alice@2026-12-04T20:00:00]\n"

SHOW = ("scontrol", "show", "node", "-o", "vm")
DRAIN = ("scontrol", "update", "NodeName=vm", "State=DRAIN", "Reason=gpuguard: maintenance: rollout R stage 2")
RESUME = ("scontrol", "update", "NodeName=vm", "State=RESUME")


class ScriptedScontrol:
    """A fake scontrol: each argv answers its recorded outputs in turn (the last one repeats); updates answer "";
    an argv nobody scripted fails the test."""

    def __init__(self, answers: Dict[Tuple[str, ...], List[str]]) -> None:
        self.answers = answers
        self.calls: List[Tuple[str, ...]] = []

    def __call__(self, argv: Sequence[str], timeout_seconds: float) -> CommandResult:
        key = tuple(argv)
        self.calls.append(key)
        assert key in self.answers, f"unscripted command {list(argv)!r}"
        queue = self.answers[key]
        return CommandResult(key, 0, queue.pop(0) if len(queue) > 1 else queue[0], "")


def handoff(runner: ScriptedScontrol) -> Tuple[SlurmHandoff, List[float]]:
    slept: List[float] = []
    clock = [0.0]

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        clock[0] += seconds

    return SlurmHandoff(Host(root=Path("/"), runner=runner), "vm", poll_seconds=2.0, sleep=sleep,
                        monotonic=lambda: clock[0]), slept


@pytest.mark.parametrize("line, state, reason, phase", [
    (IDLE, "IDLE", None, "in service"),
    (ALLOCATED, "ALLOCATED", None, "in service"),
    (DRAINING, "ALLOCATED+DRAIN", "gpuguard: maintenance: rollout R stage 2", "draining"),
    (DRAINED, "IDLE+DRAIN", "gpuguard: maintenance: rollout R stage 2", "drained"),
    (OPERATOR, "IDLE+DRAIN", "bad DIMM slot 3", "drained"),
])
def test_recorded_node_lines_parse_to_state_reason_and_phase(line: str, state: str, reason: str, phase: str) -> None:
    """Each recorded one-line record gives its State=, its reason without the [user@time] tail, and its phase."""
    node = parse_node_line(line)
    assert (node.name, node.state, node.reason, node.phase) == ("vm", state, reason, phase)


def test_a_mixed_or_completing_drain_is_still_draining() -> None:
    """MIXED+DRAIN and IDLE+COMPLETING+DRAIN still have jobs: not drained yet."""
    assert parse_node_line(DRAINING.replace("ALLOCATED+DRAIN", "MIXED+DRAIN")).phase == "draining"
    assert parse_node_line(DRAINED.replace("IDLE+DRAIN", "IDLE+COMPLETING+DRAIN")).phase == "draining"


def test_text_without_a_node_record_is_refused() -> None:
    """scontrol's "Node vm not found" is no node record: ValueError, not a node in service."""
    with pytest.raises(ValueError, match="not a scontrol node record"):
        parse_node_line("Node vm not found\n")


def test_begin_drains_and_waits_until_the_job_is_gone() -> None:
    """begin drains with the maintenance reason and polls DRAINING until DRAINED, then is ready."""
    runner = ScriptedScontrol({SHOW: [IDLE, DRAINING, DRAINING, DRAINED], DRAIN: [""]})
    slurm, slept = handoff(runner)
    step = slurm.begin("rollout R stage 2", wait_seconds=60)
    assert (step.ready, step.drained_by_us, step.scheduler_state) == (True, True, "IDLE+DRAIN")
    assert runner.calls.count(DRAIN) == 1 and slept == [2.0, 2.0]


def test_begin_gives_up_waiting_at_the_bound() -> None:
    """A job that outlives the wait leaves begin not ready, the node still DRAINING, after a bounded wait."""
    slurm, slept = handoff(ScriptedScontrol({SHOW: [IDLE, DRAINING], DRAIN: [""]}))
    step = slurm.begin("rollout R stage 2", wait_seconds=5)
    assert not step.ready and "DRAINING" in step.detail and sum(slept) == pytest.approx(5.0)


def test_begin_on_an_operator_drained_node_neither_drains_nor_claims_it() -> None:
    """A node an operator drained keeps its reason, and the hand-off records that it is not gpuguard's."""
    runner = ScriptedScontrol({SHOW: [OPERATOR]})
    step = handoff(runner)[0].begin("rollout R stage 2", wait_seconds=0)
    assert (step.ready, step.drained_by_us) == (True, False)
    assert all(call[1] != "update" for call in runner.calls)


def test_end_resumes_only_our_own_drain() -> None:
    """end resumes a node drained with the maintenance reason by this hand-off; an operator's drain stays."""
    ours = ScriptedScontrol({SHOW: [DRAINED, IDLE], RESUME: [""]})
    assert handoff(ours)[0].end(drained_by_us=True).detail == "resumed" and RESUME in ours.calls
    operator = ScriptedScontrol({SHOW: [OPERATOR]})
    step = handoff(operator)[0].end(drained_by_us=True)
    assert "not resumed" in step.detail and RESUME not in operator.calls
    taken_over = ScriptedScontrol({SHOW: [DRAINED]})
    assert "not resumed" in handoff(taken_over)[0].end(drained_by_us=False).detail and RESUME not in taken_over.calls


def test_keep_rewrites_the_reason_of_our_drain() -> None:
    """After a failed check the node stays drained, its reason naming the failed check."""
    why = "post-change check cpu_fallback (rollout R stage 2)"
    keep = ("scontrol", "update", "NodeName=vm", "State=DRAIN", f"Reason={maintenance_reason(why)}")
    runner = ScriptedScontrol({SHOW: [DRAINED], keep: [""]})
    step = handoff(runner)[0].keep(True, why)
    assert not step.ready and keep in runner.calls


def test_a_health_check_drain_never_resumes_a_maintenance_hold() -> None:
    """status --slurm --drain, all well, leaves a node the hand-off holds drained (only end resumes it)."""
    runner = ScriptedScontrol({("scontrol", "show", "node", "vm"): [DRAINED]})
    done = apply_to_node(Host(root=Path("/"), runner=runner), "vm", SlurmVerdict(drain=False, exit_code=EXIT_OK,
                                                                                 reason="health: pass"))
    assert done.startswith("held for maintenance") and len(runner.calls) == 1


def test_scontrol_refusing_is_a_command_error() -> None:
    """scontrol exiting non-zero becomes CommandError (exit 6), not a node in service."""
    def refuse(argv: Sequence[str], timeout_seconds: float) -> CommandResult:
        return CommandResult(tuple(argv), 1, "", "slurm_load_node error: Unable to contact slurm controller")

    with pytest.raises(CommandError, match="Unable to contact"):
        SlurmHandoff(Host(root=Path("/"), runner=refuse), "vm").show()
