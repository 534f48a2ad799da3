"""ROCm user space: the active /opt/rocm, installed trees and amdsmi's view of the ROCm version."""

from __future__ import annotations

from pathlib import Path
from typing import Any, List, Optional, Tuple

import pytest

from agent.collectors.rocm import (
    RocmCollector,
    RocmInstall,
    amd_smi_sonames,
    hip_library_release,
    packaged_components,
    packaged_release,
    parse_rocm_version_file,
    smi_rocm_version,
)
from agent.errors import CollectorUnavailable
from agent.host import Host
from tests.conftest import fake_module_loader, make_fixture_host
from tests.fakes.amdsmi import make_fake_amdsmi


def _tree(root: Path, name: str, version: Optional[str]) -> None:
    (root / "opt" / name / ".info").mkdir(parents=True)
    if version is not None:
        (root / "opt" / name / ".info" / "version").write_text(version)


@pytest.mark.parametrize("text,expected", [
    ("6.2.2-116\n", "6.2.2-116"),
    ("7.0.1\n", "7.0.1"),
    ("  7.2.0  \n\n", "7.2.0"),
    ("6.4.1\nsomething else\n", "6.4.1"),
    ("6.3.0-39\r\n", "6.3.0-39"),
    ("", None),
    ("\n", None),
    ("unknown\n", None),
    ("7\n", None),
])
def test_parse_rocm_version_file(text: str, expected: Optional[str]) -> None:
    """The first line when it starts with a dotted version, build suffix kept; anything else is None."""
    assert parse_rocm_version_file(text) == expected


@pytest.mark.parametrize("result,expected", [
    ((True, "7.0.2"), "7.0.2"),
    ((False, "Could not find librocm-core.so"), None),
    ((True, ""), None),
    ("7.0.2", None),
    (None, None),
])
def test_smi_rocm_version(result: Any, expected: Optional[str]) -> None:
    """Only a successful (True, version) answer counts; on failure the text is an error message."""
    assert smi_rocm_version(result) == expected


def test_mi300x_absolute_link() -> None:
    """/opt/rocm -> /opt/rocm-6.2.2 resolves inside the root; the 6.2-era binding has no rocm version call."""
    info = RocmCollector().collect(make_fixture_host("mi300x-rocm62-ubuntu2204"))
    assert (info.active_path, info.version, info.smi_rocm_version) == ("/opt/rocm-6.2.2", "6.2.2-116", None)
    assert info.installs == [RocmInstall(path="/opt/rocm-6.2.2", version="6.2.2-116")]


def test_rhel9_link_through_alternatives_and_amdsmi_version() -> None:
    """Two hops (/opt/rocm -> /etc/alternatives/rocm -> /opt/rocm-7.0.2) and amdsmi's (True, "7.0.2")."""
    info = RocmCollector().collect(make_fixture_host("rocm7-rhel9"))
    assert (info.active_path, info.version, info.smi_rocm_version) == ("/opt/rocm-7.0.2", "7.0.2", "7.0.2")
    assert info.installs == [RocmInstall(path="/opt/rocm-7.0.2", version="7.0.2")]


def test_drift_relative_link_without_amdsmi() -> None:
    """A relative /opt/rocm -> rocm-6.3.0 link; no amdsmi, so no smi version."""
    info = RocmCollector().collect(make_fixture_host("amdgpu-drift"))
    assert (info.active_path, info.version, info.smi_rocm_version) == ("/opt/rocm-6.3.0", "6.3.0-39", None)


def test_installs_sorted_by_version_and_links_left_out(tmp_path: Path) -> None:
    """Several trees sort by version (6.10 after 6.3); a rocm-X link is not a tree of its own."""
    for name, version in (("rocm-6.10.0", "6.10.0-1\n"), ("rocm-6.2.2", "6.2.2-116\n"), ("rocm-6.3.0", None)):
        _tree(tmp_path, name, version)
    (tmp_path / "opt/rocm-6.2").symlink_to("rocm-6.2.2")
    (tmp_path / "opt/rocm").symlink_to("/opt/rocm-6.10.0")
    (tmp_path / "opt/rocmbackup").mkdir()
    info = RocmCollector().collect(Host(root=tmp_path, load_module=fake_module_loader({})))
    assert info.installs == [RocmInstall(path="/opt/rocm-6.2.2", version="6.2.2-116"),
                             RocmInstall(path="/opt/rocm-6.3.0", version=None),
                             RocmInstall(path="/opt/rocm-6.10.0", version="6.10.0-1")]
    assert (info.active_path, info.version) == ("/opt/rocm-6.10.0", "6.10.0-1")


def test_trees_without_active_link(tmp_path: Path) -> None:
    """Installed trees but no /opt/rocm: nothing is active."""
    _tree(tmp_path, "rocm-7.0.2", "7.0.2\n")
    info = RocmCollector().collect(Host(root=tmp_path, load_module=fake_module_loader({})))
    assert (info.active_path, info.version) == (None, None)
    assert [i.path for i in info.installs] == ["/opt/rocm-7.0.2"]


def test_dangling_active_link(tmp_path: Path) -> None:
    """/opt/rocm pointing at a removed tree keeps the target, with no version."""
    (tmp_path / "opt").mkdir()
    (tmp_path / "opt/rocm").symlink_to("/opt/rocm-6.1.0")
    info = RocmCollector().collect(Host(root=tmp_path, load_module=fake_module_loader({})))
    assert (info.active_path, info.version, info.installs) == ("/opt/rocm-6.1.0", None, [])


def test_amdsmi_failure_never_fails_the_collector(tmp_path: Path) -> None:
    """amdsmi_get_rocm_version raising, or answering (False, error), leaves only smi_rocm_version unset."""
    _tree(tmp_path, "rocm-7.0.2", "7.0.2\n")
    (tmp_path / "opt/rocm").symlink_to("rocm-7.0.2")
    failing = make_fake_amdsmi({"rocm_version": [True, "7.0.2"]})

    def raise_os_error() -> tuple:
        raise OSError("librocm-core.so: cannot open shared object file")

    failing.amdsmi_get_rocm_version = raise_os_error  # type: ignore[attr-defined]
    not_found = make_fake_amdsmi({"rocm_version": [False, "Could not find librocm-core.so"]})
    for smi in (failing, not_found):
        info = RocmCollector().collect(Host(root=tmp_path, load_module=fake_module_loader({"amdsmi": smi})))
        assert (info.version, info.smi_rocm_version) == ("7.0.2", None)


def test_absent_without_any_rocm_tree(tmp_path: Path) -> None:
    """No /opt/rocm and no /opt/rocm-*: absent."""
    (tmp_path / "opt/other").mkdir(parents=True)
    with pytest.raises(CollectorUnavailable):
        RocmCollector().collect(Host(root=tmp_path, load_module=fake_module_loader({})))


@pytest.mark.parametrize("names,expected", [
    (["libamd_smi.so", "libamd_smi.so.27", "libamd_smi.so.27.0.0", "librocm-core.so.1"], ["libamd_smi.so.27"]),
    (["libamd_smi.so.26.2.0", "libamd_smi.so.27"], ["libamd_smi.so.26", "libamd_smi.so.27"]),
    (["libamd_smi.so", "libamd_smi64.so.27", "libamd_smi.so.x"], []),
])
def test_amd_smi_sonames(names: list, expected: list) -> None:
    """The SONAMEs (libamd_smi.so.N) among a lib directory's names, each major once, sorted; others ignored."""
    assert amd_smi_sonames(names) == expected


def test_therock_only_host_reports_its_release() -> None:
    """A TheRock 10.0 host (/opt/rocm a directory, core -> core-10.0): the release, its tree and libamd_smi.so.27."""
    info = RocmCollector().collect(make_fixture_host("therock-mi300x-ubuntu2204"))
    assert (info.active_path, info.version, info.smi_rocm_version) == ("/opt/rocm/core-10.0", "10.0.0", "10.0.0")
    assert info.installs == [RocmInstall(path="/opt/rocm/core-10.0", version="10.0.0",
                                         amd_smi_soname="libamd_smi.so.27")]


def test_mixed_host_reports_the_classic_and_the_therock_release() -> None:
    """Classic 6.4.1 (the /opt/rocm link) and TheRock 7.13 inside its target: both trees, each with its SONAME."""
    info = RocmCollector().collect(make_fixture_host("mixed-rocm641-therock713-ubuntu2204"))
    assert (info.active_path, info.version) == ("/opt/rocm-6.4.1", "6.4.1-83")
    assert info.installs == [
        RocmInstall(path="/opt/rocm-6.4.1", version="6.4.1-83", amd_smi_soname="libamd_smi.so.25"),
        RocmInstall(path="/opt/rocm/core-7.13", version="7.13.0", amd_smi_soname="libamd_smi.so.27")]


def test_therock_releases_side_by_side_without_core_link(tmp_path: Path) -> None:
    """Two TheRock releases, no /opt/rocm/core link: both listed in version order, the newest is the active one;
    the core-10 major link is not a release of its own."""
    for release in ("10.0", "7.14"):
        (tmp_path / "opt/rocm" / f"core-{release}/.info").mkdir(parents=True)
        (tmp_path / "opt/rocm" / f"core-{release}/.info/version").write_text(f"{release}.0\n")
    (tmp_path / "opt/rocm/core-10").symlink_to("core-10.0")
    info = RocmCollector().collect(Host(root=tmp_path, load_module=fake_module_loader({})))
    assert [(i.path, i.version) for i in info.installs] == [("/opt/rocm/core-7.14", "7.14.0"),
                                                             ("/opt/rocm/core-10.0", "10.0.0")]
    assert (info.active_path, info.version) == ("/opt/rocm/core-10.0", "10.0.0")


def test_distribution_packages_give_the_release_without_opt_rocm() -> None:
    """Debian 13's ROCm (control stanzas of the archive): every runtime library listed with its release, and the
    release read from HIP's package, named as the source."""
    info = RocmCollector().collect(make_fixture_host("debian13-rocm-cuda"))
    assert info.active_path is None and info.installs == []
    assert (info.version, info.version_source) == ("5.7.1", "package libamdhip64-5")
    by_name = {c.package: (c.version, c.release) for c in info.packaged}
    assert by_name["libhsa-runtime64-1"] == ("6.1.2-3", "6.1.2")
    assert by_name["librocblas0"] == ("5.5.1+dfsg-7", "5.5.1")
    assert set(by_name) == {"hipcc", "libamd-comgr2", "libamdhip64-5", "libhsa-runtime64-1", "libhsakmt1",
                            "librocblas0", "librocm-smi64-1"}  # -dev, -doc, rocminfo and rocm-smi are not libraries


@pytest.mark.parametrize(("names", "release", "source"), [
    ({"librocm-core1": "6.4.3-1", "libamdhip64-6": "6.4.3-5"}, "6.4.3", "package librocm-core1"),
    ({"libhsa-runtime64-1": "6.4.3+dfsg-5", "librocblas4": "6.4.4-4"}, "6.4.3", "package libhsa-runtime64-1"),
    ({"librocblas4": "6.4.4-4"}, None, None),
])
def test_packaged_release_order(names: dict, release: Optional[str], source: Optional[str]) -> None:
    """rocm-core's package first, then HIP's, then ROCr's; rocBLAS alone names no ROCm release."""
    status = "".join(f"Package: {n}\nStatus: install ok installed\nArchitecture: amd64\nVersion: {v}\n\n"
                     for n, v in names.items()).encode()
    assert packaged_release(packaged_components(status)) == (release, source)


def test_classic_tree_keeps_its_version_file_over_packages(tmp_path: Path) -> None:
    """A host with /opt/rocm-6.2.2 and a Debian library besides: the tree's version file wins, no source named."""
    _tree(tmp_path, "rocm-6.2.2", "6.2.2-116")
    (tmp_path / "opt/rocm").symlink_to("rocm-6.2.2")
    (tmp_path / "var/lib/dpkg").mkdir(parents=True)
    (tmp_path / "var/lib/dpkg/status").write_text(
        "Package: libamdhip64-5\nStatus: install ok installed\nArchitecture: amd64\nVersion: 5.7.1-6\n\n")
    info = RocmCollector().collect(Host(root=tmp_path, load_module=fake_module_loader({})))
    assert (info.version, info.version_source) == ("6.2.2-116", None)
    assert [c.package for c in info.packaged] == ["libamdhip64-5"]


@pytest.mark.parametrize(("names", "expected"), [
    (["libamdhip64.so.5", "libamdhip64.so.5.7.31921"], ("5.7", "libamdhip64.so.5.7.31921")),  # Debian 13's file
    (["libamdhip64.so.5.7.31921", "libamdhip64.so.6.4.43484"], ("6.4", "libamdhip64.so.6.4.43484")),
    (["libhsa-runtime64.so.1.13.0", "libamdhip64.so.6"], None),  # ROCr's own numbering says nothing of ROCm
])
def test_hip_library_release(names: List[str], expected: Optional[Tuple[str, str]]) -> None:
    """HIP's runtime file names its major.minor; the newest wins; other libraries and bare SONAME links do not."""
    assert hip_library_release(names) == expected


def test_hip_library_without_a_package_database_gives_the_release(tmp_path: Path) -> None:
    """No dpkg status and no /opt/rocm (a container image with Debian's libraries copied in): HIP's library file
    gives the release and is named as the source."""
    lib = tmp_path / "usr/lib/x86_64-linux-gnu"
    lib.mkdir(parents=True)
    (lib / "libamdhip64.so.5.7.31921").write_text("")
    (lib / "libamdhip64.so.5").symlink_to("libamdhip64.so.5.7.31921")
    info = RocmCollector().collect(Host(root=tmp_path, load_module=fake_module_loader({})))
    assert (info.version, info.version_source) == ("5.7", "library /usr/lib/x86_64-linux-gnu/libamdhip64.so.5.7.31921")
    assert info.packaged == [] and info.active_path is None
