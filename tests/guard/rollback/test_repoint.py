"""The fall-back by repointing without a package manager: a fake runner stands in for update-alternatives (it moves
the link the way the real one does), the in-memory backend for the packages (the real thing: the chroot test
tests/guard/apt/chroot/test_therock_trees.py)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Dict, List, Sequence

from agent.config import Settings
from agent.guard.rollback.backend import InstalledPackage
from agent.guard.rollback.repoint import split, tree_key, with_trees
from agent.host import CommandResult, Host
from agent.policy.load import compiled_from, load_policy
from agent.statepaths import StatePaths
from tests.conftest import fixed_clock
from tests.guard.rollback.test_health_rollback import OLD, MemoryBackend
from tests.guard.wiring import health_rollback

TREE_714, TREE_100 = "/opt/rocm/core-7.14", "/opt/rocm/core-10.0"
STATE = f"manual\n/opt/rocm/core\n\n{TREE_100}\n1000\n{TREE_714}\n714\n\n"


class AlternativesRunner:
    """``chroot ROOT update-alternatives --set core TREE``: the /etc/alternatives/core link moved; nothing else."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.calls: List[List[str]] = []

    def __call__(self, argv: Sequence[str], timeout_seconds: float) -> CommandResult:
        self.calls.append(list(argv))
        assert list(argv[:5]) == ["chroot", str(self.root), "update-alternatives", "--set", "core"], argv
        link = self.root / "etc/alternatives/core"
        link.unlink()
        os.symlink(argv[5], link)
        return CommandResult(tuple(argv), 0, "", "")


def _host(tmp_path: Path, active: str) -> Host:
    root = tmp_path / "root"
    for tree in (TREE_714, TREE_100):
        (root / tree.lstrip("/")).mkdir(parents=True)
    (root / "etc/alternatives").mkdir(parents=True)
    (root / "usr/bin").mkdir(parents=True)
    tool = root / "usr/bin/update-alternatives"
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o755)
    os.symlink("/etc/alternatives/core", root / "opt/rocm/core")
    os.symlink(active, root / "etc/alternatives/core")
    (root / "var/lib/dpkg/alternatives").mkdir(parents=True)
    (root / "var/lib/dpkg/alternatives/core").write_text(STATE)
    return Host(root=root, clock=fixed_clock, runner=AlternativesRunner(root))


def _policy(tmp_path: Path) -> Any:
    path = tmp_path / "p.toml"
    path.write_text('[frozen]\npackages = ["amdgpu-dkms", "rocm-core"]\n[health]\nafter_change = "rollback"\n')
    return compiled_from(load_policy(str(path)))


def _passed(host: Host) -> Dict[str, InstalledPackage]:
    """The last set that passed as the health gate hands it over: the packages and 7.14's tree."""
    sets = with_trees(host, {k: (v.version, v.arch) for k, v in OLD.items()})
    return {k: InstalledPackage(*v) for k, v in sets.items()}


def test_the_gate_sets_carry_the_active_tree_and_split_back(tmp_path: Path) -> None:
    """The active tree is one more entry of the gate's sets (alternatives:core -> its path, arch tree), and a set
    to restore splits back into its packages and {alternative: tree}."""
    host = _host(tmp_path, TREE_714)
    passed = _passed(host)
    assert passed[tree_key("core")] == InstalledPackage(TREE_714, "tree")
    assert split(passed) == (OLD, {"core": TREE_714})


def test_packages_as_they_were_and_the_tree_moved_is_repointed_not_reinstalled(tmp_path: Path) -> None:
    """The packages are the last set that passed but core moved to 10.0: update-alternatives --set core back to
    7.14's tree, no package applied, a Rollback event with method repoint."""
    host = _host(tmp_path, TREE_714)
    passed = _passed(host)
    os.replace(host.path("/etc/alternatives/core"), tmp_path / "old-link")
    os.symlink(TREE_100, host.path("/etc/alternatives/core"))
    backend = MemoryBackend(OLD)
    events: List[Any] = []
    result = health_rollback(host, Settings(), "cpu_fallback", sink=events.append, backend=backend,
                             policy=_policy(tmp_path), target=passed, covers="a change")
    assert result.status == "rolled_back", result.detail
    assert os.readlink(host.path("/etc/alternatives/core")) == TREE_714
    assert "apply" not in backend.calls and backend.installed == OLD
    [event] = events
    assert (event.method, event.reason, event.succeeded, event.health_status) == (
        "repoint", "health", True, "cpu_fallback")
    assert (event.from_versions, event.to_versions) == ({"alternatives:core": TREE_100},
                                                        {"alternatives:core": TREE_714})
    record = host.path(StatePaths(Settings().agent.state_dir).health_rollback).read_text()
    assert '"method": "repoint"' in record


def test_a_tree_that_is_no_longer_a_choice_is_a_failed_repoint(tmp_path: Path) -> None:
    """7.14's tree removed from the alternative since it passed: nothing is run, the event says the repoint
    failed and why."""
    host = _host(tmp_path, TREE_100)
    passed = {**OLD, tree_key("core"): InstalledPackage("/opt/rocm/core-7.13", "tree")}
    events: List[Any] = []
    result = health_rollback(host, Settings(), "failed", sink=events.append, backend=MemoryBackend(OLD),
                             policy=_policy(tmp_path), target=passed)
    assert result.status == "failed"
    assert host.runner.calls == []  # type: ignore[attr-defined]
    [event] = events
    assert event.method == "repoint" and event.succeeded is False
    assert "/opt/rocm/core-7.13 is no longer a choice of the alternative core" in (event.detail or "")
