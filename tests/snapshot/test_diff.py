"""Component-by-component snapshot diffs."""

from __future__ import annotations

from agent.collectors.base import Status
from agent.frozen import replace
from agent.snapshot.diff import diff_snapshots, flatten, render_diff
from agent.snapshot.take import take_snapshot
from tests.conftest import make_fixture_host


def _with_package(snap, name, version):
    packages = dict(snap.dpkg.data.packages)
    if version is None:
        packages.pop(name)
    else:
        base = next(iter(packages.values()))
        packages[name] = replace(base, version=version)
    return replace(snap, dpkg=replace(snap.dpkg, data=replace(snap.dpkg.data, packages=packages)))


def test_flatten_keys_list_items_by_identity() -> None:
    """GPUs are matched by BDF and DKMS entries by module/version/kernel, not by position."""
    value = {"gpus": [{"bdf": "0000:c1:00.0", "vbios": "a"}], "modules": [
        {"module": "amdgpu", "version": "6.8.5", "kernel": "6.5.0", "state": "installed"}], "ids": ["x", "y"]}
    assert flatten(value) == {"gpus[0000:c1:00.0].bdf": "0000:c1:00.0", "gpus[0000:c1:00.0].vbios": "a",
                              "modules[amdgpu/6.8.5/6.5.0].module": "amdgpu",
                              "modules[amdgpu/6.8.5/6.5.0].version": "6.8.5",
                              "modules[amdgpu/6.8.5/6.5.0].kernel": "6.5.0",
                              "modules[amdgpu/6.8.5/6.5.0].state": "installed", "ids": "x, y"}


def test_diff_reports_changed_added_removed_packages() -> None:
    """An upgrade, a new package and a removal each show as one change in the dpkg section."""
    old = take_snapshot(make_fixture_host("gpuless-debian12"))
    new = _with_package(_with_package(_with_package(old, "runc", "1.1.12-1"), "podman", "4.3.1+ds1-8"),
                        "containerd.io", None)
    diff = diff_snapshots(old, new)
    by_path = {c.path: (c.old, c.new) for c in diff.changes}
    assert by_path["packages.runc.version"] == ("1.1.5+ds1-1+deb12u1", "1.1.12-1")
    assert by_path["packages.podman.version"] == (None, "4.3.1+ds1-8")
    assert by_path["packages.containerd.io.version"] == ("1.7.22-1", None)
    assert diff.changed_sections == ["dpkg"]
    text = render_diff(diff)
    assert "~ dpkg.packages.runc.version: 1.1.5+ds1-1+deb12u1 -> 1.1.12-1" in text
    assert "+ dpkg.packages.podman.version = 4.3.1+ds1-8" in text
    assert "- dpkg.packages.containerd.io.version (was 1.7.22-1)" in text


def test_identical_snapshots_have_no_changes() -> None:
    """Diffing a snapshot with itself yields nothing."""
    snap = take_snapshot(make_fixture_host("gpuless-debian12"))
    assert diff_snapshots(snap, snap).changes == []
    assert render_diff(diff_snapshots(snap, snap)).startswith("no changes")


def test_section_status_change_is_reported() -> None:
    """A section that goes from ok to absent shows its status change."""
    old = take_snapshot(make_fixture_host("gpuless-debian12"))
    new = replace(old, containers=replace(old.containers, status=Status.ABSENT, data=None,
                                          reason="no container runtime or toolkit found"))
    paths = {c.path for c in diff_snapshots(old, new).changes if c.section == "containers"}
    assert "status" in paths and "tools.docker.version" in paths
