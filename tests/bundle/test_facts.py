"""A host's scope facts come from the last snapshot the daemon wrote, where it wrote it, under ``--root`` too."""

from __future__ import annotations

from pathlib import Path

from agent.bundle.facts import host_scope_facts
from agent.host import Host
from agent.snapshot.take import take_snapshot
from tests.conftest import ROOTS


def test_the_last_snapshot_is_read_at_the_state_directorys_own_path(tmp_path: Path) -> None:
    """The snapshot job writes last-snapshot.json in the state directory itself (not under the root): the scope
    facts use its pairing (ROCm 6.2 on Ubuntu 22.04) instead of a new snapshot of the root (no GPU, Debian 12)."""
    last = tmp_path / "state/last-snapshot.json"
    last.parent.mkdir()
    last.write_text(take_snapshot(Host.for_root(str(ROOTS / "mi300x-rocm62-ubuntu2204"))).to_json())
    facts = host_scope_facts(Host.for_root(str(ROOTS / "gpuless-debian12")), "node-1", {"rack": "a7"}, str(last))
    assert (facts.os, facts.pairing) == ("ubuntu-22.04", "amdgpu 6.8.5 rocm 6.2.2-116"), facts
    assert (facts.host_id, facts.labels) == ("node-1", {"rack": "a7"})
