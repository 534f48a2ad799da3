"""AMD GPU targets from the KFD topology: the number-to-name rule and the tree reader."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import pytest

from agent.hostfacts.kfd import KFD_NODES_DIR, gfx_target, gpu_targets, parse_kfd_properties


@pytest.mark.parametrize("value,expected", [
    (90402, "gfx942"),
    (90010, "gfx90a"),
    (90008, "gfx908"),
    (110501, "gfx1151"),
    (110000, "gfx1100"),
    (100300, "gfx1030"),
    (120001, "gfx1201"),
    (0, None),
])
def test_gfx_target(value: int, expected: Optional[str]) -> None:
    """KFD's decimal gfx_target_version becomes the gfx target name, with minor and stepping in hex."""
    assert gfx_target(value) == expected



def test_parse_kfd_properties_keeps_integer_values() -> None:
    """Name/value lines become ints; malformed lines are skipped."""
    text = "cpu_cores_count 0\ngfx_target_version 90402\nlocation_id 1280\nname odd value\nhive_id abc\n"
    assert parse_kfd_properties(text) == {"cpu_cores_count": 0, "gfx_target_version": 90402, "location_id": 1280}


def test_gpu_targets_reads_every_gpu_node_and_skips_cpus(tmp_path: Path) -> None:
    """CPU nodes (gfx_target_version 0) and unreadable nodes are skipped; targets are distinct and sorted."""
    nodes = tmp_path / KFD_NODES_DIR.lstrip("/")
    for node, version in [("0", 0), ("1", 90402), ("2", 90402), ("3", 90010)]:
        (nodes / node).mkdir(parents=True)
        (nodes / node / "properties").write_text(f"cpu_cores_count 0\ngfx_target_version {version}\n")
    (nodes / "4").mkdir()
    assert gpu_targets(str(tmp_path)) == ("gfx90a", "gfx942")


def test_gpu_targets_without_a_topology_is_empty(tmp_path: Path) -> None:
    """A host without amdgpu (no /sys/class/kfd) has no targets."""
    assert gpu_targets(str(tmp_path)) == ()
