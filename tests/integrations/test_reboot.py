"""Reboots through Slurm, without Slurm: the decision from typed findings, the scontrol argv, the hand-off's
reboot step and the gate's verdict after the boot (real Slurm: test_slurm_reboot_real.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import pytest

from agent.errors import InputFileError
from agent.host import Host
from agent.integrations.hold import read_state, write_state
from agent.integrations.maintenance import (
    EXIT_MAINTENANCE_KEPT,
    EXIT_MAINTENANCE_OK,
    EXIT_MAINTENANCE_REBOOTING,
    after_boot,
    after_check,
    begin_maintenance,
)
from agent.integrations.reboot import parse_boot_time, read_reboot_needs, reboot_needs
from agent.integrations.slurm_handoff import SlurmHandoff, reboot_argv
from agent.statepaths import StatePaths
from agent.status.assess import assess
from agent.status.facts import HealthFacts, MaintenanceFacts, MetricsFacts
from agent.status.slurm import slurm_verdict
from tests.integrations.test_maintenance import NOW, SLURM
from tests.integrations.test_slurm_handoff import DRAIN, DRAINED, IDLE, OPERATOR, RESUME, SHOW, ScriptedScontrol
from tests.status.test_assess import MIN, healthy
from tests.status.test_assess import NOW as STATUS_NOW

KERNEL = {"kind": "reboot_pending", "severity": "info", "component": "kernel", "message": "anything at all",
          "details": {"running": "6.8.0-40-generic", "next_boot": "6.8.0-45-generic"}}
AMDGPU = {"kind": "driver_installed_not_loaded", "severity": "warning", "component": "amdgpu",
          "message": "amdgpu-dkms 6.10.5 is installed but amdgpu 6.8.5 is loaded",
          "details": {"installed": "1:6.10.5.60300-2084815.24.04", "loaded": "6.8.5"}}
NVIDIA = {"kind": "driver_installed_not_loaded", "severity": "warning", "component": "nvidia", "message": "",
          "details": {"package": "nvidia-driver-570", "installed": "570.124.06-0ubuntu1", "loaded": "565.57.01"}}
# A finding of another kind whose message reads like a reboot: text is never parsed to decide.
WORDY = {"kind": "rocm_version_mismatch", "severity": "warning", "component": "rocm",
         "message": "reboot pending: next boot uses kernel 6.9", "details": {}}
WHY = "kernel: next boot 6.8.0-45-generic, running 6.8.0-40-generic"
REBOOT = ("scontrol", "reboot", f"reason=gpuguard: maintenance: reboot: {WHY} (rollout R stage 2)", "vm")


@pytest.mark.parametrize("findings, needs", [
    ([], []),
    ([WORDY], []),
    ([KERNEL], [WHY]),
    ([AMDGPU], ["amdgpu: installed 1:6.10.5.60300-2084815.24.04, loaded 6.8.5"]),
    ([NVIDIA], ["nvidia: installed 570.124.06-0ubuntu1 (nvidia-driver-570), loaded 565.57.01"]),
    ([WORDY, KERNEL, KERNEL, NVIDIA], [WHY, "nvidia: installed 570.124.06-0ubuntu1 (nvidia-driver-570), "
                                            "loaded 565.57.01"]),
    (["not a finding", {"kind": 3}], []),
])
def test_reboot_needs_come_from_the_finding_kinds_and_details(findings: List[object], needs: List[str]) -> None:
    """A next-boot kernel other than the running one, or a driver installed at another version than the loaded
    module, needs a reboot; other kinds never do, whatever their message says."""
    assert reboot_needs(findings) == needs


def test_read_reboot_needs_from_the_last_snapshot(tmp_path: Path) -> None:
    """No snapshot file: no need; a snapshot's findings are read; a damaged file is an error naming it."""
    path = tmp_path / "last-snapshot.json"
    assert read_reboot_needs(str(path)) == []
    path.write_text(json.dumps({"taken_at": "2026-12-04T23:00:00+00:00", "findings": [KERNEL]}))
    assert read_reboot_needs(str(path)) == [WHY]
    path.write_text(json.dumps({"taken_at": "2026-12-04T23:00:00+00:00", "findings": "none"}))
    with pytest.raises(InputFileError, match="last-snapshot.json"):
        read_reboot_needs(str(path))


@pytest.mark.parametrize("text, seconds", [
    ("cpu  1 2 3\nintr 5\nbtime 1796590000\nprocesses 4\n", 1796590000.0),
    ("cpu  1 2 3\n", None),
    ("btime soon\n", None),
])
def test_parse_boot_time(text: str, seconds: Optional[float]) -> None:
    """The btime line of /proc/stat is when the machine booted; without one the boot time is unknown."""
    assert parse_boot_time(text) == seconds


def test_reboot_argv_waits_for_idle_and_keeps_the_drain() -> None:
    """The argv asks for a reboot when idle with a one-line gpuguard reason: no ASAP and no nextstate, which
    would clear the drain when slurmd registers after the boot."""
    argv = reboot_argv("gpu07", "kernel: next boot b\nrunning a " + "x" * 400)
    assert argv[0] == "reboot" and argv[-1] == "gpu07" and len(argv) == 3
    assert argv[1].startswith("reason=gpuguard: maintenance: reboot: kernel: next boot b running a")
    assert "\n" not in argv[1] and len(argv[1]) <= len("reason=") + 200
    assert not any(a.upper() == "ASAP" or a.lower().startswith("nextstate") for a in argv)


def _handoff(runner: ScriptedScontrol) -> SlurmHandoff:
    return SlurmHandoff(Host(root=Path("/"), runner=runner), "vm")


def test_the_handoff_reboots_only_its_own_drain() -> None:
    """A node gpuguard drained is rebooted through scontrol; one an operator drained is not (None)."""
    runner = ScriptedScontrol({SHOW: [DRAINED], REBOOT: [""]})
    step = _handoff(runner).reboot(True, f"{WHY} (rollout R stage 2)")
    assert step is not None and REBOOT in runner.calls and step.detail.startswith("reboot asked: kernel")
    runner = ScriptedScontrol({SHOW: [OPERATOR]})
    assert _handoff(runner).reboot(True, WHY) is None and runner.calls == [SHOW]


def _held(tmp_path: Path, boot_time: float,
          snapshot: Optional[Dict[str, object]] = None) -> Tuple[Host, StatePaths]:
    """A host root with /proc/stat's boot time, a held node and the daemon's last snapshot."""
    root = tmp_path / "root"
    (root / "proc").mkdir(parents=True)
    (root / "proc" / "stat").write_text(f"btime {int(boot_time)}\n")
    paths = StatePaths("/var/lib/gpuguard")
    host = Host(root=root, runner=ScriptedScontrol({SHOW: [IDLE, DRAINED], DRAIN: [""]}), clock=lambda: NOW)
    begin_maintenance(host, paths, SLURM, "", "rollout R stage 2")
    (root / "var/lib/gpuguard/last-snapshot.json").write_text(json.dumps(
        snapshot if snapshot is not None else {"taken_at": NOW.isoformat(), "findings": [KERNEL]}))
    return host, paths


def _on(host: Host, runner: ScriptedScontrol, boot_time: Optional[float] = None) -> Host:
    if boot_time is not None:
        host.path("/proc/stat").write_text(f"btime {int(boot_time)}\n")
    return Host(root=host.root, runner=runner, clock=lambda: NOW)


def test_a_pass_that_needs_a_reboot_asks_for_one_then_the_gate_ends_it(tmp_path: Path) -> None:
    """A passing post-change check on a host whose next boot has another kernel asks Slurm to reboot the node
    (hold rebooting, exit 42) instead of resuming it; a pass from before the boot changes nothing; after the boot
    the gate's pass resumes it and forgets the hold."""
    asked = NOW.timestamp()
    host, paths = _held(tmp_path, asked - 3600)
    runner = ScriptedScontrol({SHOW: [DRAINED], REBOOT: [""]})
    outcome = after_check(_on(host, runner), paths, SLURM, "", "pass")
    assert outcome is not None and outcome.exit_code == EXIT_MAINTENANCE_REBOOTING and REBOOT in runner.calls
    state = read_state(host, paths)
    assert state is not None and state.phase == "rebooting" and state.reboot_asked_at_seconds == asked
    from agent.guard.hotpath.maintenance import drain_wait

    assert drain_wait(str(host.path(paths.maintenance))) == (None, False)  # the apt hook: a valid hold, not waiting
    assert after_check(_on(host, ScriptedScontrol({})), paths, SLURM, "", "pass") is None  # not booted yet
    assert after_boot(_on(host, ScriptedScontrol({})), paths, SLURM, "", True, "ok") is None
    runner = ScriptedScontrol({SHOW: [DRAINED, IDLE], RESUME: [""]})
    outcome = after_boot(_on(host, runner, asked + 60), paths, SLURM, "", True, "ok")
    assert outcome is not None and outcome.exit_code == EXIT_MAINTENANCE_OK and RESUME in runner.calls
    assert read_state(host, paths) is None


def test_a_failing_gate_or_a_need_that_survives_the_reboot_keeps_the_node_out(tmp_path: Path) -> None:
    """A failing gate after the boot keeps the node drained with its reason; a host that still needs a reboot
    after the one asked for is kept too (never a second reboot)."""
    asked = NOW.timestamp()
    host, paths = _held(tmp_path, asked - 3600)
    after_check(_on(host, ScriptedScontrol({SHOW: [DRAINED], REBOOT: [""]})), paths, SLURM, "", "pass")
    state = read_state(host, paths)
    assert state is not None
    keep = ("scontrol", "update", "NodeName=vm", "State=DRAIN",
            "Reason=gpuguard: maintenance: post-boot check: health: cpu_fallback (rollout R stage 2)")
    runner = ScriptedScontrol({SHOW: [DRAINED], keep: [""]})
    outcome = after_boot(_on(host, runner, asked + 60), paths, SLURM, "", False, "health: cpu_fallback")
    assert outcome is not None and outcome.exit_code == EXIT_MAINTENANCE_KEPT and keep in runner.calls
    write_state(host, paths, state)  # rebooting again, and the kernel still differs after the boot
    again = ("scontrol", "update", "NodeName=vm", "State=DRAIN",
             f"Reason=gpuguard: maintenance: still needs a reboot after the reboot: {WHY} (rollout R stage 2)")
    runner = ScriptedScontrol({SHOW: [DRAINED], again: [""]})
    outcome = after_check(_on(host, runner), paths, SLURM, "", "pass")
    assert outcome is not None and outcome.exit_code == EXIT_MAINTENANCE_KEPT and REBOOT not in runner.calls


def test_a_pass_without_a_reboot_need_resumes_as_before(tmp_path: Path) -> None:
    """No reboot finding in the last snapshot: the passing check gives the node back at once."""
    host, paths = _held(tmp_path, NOW.timestamp() - 3600, {"taken_at": NOW.isoformat(), "findings": [WORDY]})
    runner = ScriptedScontrol({SHOW: [DRAINED, IDLE], RESUME: [""]})
    outcome = after_check(_on(host, runner), paths, SLURM, "", "pass")
    assert outcome is not None and outcome.exit_code == EXIT_MAINTENANCE_OK and RESUME in runner.calls


ASKED = STATUS_NOW - 30 * MIN
BOOTED = STATUS_NOW - 20 * MIN
REBOOTING = MaintenanceFacts(phase="rebooting", scheduler="slurm", node="vm", reason="rollout R stage 2",
                             reboot_asked_at=ASKED, booted_at=BOOTED)


@pytest.mark.parametrize("changes, drain, gate, words", [
    ({"maintenance": REBOOTING.model_copy(update={"booted_at": ASKED - MIN})}, True, "waiting",
     "maintenance: waiting for the reboot"),
    ({"maintenance": REBOOTING.model_copy(update={"booted_at": None})}, True, "waiting", "waiting for the reboot"),
    ({"maintenance": REBOOTING}, True, "waiting", "health: no check since the boot"),  # the pass is older
    ({"maintenance": REBOOTING, "health": HealthFacts(status="deferred", finished_at=STATUS_NOW - MIN)}, True,
     "waiting", "health: deferred since the boot"),
    ({"maintenance": REBOOTING, "health": HealthFacts(status="pass", finished_at=STATUS_NOW - MIN),
      "metrics": MetricsFacts()}, True, "waiting", "compliance: not known since the boot"),
    ({"maintenance": REBOOTING, "health": HealthFacts(status="pass", finished_at=STATUS_NOW - MIN),
      "metrics": MetricsFacts(compliant=True, written_at=BOOTED - MIN)}, True, "waiting",
     "compliance: not known since the boot"),
    ({"maintenance": REBOOTING, "health": HealthFacts(status="pass", finished_at=STATUS_NOW - MIN)}, False, "judged",
     "health: pass"),
    ({"maintenance": REBOOTING, "health": HealthFacts(status="cpu_fallback", finished_at=STATUS_NOW - MIN,
                                                      summary="torch sees no GPU")}, True, "judged",
     "health: cpu_fallback"),
    ({"maintenance": REBOOTING, "health": HealthFacts(status="pass", finished_at=STATUS_NOW - MIN),
      "metrics": MetricsFacts(compliant=False, written_at=STATUS_NOW - MIN)}, True, "judged",
     "compliance: NOT compliant"),
    ({}, False, "none", "health: pass"),
])
def test_the_gate_after_the_reboot(changes: dict, drain: bool, gate: str, words: str) -> None:
    """After an asked reboot the node may take jobs only once it booted since the ask, a health check after the
    boot passed and the policy is compliant; a failure after the boot is judged, anything earlier waits."""
    facts = healthy(**changes)
    verdict = slurm_verdict(facts, assess(facts))
    assert (verdict.drain, verdict.reboot_gate) == (drain, gate), verdict
    assert words in verdict.reason and "\n" not in verdict.reason


def test_status_shows_a_rebooting_hold_as_attention() -> None:
    """gpuguard status shows the rebooting hold as a warning, not a failure."""
    checks = {c.name: c.state for c in assess(healthy(maintenance=REBOOTING)).checks}
    assert checks["maintenance"] == "warn"


