"""The ROCm release from every source a host has (agent/collectors/rocm.py, agent/snapshot/rocm_release.py): the
version file, rocm-core's rocm_version.h and the release package, the source named in the snapshot and a
disagreement between them a finding; and the pip amdsmi binding reported and judged as the hook judges it."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from agent.collectors.rocm import VERSION_HEADER, parse_rocm_version_header
from agent.host import Host
from agent.snapshot.model import Snapshot
from agent.snapshot.render import render_snapshot
from agent.snapshot.take import take_snapshot
from tests.conftest import RECORDED, ROOTS, fake_module_loader, fixed_clock, load_fake_libraries
from tests.fakes.runner import FakeRunner

SCENARIO = "therock-mi300x-ubuntu2204"  # TheRock 10.0 only: amdrocm-base10.0 10.0.0-4, /opt/rocm/core-10.0
TREE = "opt/rocm/core-10.0"
HEADER_714 = """#ifndef ROCM_VERSION_H
#define ROCM_VERSION_H
#define ROCM_VERSION_MAJOR   7
#define ROCM_VERSION_MINOR   14
#define ROCM_VERSION_PATCH   0
#endif
"""


def _header(major: int, minor: int, patch: int) -> str:
    return HEADER_714.replace("7\n", f"{major}\n", 1).replace("14\n", f"{minor}\n", 1).replace(
        "PATCH   0", f"PATCH   {patch}")


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """A copy of the TheRock 10.0 fixture host that a test may change."""
    copy = tmp_path / "root"
    shutil.copytree(ROOTS / SCENARIO, copy, symlinks=True)
    return copy


def _snapshot(root: Path) -> Snapshot:
    runner = FakeRunner.from_file(RECORDED / SCENARIO / "commands.json", str(root))
    host = Host(root=root, runner=runner, load_module=fake_module_loader(load_fake_libraries(SCENARIO)),
                clock=fixed_clock)
    return take_snapshot(host)


@pytest.mark.parametrize("text, release", [
    (HEADER_714, "7.14.0"),
    ("#define ROCM_VERSION_MAJOR 10\n#define ROCM_VERSION_MINOR 0\n#define ROCM_VERSION_PATCH 0\n", "10.0.0"),
    ("#define ROCM_VERSION_MAJOR (6)\n#define ROCM_VERSION_MINOR (4)\n#define ROCM_VERSION_PATCH (1)\n", "6.4.1"),
    ("#define ROCM_VERSION_MAJOR 7\n#define ROCM_VERSION_MINOR 14\n", None),  # no patch: not a release
    ("#define ROCM_BUILD_INFO \"7.14.0-1\"\n", None),
    ("", None),
])
def test_rocm_version_header_parsed(text: str, release: str) -> None:
    """MAJOR.MINOR.PATCH from rocm_version.h's three defines; None unless all three are there."""
    assert parse_rocm_version_header(text) == release


def test_without_the_version_file_the_release_package_says_it(root: Path) -> None:
    """With /opt/rocm/core-10.0/.info/version gone the snapshot still reports ROCm 10.0.0, naming amdrocm-base10.0
    as where it was read (today it reports none)."""
    (root / TREE / ".info/version").unlink()
    rocm = _snapshot(root).rocm.data
    assert rocm is not None
    assert (rocm.version, rocm.version_source) == ("10.0.0", "amdrocm-base10.0")
    assert [(i.path, i.version, i.version_source) for i in rocm.installs] == [
        ("/opt/rocm/core-10.0", "10.0.0", "amdrocm-base10.0")]
    assert "rocm     10.0.0 (read from amdrocm-base10.0) at /opt/rocm/core-10.0" in render_snapshot(_snapshot(root))


def test_without_the_version_file_the_header_says_it(root: Path) -> None:
    """rocm-core's header is read before the package, and named as the source."""
    (root / TREE / ".info/version").unlink()
    (root / TREE / "include/rocm-core").mkdir(parents=True)
    (root / TREE / VERSION_HEADER).write_text(_header(10, 0, 0))
    snap = _snapshot(root)
    assert snap.rocm.data is not None
    assert (snap.rocm.data.version, snap.rocm.data.version_source) == ("10.0.0", VERSION_HEADER)
    assert [f for f in snap.findings if f.kind == "rocm_version_mismatch"] == []


def test_the_version_file_is_the_default_source_and_not_written_out(root: Path) -> None:
    """A tree whose version file says its release names no source (stored snapshots keep their bytes), and a
    header that agrees is kept beside it without a finding."""
    (root / TREE / "include/rocm-core").mkdir(parents=True)
    (root / TREE / VERSION_HEADER).write_text(_header(10, 0, 0))
    snap = _snapshot(root)
    assert snap.rocm.data is not None and snap.rocm.data.version_source is None
    assert snap.rocm.data.installs[0].header_version == "10.0.0"
    assert '"version_source"' not in snap.to_json()
    assert [f for f in snap.findings if f.kind == "rocm_version_mismatch"] == []


def test_a_header_that_disagrees_with_the_version_file_is_a_finding(root: Path) -> None:
    """rocm_version.h saying 7.14.0 in a tree whose version file says 10.0.0: a finding naming both files."""
    (root / TREE / "include/rocm-core").mkdir(parents=True)
    (root / TREE / VERSION_HEADER).write_text(HEADER_714)
    found = [f for f in _snapshot(root).findings if f.kind == "rocm_version_mismatch"]
    assert [(f.severity, f.message) for f in found] == [(
        "warning", "/opt/rocm/core-10.0/.info/version says ROCm 10.0.0 but "
                   "/opt/rocm/core-10.0/include/rocm-core/rocm_version.h says 7.14.0")]


def test_a_version_file_that_disagrees_with_the_core_package_is_a_finding(root: Path) -> None:
    """Without amdrocm-base10.0 in dpkg's status, TheRock's amdrocm-core10.0 is the release package the version
    file is held against."""
    status = root / "var/lib/dpkg/status"
    stanzas = status.read_text().split("\n\n")
    status.write_text("\n\n".join(s for s in stanzas if "Package: amdrocm-base10.0\n" not in s))
    (root / TREE / ".info/version").write_text("10.1.0\n")
    found = [f for f in _snapshot(root).findings if f.kind == "rocm_version_mismatch"]
    assert [f.message for f in found] == [
        "/opt/rocm/core-10.0 says ROCm 10.1.0 but package amdrocm-core10.0 is 10.0.0-4"]


def _dist_info(root: Path, version: str) -> None:
    where = root / f"usr/local/lib/python3.10/dist-packages/amdsmi-{version}.dist-info"
    where.mkdir(parents=True)
    (where / "METADATA").write_text(f"Metadata-Version: 2.1\nName: amdsmi\nVersion: {version}\n")


def test_a_pip_binding_of_another_release_is_a_snapshot_finding(root: Path) -> None:
    """PyPI's amdsmi 7.0.2 pip installed on the TheRock 10.0 host: the snapshot reports the binding and the
    companion finding the apt hook and ``policy explain`` give (today the snapshot says nothing)."""
    _dist_info(root, "7.0.2")
    snap = _snapshot(root)
    assert snap.rocm.data is not None and snap.rocm.data.amdsmi_binding is not None
    assert (snap.rocm.data.amdsmi_binding.version, snap.rocm.data.amdsmi_binding.site_directory) == (
        "7.0.2", "/usr/local/lib/python3.10/dist-packages")
    found = [f for f in snap.findings if f.kind == "companion_mismatch"]
    assert [(f.severity, f.details["rule"], f.message) for f in found] == [(
        "warning", "companion.amdsmi",
        "the pip amdsmi binding 7.0.2 (/usr/local/lib/python3.10/dist-packages) needs libamd_smi of ROCm 7.0; "
        "the host has libamd_smi of ROCm 10.0.0 (amdrocm-amdsmi, amdrocm-amdsmi10.0)")]


def test_a_pip_binding_of_the_same_release_is_no_finding(root: Path) -> None:
    """PyPI's amdsmi 10.0.0 beside TheRock 10.0's library: reported, no finding."""
    _dist_info(root, "10.0.0")
    snap = _snapshot(root)
    assert snap.rocm.data is not None and snap.rocm.data.amdsmi_binding is not None
    assert [f for f in snap.findings if f.kind == "companion_mismatch"] == []


def test_a_classic_tree_is_held_against_its_versioned_release_package(tmp_path: Path) -> None:
    """On the mixed classic 6.4.1 + TheRock 7.13 host, /opt/rocm-6.4.1/.info/version saying 6.4.2 disagrees with
    rocm-core (the active tree's package) and with rocm-core6.4.1 (the tree's own): both are named."""
    scenario = "mixed-rocm641-therock713-ubuntu2204"
    root = tmp_path / "root"
    shutil.copytree(ROOTS / scenario, root, symlinks=True)
    (root / "opt/rocm-6.4.1/.info/version").write_text("6.4.2-83\n")
    runner = FakeRunner.from_file(RECORDED / scenario / "commands.json", str(root))
    snap = take_snapshot(Host(root=root, runner=runner, load_module=fake_module_loader(load_fake_libraries(scenario)),
                              clock=fixed_clock))
    found = sorted(f.message for f in snap.findings if f.kind == "rocm_version_mismatch")
    assert found == ["/opt/rocm says ROCm 6.4.2-83 but package rocm-core is 6.4.1.60401-83~22.04",
                     "/opt/rocm-6.4.1 says ROCm 6.4.2-83 but package rocm-core6.4.1 is 6.4.1.60401-83~22.04"]
