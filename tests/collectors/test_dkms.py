"""DKMS tree walking."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.collectors.dkms import DkmsCollector
from agent.errors import CollectorUnavailable
from agent.host import Host


def _touch(root: Path, rel: str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("")


def test_states_built_installed_and_added(tmp_path: Path) -> None:
    """A module in /lib/modules is installed, one only in the DKMS tree is built, a bare source is added."""
    _touch(tmp_path, "var/lib/dkms/amdgpu/6.8.5-2041575.22.04/6.5.0-41-generic/x86_64/module/amdgpu.ko")
    _touch(tmp_path, "lib/modules/6.5.0-41-generic/updates/dkms/amdgpu.ko")
    _touch(tmp_path, "var/lib/dkms/amdgpu/6.8.5-2041575.22.04/6.8.0-45-generic/x86_64/module/amdgpu.ko.zst")
    (tmp_path / "var/lib/dkms/nvidia/580.95.05/source").mkdir(parents=True)
    (tmp_path / "var/lib/dkms/amdgpu/kernel-6.5.0-41-generic-x86_64").symlink_to(
        "6.8.5-2041575.22.04/6.5.0-41-generic/x86_64")
    info = DkmsCollector().collect(Host(root=tmp_path))
    by_key = {(m.module, m.kernel): m.state for m in info.modules}
    assert by_key == {("amdgpu", "6.5.0-41-generic"): "installed", ("amdgpu", "6.8.0-45-generic"): "built",
                      ("nvidia", None): "added"}
    assert [m.version for m in info.states_for("amdgpu", "6.8.0-45-generic")] == ["6.8.5-2041575.22.04"]


def test_absent_without_tree(tmp_path: Path) -> None:
    """No /var/lib/dkms is absent."""
    with pytest.raises(CollectorUnavailable):
        DkmsCollector().collect(Host(root=tmp_path))
