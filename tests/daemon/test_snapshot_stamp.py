"""An interval snapshot whose inputs did not change starts no child (issue #45): the stamp of the collectors' inputs
(agent/daemon_jobs/snapshot_stamp.py) over fixture roots, and real snapshot children counted at the children seam."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import List, Sequence

import pytest

from agent.config import Settings
from agent.daemon_jobs import children
from agent.daemon_jobs.children import SnapshotInChild, child_argv
from agent.daemon_jobs.resident_settings import SettingsInForce
from agent.daemon_jobs.runtime import EventEmitter, Runtime
from agent.daemon_jobs.snapshot_stamp import snapshot_input_stamp
from agent.host import Host
from agent.report.outbox import Outbox
from tests.conftest import ROOTS


@pytest.mark.parametrize("change", [
    "var/lib/dpkg/status", "etc/os-release", "proc/version", "sys/class/drm/card0/device/ras/umc_err_count",
    "sys/module/amdgpu/version", "proc/modules", "etc/default/grub"])
def test_the_stamp_moves_with_each_input_and_only_then(tmp_path: Path, change: str) -> None:
    """Over a copy of the MI300X root the stamp is stable from call to call, and moves when one input's bytes do."""
    root = tmp_path / "root"
    shutil.copytree(ROOTS / "mi300x-rocm62-ubuntu2204", root, symlinks=True)
    host = Host.for_root(str(root))
    before = snapshot_input_stamp(host)
    assert snapshot_input_stamp(host) == before
    target = root / change
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target, "a") as handle:
        handle.write("ue: 1\n" if "ras" in change else "\n")
    assert snapshot_input_stamp(host) != before


@pytest.mark.slow  # real snapshot children
def test_an_unchanged_host_starts_no_snapshot_child_and_a_change_or_the_forced_run_does(
        tmp_path: Path, host_root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Interval runs over an unchanged root start one child, then none; a changed dpkg status or /proc/version, a
    non-interval reason (a package change) and the periodic forced run each start one."""
    host = Host.for_root(str(host_root))
    settings = Settings.model_validate({"agent": {"state_dir": str(tmp_path / "state"), "host_id": "h-1"}})
    outbox = Outbox(str(tmp_path / "state" / "outbox.sqlite3"))
    rt = Runtime(host=host, in_force=SettingsInForce.of(settings), state_dir=str(tmp_path / "state"),
                 outbox=outbox, emitter=EventEmitter(outbox, "h-1", "node-1", host.clock))
    started: List[str] = []

    def argv(job: str, config: str, root: str, request: str, result: str) -> Sequence[str]:
        started.append(job)
        return child_argv(job, config, root, request, result)

    snapshot = SnapshotInChild(rt, "/nonexistent.toml", on_stack_changed=lambda reason: None, argv=argv)
    for _ in range(3):
        snapshot.run("interval")
    assert started == ["snapshot"]
    with open(host_root / "var/lib/dpkg/status", "a") as handle:
        handle.write("\n")
    snapshot.run("interval")
    snapshot.run("interval")
    assert len(started) == 2
    (host_root / "proc/version").write_text("Linux version 6.1.0-27-amd64\n")
    snapshot.run("interval")
    assert len(started) == 3
    snapshot.run("package_change")
    assert len(started) == 4
    monkeypatch.setattr(children, "FORCED_SNAPSHOT_SECONDS", 0.0)
    snapshot.run("interval")
    assert len(started) == 5
    outbox.close()
