"""Versions newer than AMD's matrix, the TheRock release table and the dcgm-exporter table: one typed finding each.

The hosts are the TheRock MI300X fixture (Ubuntu 22.04, amdgpu 30.30, ROCm 10.0 under /opt/rocm/core-10.0) copied
and moved on the way real hosts move: ROCm 10.1 installed beside 10.0 (AMD's matrix ends at 10.0), a TheRock 10.2
nightly tree (the TheRock table ends at 10.1), the 31.60 driver seen with ROCm 10.0 on Ubuntu 26.04 (the matrix's
driver table ends at 31.50).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Dict, List

from agent.daemon_jobs.runtime import SnapshotFacts
from agent.host import Host
from agent.policy.knowledge_files import therock_table_in_use
from agent.policy.matrix import load_matrix
from agent.policy.table_unknown import amd_matrix, gfx_key, newer, therock
from agent.snapshot.model import Finding
from agent.snapshot.take import take_snapshot
from tests.conftest import RECORDED, ROOTS, fake_module_loader, fixed_clock, load_fake_libraries
from tests.fakes.runner import FakeRunner

SCENARIO = "therock-mi300x-ubuntu2204"
STANZA = ("Package: {name}\nStatus: install ok installed\nPriority: optional\nSection: misc\nInstalled-Size: 100\n"
          "Maintainer: ROCm Dev Support <rocm-dev.support@amd.com>\nArchitecture: amd64\nVersion: {version}\n"
          "Description: {name}\n\n")


def _host(tmp_path: Path, trees: Dict[str, str], packages: Dict[str, str], driver: str = "") -> Host:
    """The fixture host copied, with TheRock trees (release -> .info/version), packages (name -> version) added
    and, when given, amdgpu-dkms at another version."""
    root = tmp_path / "root"
    shutil.copytree(ROOTS / SCENARIO, root, symlinks=True)
    for release, version in trees.items():
        tree = root / "opt/rocm" / f"core-{release}"
        shutil.copytree(root / "opt/rocm/core-10.0", tree)
        (tree / ".info/version").write_text(version + "\n")
    status = root / "var/lib/dpkg/status"
    text = status.read_text()
    if driver:
        text = text.replace("1:6.16.13.30300000-2278356.22.04", driver)
    added = "".join(STANZA.format(name=n, version=v) for n, v in packages.items())
    status.write_text(text.rstrip("\n") + "\n\n" + added)
    return Host(root=root, runner=FakeRunner.from_file(RECORDED / SCENARIO / "commands.json", str(root)),
                load_module=fake_module_loader(load_fake_libraries(SCENARIO)), clock=fixed_clock)


def _unknown(findings: List[Finding]) -> List[tuple]:
    return [(f.details["table"], f.component, f.details["version"], f.details["newest"], f.severity)
            for f in findings if f.kind == "unknown_to_table"]


def test_the_fixture_host_as_it_is_has_no_version_unknown_to_a_table(tmp_path: Path) -> None:
    """ROCm 10.0 on amdgpu 30.30 with MI300X GPUs: every table knows them, no unknown_to_table finding."""
    assert _unknown(list(take_snapshot(_host(tmp_path, {}, {}), matrix=load_matrix().to_compiled()).findings)) == []


def test_rocm_10_1_beside_10_0_is_unknown_to_amds_matrix_that_ends_at_10_0(tmp_path: Path) -> None:
    """amdrocm-base10.1 and /opt/rocm/core-10.1 on a matrix whose newest ROCm row is 10.0: one info finding of the
    AMD matrix naming its recorded date; the TheRock table knows 10.1, so nothing from it."""
    matrix = load_matrix()
    assert max((r.series for r in matrix.rocm), key=lambda s: tuple(map(int, s.split(".")))) == "10.0"
    snap = take_snapshot(_host(tmp_path, {"10.1": "10.1.0"}, {"amdrocm-base10.1": "10.1.0-2"}),
                         matrix=matrix.to_compiled())
    assert _unknown(list(snap.findings)) == [("amd-matrix", "rocm", "10.1", "10.0", "info")]
    [found] = [f for f in snap.findings if f.kind == "unknown_to_table"]
    assert found.details["table_dated"] == matrix.recorded
    assert found.details["packages"] == "amdrocm-base10.1=10.1.0-2"
    assert f"unknown to gpuguard's AMD compatibility matrix dated {matrix.recorded}" in found.message


def test_a_therock_10_2_nightly_tree_is_unknown_to_the_therock_table_and_the_matrix(tmp_path: Path) -> None:
    """/opt/rocm/core-10.2 (a nightly, no package): unknown to the TheRock release table (newest 10.1) and to AMD's
    matrix (newest 10.0), each with its table's date; the heartbeat's facts carry both, typed."""
    snap = take_snapshot(_host(tmp_path, {"10.2": "10.2.0~20261201"}, {}), matrix=load_matrix().to_compiled())
    assert sorted(_unknown(list(snap.findings))) == [("amd-matrix", "rocm", "10.2", "10.0", "info"),
                                                     ("therock", "therock", "10.2", "10.1", "info")]
    [rock] = [f for f in snap.findings if f.details.get("table") == "therock"]
    assert rock.details["table_dated"] == therock_table_in_use().dated
    assert "/opt/rocm/core-10.2" in rock.message and "packages" not in rock.details
    carried = SnapshotFacts.of(snap).unknown_versions
    assert sorted((u.table, u.component, u.version, u.newest) for u in carried) == [
        ("amd-matrix", "rocm", "10.2", "10.0"), ("therock", "therock", "10.2", "10.1")]


def test_an_amdgpu_31_60_driver_is_unknown_to_the_matrix_driver_table(tmp_path: Path) -> None:
    """amdgpu-dkms 1:7.1.9.31600000 (driver 31.60, seen with ROCm 10.0 on Ubuntu 26.04) is newer than the matrix's
    newest driver row (31.50): an amdgpu finding."""
    snap = take_snapshot(_host(tmp_path, {}, {}, driver="1:7.1.9.31600000-2403767.26.04"),
                         matrix=load_matrix().to_compiled())
    assert _unknown(list(snap.findings)) == [("amd-matrix", "amdgpu", "31.60", "31.50", "info")]


def test_newer_is_judged_on_numbers_not_text() -> None:
    """10.10 is newer than 10.9 (text says otherwise); 10.0 is not newer than 10.0; unreadable is never newer."""
    assert newer("10.10", "10.9") and not newer("10.0", "10.0") and not newer("9.9", "10.0")
    assert not newer("10.x", "10.0") and not newer(None, "10.0")
    assert gfx_key("gfx1250") > gfx_key("gfx1201") > gfx_key("gfx950") > gfx_key("gfx942") > gfx_key("gfx90a")
    assert gfx_key("gfx") == () and gfx_key("sm_90") == ()


def test_a_gpu_target_newer_than_every_one_the_matrix_lists_is_reported() -> None:
    """gfx1250 on a matrix whose newest target is gfx1201: a gpu finding; gfx942 and an older unlisted gfx1151 are
    not newer than the table."""
    matrix = {"recorded": "2026-12-04", "driver_rocm": {"31.50": ["10.0"]},
              "rocm": {"10.0": {"gpus": ["gfx950", "gfx1201", "gfx942"]}}}
    found = amd_matrix(matrix, {}, {}, ["gfx942", "gfx1151", "gfx1250", "gfx1250"])
    assert [(u.table, u.component, u.version, u.newest, u.dated) for u in found] == [
        ("amd-matrix", "gpu", "gfx1250", "gfx1201", "2026-12-04")]


def test_therock_side_by_side_releases_only_the_newer_one_is_reported() -> None:
    """7.14 and 10.1 are in the table, 10.10 is not (the numbers say so); one finding with its package."""
    found = therock({"amdrocm-base7.14": "7.14", "amdrocm-base10.1": "10.1", "amdrocm-base10.10": "10.10"},
                    therock_table_in_use())
    assert [(u.version, u.packages) for u in found] == [("10.10", ("amdrocm-base10.10",))]
