"""Rollback on an rpm host from .rpm files rebuilt out of the rpm database (no repository offers the installed
builds): ``rpm -U --force --nodeps`` of newer libnvidia-compute and cuda-cudart builds goes back to the exact
known-good ones, the rpm database clean, the same file lists, and an edited %config(noreplace) file kept."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, Iterator, List, Tuple

import pytest

from tests.guard.dnf.installroot.conftest import compile_policy
from tests.guard.dnf.installroot.harness import TEST_POLICY, Installroot, rpm_home, run, tool_env
from tests.guard.dnf.installroot.rollback_support import events
from tests.guard.dnf.installroot.test_rpm_rollback import _check, rpm_baseline  # noqa: F401 - the fixture

pytestmark = pytest.mark.timeout(300)

NV, NV_NEW = "3:580.95.05-1.el9", "3:580.105.08-1.el9"
CUDART, CUDART_NEW = "13.0.96-1", "13.0.97~rc1-1"
ICD = "/etc/OpenCL/vendors/nvidia.icd"
GOOD = {"libnvidia-compute": NV, "cuda-cudart-13-0": CUDART}
POLICY = TEST_POLICY + """
[[versions]]
name = "r580.95"
packages = ["libnvidia-compute"]
allow = "<< 3:580.100"
action = "rollback"

[[versions]]
name = "cudart-13.0.96"
packages = ["cuda-cudart-13-0"]
allow = "<< 13.0.97~"
action = "rollback"
"""
SPEC = """\
Name: %{pkgname}
%{?pkgepoch:Epoch: %{pkgepoch}}
Version: %{pkgver}
Release: %{pkgrel}
Summary: %{pkgname} as NVIDIA builds it, for gpuguard's installroot tests
License: NVIDIA
BuildArch: x86_64
AutoReqProv: no
%{?pkgrequires:Requires: %{pkgrequires}}
%description
A library package with a %%config(noreplace) file, a symlink and a scriptlet.
%post -p <lua>
-- ldconfig would run here
%install
mkdir -p %{buildroot}/usr/lib64 %{buildroot}/etc/OpenCL/vendors
echo "%{pkgname} %{pkgver}" > %{buildroot}/usr/lib64/lib%{pkgname}.so.%{pkgver}
ln -s lib%{pkgname}.so.%{pkgver} %{buildroot}/usr/lib64/lib%{pkgname}.so.1
%{?pkgconfig:echo libnvidia-opencl.so.1 > %{buildroot}/etc/OpenCL/vendors/nvidia.icd}
%files
%attr(0755,root,root) /usr/lib64/lib%{pkgname}.so.%{pkgver}
/usr/lib64/lib%{pkgname}.so.1
%{?pkgconfig:%config(noreplace) /etc/OpenCL/vendors/nvidia.icd}
"""


def _build(root: Installroot, name: str, evr: str, requires: str = "", config: bool = False) -> str:
    epoch, _, rest = evr.rpartition(":")
    version, release = rest.rsplit("-", 1)
    work = root.work / "nvidia-like"
    spec = work / "nv.spec"
    work.mkdir(parents=True, exist_ok=True)
    spec.write_text(SPEC)
    out = work / "rpms"
    defines = {"_topdir": str(work / "top"), "_rpmdir": str(out), "_build_name_fmt": f"{name}-{rest}.rpm",
               "pkgname": name, "pkgver": version, "pkgrel": release, "__os_install_post": "%{nil}",
               "_build_id_links": "none", "debug_package": "%{nil}"}
    if epoch:
        defines["pkgepoch"] = epoch
    if requires:
        defines["pkgrequires"] = requires
    if config:
        defines["pkgconfig"] = "1"
    argv = ["rpmbuild", "-bb", "--quiet", "--target", "x86_64"]
    for key, value in defines.items():
        argv += ["--define", f"{key} {value}"]
    run([*argv, str(spec)], tool_env(rpm_home(work)))
    return str(out / f"{name}-{rest}.rpm")


@pytest.fixture
def nvidia(installroot_session: Installroot, rpm_baseline: Path) -> Iterator[Tuple[Installroot, Dict[str, str]]]:  # noqa: F811
    """The known-good NVIDIA-like builds installed with rpm from files no repository offers; erased afterwards."""
    r = installroot_session
    r.restore(rpm_baseline)
    r.write_plugin_conf()
    r.install_gpuguard(POLICY)
    compile_policy(r)
    files = {"nv": _build(r, "libnvidia-compute", NV, config=True),
             "nv_new": _build(r, "libnvidia-compute", NV_NEW, config=True),
             "cudart": _build(r, "cuda-cudart-13-0", CUDART, requires=f"libnvidia-compute = {NV}"),
             "cudart_new": _build(r, "cuda-cudart-13-0", CUDART_NEW, requires=f"libnvidia-compute = {NV_NEW}")}
    installed = r.rpm("-i", files["nv"], files["cudart"])
    assert installed.returncode == 0, installed.stderr
    try:
        yield r, files
    finally:
        r.rpm("-e", "--nodeps", *GOOD)


def _lists(root: Installroot) -> Dict[str, List[str]]:
    return {n: sorted(root.rpm("-ql", n, check=True).stdout.split()) for n in GOOD}


def test_forced_newer_builds_roll_back_exactly_from_rebuilt_rpms(nvidia) -> None:
    """rpm -U --force --nodeps of a newer libnvidia-compute and cuda-cudart (exact Requires left unmet): the
    rebuilt known-good files restore the exact builds through dnf, rpm -Va --nofiles is clean, each package lists
    the same files, rpm -V finds nothing but the operator's edit, which is kept."""
    root, files = nvidia
    icd = root.root / ICD.lstrip("/")
    icd.write_text("/opt/site/libnvidia-opencl.so.1\n")  # the operator's edit, before the set is recorded
    before, lists = root.nevras(), _lists(root)
    recorded = _check(root)
    assert recorded.status == "recorded", recorded.summary()
    known_good = json.loads((root.state_dir / "known-good.json").read_text())["packages"]
    assert {n: known_good[n]["source"] for n in GOOD} == {n: "rebuilt" for n in GOOD}, known_good
    assert known_good["libnvidia-compute"]["conffiles_edited"] == [ICD]
    assert not any("inexact" in known_good[n] for n in GOOD)

    forced = root.rpm("-U", "--force", "--nodeps", files["nv_new"], files["cudart_new"])
    assert forced.returncode == 0, forced.stderr
    assert root.installed()["cuda-cudart-13-0"] == CUDART_NEW

    result = _check(root)
    assert result.status == "rolled_back", result.summary()
    assert root.nevras() == before and _lists(root) == lists
    verify = root.rpm("-Va", "--nofiles", "--nodigest", "--nosignature")
    assert verify.returncode == 0 and not verify.stdout.strip(), verify.stdout
    changed = root.rpm("-V", *GOOD).stdout.split("\n")
    assert [line for line in changed if line.strip()] == [line for line in changed if line.endswith(ICD)]
    assert icd.read_text() == "/opt/site/libnvidia-opencl.so.1\n"
    rollback = [e for e in events(root) if e["kind"] == "rollback"][-1]
    assert rollback["succeeded"] is True and rollback["to_versions"] == GOOD
    assert _check(root).status == "compliant"


def test_a_changed_library_makes_the_rebuilt_rpm_inexact(nvidia) -> None:
    """A library patched on disk after installation: rpm -V names it, the package is kept but marked inexact."""
    root, _ = nvidia
    (root.root / f"usr/lib64/libcuda-cudart-13-0.so.{CUDART.rsplit('-', 1)[0]}").write_text("patched\n")
    recorded = _check(root)
    assert recorded.status == "recorded" and "1 rebuilt inexactly (cuda-cudart-13-0)" in recorded.detail, \
        recorded.detail
    coverage = json.loads((root.state_dir / "rollback-coverage.json").read_text())["packages"]
    assert coverage["cuda-cudart-13-0"]["inexact"] == [
        "changed since installation: /usr/lib64/libcuda-cudart-13-0.so.13.0.96"]
    assert "inexact" not in coverage["libnvidia-compute"]
