"""Rollback from .deb files rebuilt out of dpkg's database, under real dpkg and apt, on a host where no repository
offers the installed versions (NVIDIA's local installer repository, gone): exact versions, a clean database, the
same file lists and checksums dpkg recorded for the originals, and an operator's conffile edit kept."""

from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path
from typing import Dict, Iterator, Tuple

import pytest

from agent.config import Settings
from agent.guard.rollback.core import GuardResult
from agent.host import Host
from tests.guard.apt.chroot.conftest import gpuguard
from tests.guard.apt.chroot.harness import TEST_POLICY, Chroot, run
from tests.guard.wiring import check

pytestmark = pytest.mark.timeout(900)

NV, NV_NEW = "1:580.95.05-0ubuntu0.24.04.2", "1:580.105.08-0ubuntu0.24.04.1"
CUDART, CUDART_NEW = "13.0.96-1", "13.0.97~rc1-1"
ICD = "/etc/OpenCL/vendors/nvidia.icd"
GOOD = {"libnvidia-compute-580": NV, "cuda-cudart-13-0": CUDART, "cuda-toolkit-13-0-config-common": CUDART}
POLICY = TEST_POLICY + """
[[versions]]
name = "r580.95"
packages = ["libnvidia-compute-580"]
allow = "<< 1:580.100"
action = "rollback"

[[versions]]
name = "cudart-13.0.96"
packages = ["cuda-cudart-13-0", "cuda-toolkit-13-0-config-common"]
allow = "<< 13.0.97~"
action = "rollback"
"""


def _build(work: Path, name: str, version: str, arch: str, depends: str, files: Dict[str, bytes],
           conffiles: Tuple[str, ...] = (), links: Tuple[Tuple[str, str], ...] = ()) -> Path:
    """A .deb as NVIDIA's are built: md5sums, an ldconfig trigger, a postinst, conffiles, a library symlink."""
    tree = work / f"{name}-{version.replace(':', '_')}"
    (tree / "DEBIAN").mkdir(parents=True)
    for path, content in files.items():
        target = tree / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(content)
    for link, to in links:
        (tree / link.lstrip("/")).symlink_to(to)
    control = [f"Package: {name}", f"Version: {version}", f"Architecture: {arch}",
               *(["Multi-Arch: same"] if arch != "all" else []),
               "Maintainer: gpuguard tests <tests@example.invalid>", "Section: libs", "Priority: optional"]
    if depends:
        control.append(f"Depends: {depends}")
    control.append(f"Description: {name} like NVIDIA's, for gpuguard's chroot tests\n second line")
    (tree / "DEBIAN/control").write_text("\n".join(control) + "\n")
    (tree / "DEBIAN/md5sums").write_text("".join(f"{hashlib.md5(c).hexdigest()}  {p.lstrip('/')}\n"
                                                 for p, c in sorted(files.items()) if p not in conffiles))
    if conffiles:
        (tree / "DEBIAN/conffiles").write_text("".join(f"{c}\n" for c in conffiles))
    (tree / "DEBIAN/triggers").write_text("activate-noawait ldconfig\n")
    (tree / "DEBIAN/postinst").write_text("#!/bin/sh\nset -e\necho configured > /dev/null\n")
    (tree / "DEBIAN/postinst").chmod(0o755)
    out = work / f"{name}_{version.replace(':', '%3a')}_{arch}.deb"
    run(["dpkg-deb", "--root-owner-group", "-Zxz", "-b", str(tree), str(out)])
    return out


def _packages(work: Path, arch: str) -> Dict[Tuple[str, str], Path]:
    lib = f"/usr/lib/{'x86_64' if arch == 'amd64' else arch}-linux-gnu"
    out = {}
    for nv in (NV, NV_NEW):
        upstream = nv.split(":", 1)[1].split("-", 1)[0]
        out[("libnvidia-compute-580", nv)] = _build(
            work, "libnvidia-compute-580", nv, arch, "",
            {f"{lib}/libcuda.so.{upstream}": f"libcuda {upstream}\n".encode() * 50,
             ICD: b"libnvidia-opencl.so.1\n",
             "/usr/share/doc/libnvidia-compute-580/changelog.Debian.gz": upstream.encode()},
            conffiles=(ICD,), links=((f"{lib}/libcuda.so.1", f"libcuda.so.{upstream}"),))
    for cudart in (CUDART, CUDART_NEW):
        out[("cuda-cudart-13-0", cudart)] = _build(
            work, "cuda-cudart-13-0", cudart, arch, f"cuda-toolkit-13-0-config-common (= {cudart})",
            {f"/usr/local/cuda-13.0/targets/x86_64-linux/lib/libcudart.so.{cudart}": cudart.encode() * 100})
    out[("cuda-toolkit-13-0-config-common", CUDART)] = _build(
        work, "cuda-toolkit-13-0-config-common", CUDART, "all", "",
        {"/etc/ld.so.conf.d/988_cuda-13.conf": b"/usr/local/cuda-13.0/targets/x86_64-linux/lib\n"})
    return out


def _versions(chroot: Chroot) -> Dict[str, str]:
    return {name: version for name, version in chroot.present().items() if name in GOOD}


def _info(chroot: Chroot, name: str, arch: str) -> Dict[str, object]:
    """What dpkg recorded of an installed package: its file list (as a set) and md5sums."""
    info = chroot.root / "var/lib/dpkg/info"
    prefix = info / (f"{name}:{arch}" if (info / f"{name}:{arch}.list").exists() else name)
    return {"list": sorted(Path(f"{prefix}.list").read_text().split("\n")),
            "md5sums": Path(f"{prefix}.md5sums").read_text()}


@pytest.fixture
def nvidia(chroot: Chroot, tmp_path: Path) -> Iterator[Tuple[Chroot, Dict[Tuple[str, str], Path]]]:
    """The known-good NVIDIA-like set installed with dpkg from files no repository offers; purged afterwards."""
    debs = _packages(tmp_path, chroot.native_arch)
    inside = chroot.root / "tmp/nvidia-debs"
    inside.mkdir(parents=True, exist_ok=True)
    for deb in debs.values():
        (inside / deb.name).write_bytes(deb.read_bytes())
    paths = {k: f"/tmp/nvidia-debs/{v.name}" for k, v in debs.items()}
    try:
        (chroot.root / "etc/gpuguard/policy.d/10-test.toml").write_text(POLICY)
        code, out = gpuguard(chroot, "policy", "compile")
        assert code == 0, out
        installed = chroot.run("dpkg", "-i", *(paths[(n, v)] for n, v in GOOD.items()))
        assert installed.returncode == 0, installed.stderr
        yield chroot, paths
    finally:
        chroot.run("dpkg", "--purge", "--force-depends", *GOOD)
        subprocess.run(["rm", "-rf", str(inside)], check=False, timeout=60)


def _rollback(chroot: Chroot) -> GuardResult:
    return check(Host.for_root(str(chroot.root)), Settings(), snapshot=lambda host: None)


def test_forced_newer_driver_and_cudart_roll_back_exactly_from_rebuilt_debs(nvidia) -> None:
    """dpkg -i --force-depends of a newer libnvidia-compute and cuda-cudart (exact `=` dependency left unmet), no
    repository offering the known-good builds: the rebuilt files restore the exact versions, dpkg --audit and
    apt-get check are clean, dpkg records the same file lists and md5sums as for the originals, and the operator's
    edit of the OpenCL ICD conffile survives."""
    chroot, debs = nvidia
    icd = chroot.root / ICD.lstrip("/")
    icd.write_text("/opt/site/libnvidia-opencl.so.1\n")  # the operator's edit, before the set is recorded
    arch = chroot.native_arch
    recorded_info = {n: _info(chroot, n, arch if n != "cuda-toolkit-13-0-config-common" else "all") for n in GOOD}
    recorded = _rollback(chroot)
    assert recorded.status == "recorded", recorded.summary()
    known_good = json.loads((chroot.state_dir / "known-good.json").read_text())["packages"]
    for name in GOOD:
        assert known_good[name]["source"] == "rebuilt" and known_good[name]["deb"], known_good[name]
        assert "inexact" not in known_good[name], known_good[name]
    assert known_good["libnvidia-compute-580"]["conffiles_edited"] == [ICD]
    coverage = json.loads((chroot.state_dir / "rollback-coverage.json").read_text())["packages"]
    assert {n: coverage[n]["source"] for n in GOOD} == {n: "rebuilt" for n in GOOD}

    forced = chroot.run("dpkg", "-i", "--force-depends", "--force-confold",
                        debs[("libnvidia-compute-580", NV_NEW)], debs[("cuda-cudart-13-0", CUDART_NEW)])
    assert forced.returncode == 0, forced.stderr
    assert _versions(chroot)["cuda-cudart-13-0"] == CUDART_NEW
    broken = chroot.run("apt-get", "-o", "Dir::Cache::pkgcache=", "check")
    assert broken.returncode != 0  # the bypass left cuda-cudart's exact dependency unmet

    result = _rollback(chroot)
    assert result.status == "rolled_back", result.summary()
    assert result.detail.startswith("via dpkg -i of the kept .deb files"), result.detail
    assert _versions(chroot) == GOOD
    audit = chroot.run("dpkg", "--audit")
    assert audit.returncode == 0 and not audit.stdout.strip(), audit.stdout
    clean = chroot.run("apt-get", "-o", "Dir::Cache::pkgcache=", "-o", "Dir::Cache::srcpkgcache=", "check")
    assert clean.returncode == 0, clean.stdout + clean.stderr
    for name in GOOD:
        assert _info(chroot, name, arch if name != "cuda-toolkit-13-0-config-common" else "all") \
            == recorded_info[name], name
    assert icd.read_text() == "/opt/site/libnvidia-opencl.so.1\n"
    verify = chroot.run("dpkg", "--verify", *GOOD)
    assert verify.returncode == 0 and not verify.stdout.strip(), verify.stdout
    assert _rollback(chroot).status == "compliant"


def test_a_changed_library_makes_the_rebuilt_package_inexact(nvidia) -> None:
    """A library file patched on disk after installation: the package is still kept, marked inexact with the path,
    and the recording says so."""
    chroot, _ = nvidia
    lib = next((chroot.root / "usr/lib").glob("*-linux-gnu/libcuda.so.580.95.05"))
    lib.write_bytes(b"hot-patched\n")
    recorded = _rollback(chroot)
    assert recorded.status == "recorded" and "1 rebuilt inexactly (libnvidia-compute-580)" in recorded.detail, \
        recorded.detail
    coverage = json.loads((chroot.state_dir / "rollback-coverage.json").read_text())["packages"]
    entry = coverage["libnvidia-compute-580"]
    assert entry["source"] == "rebuilt" and entry["path"]
    assert entry["inexact"] == [f"changed since installation: /{lib.relative_to(chroot.root)}"]
    assert "inexact" not in coverage["cuda-cudart-13-0"]


def test_a_revert_policy_rolls_a_compliant_change_back_with_real_dpkg(nvidia) -> None:
    """A newer driver taken as a compliant change under a rollout's target policy, then the revert policy (the one
    before) compiled with no package change: the guard puts the driver back from the kept .deb with real dpkg and
    records the restored set as known-good."""
    chroot, debs = nvidia
    target = POLICY.replace('allow = "<< 1:580.100"', 'allow = "<< 1:580.200"')
    (chroot.root / "etc/gpuguard/policy.d/10-test.toml").write_text(target)
    code, out = gpuguard(chroot, "policy", "compile")
    assert code == 0, out
    assert _rollback(chroot).status == "recorded"  # GOOD becomes known-good (and its .debs are rebuilt and kept)
    took = chroot.run("dpkg", "-i", debs[("libnvidia-compute-580", NV_NEW)])
    assert took.returncode == 0, took.stderr
    changed = _rollback(chroot)
    assert changed.status == "recorded" and "compliant change of 1 packages" in changed.detail, changed.summary()

    (chroot.root / "etc/gpuguard/policy.d/10-test.toml").write_text(POLICY)  # the revert: only << 1:580.100
    code, out = gpuguard(chroot, "policy", "compile")
    assert code == 0, out
    result = _rollback(chroot)
    assert result.status == "rolled_back", result.summary()
    assert result.to_versions == {"libnvidia-compute-580": NV} and _versions(chroot) == GOOD
    known_good = json.loads((chroot.state_dir / "known-good.json").read_text())["packages"]
    assert known_good["libnvidia-compute-580"]["version"] == NV
    audit = chroot.run("dpkg", "--audit")
    assert audit.returncode == 0 and not audit.stdout.strip(), audit.stdout
    events = [json.loads(line) for line in (chroot.state_dir / "guard-events.jsonl").read_text().splitlines()]
    assert events[-1]["kind"] == "rollback" and events[-1]["succeeded"] is True
    assert "the policy in force changed" in events[-1]["detail"], events[-1]
    assert _rollback(chroot).status == "compliant"
