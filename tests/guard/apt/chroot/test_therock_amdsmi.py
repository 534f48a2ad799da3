"""amdsmi by its real versions under real apt and dpkg, on a TheRock 7.14 host: the binding that matches the
library (``python3-amdsmi 27.0.0.71400-1``: amdsmi 27.0.0 for ROCm 7.14) is allowed and a 7.1 one
(``26.1.0.70100-1``) refused naming both releases; the snapshot reads the release from ``amdrocm-base7.14`` where
the tree has no ``.info/version``, and reports a pip binding of another release as the hook would judge it."""

from __future__ import annotations

import json
import re
from typing import Dict, Iterator, List

import pytest

from tests.guard.apt.chroot.conftest import gpuguard
from tests.guard.apt.chroot.harness import Chroot, FakePackage

pytestmark = pytest.mark.timeout(900)

V714 = "7.14.0-1"
TREE = "/opt/rocm/core-7.14"
BINDING_714, BINDING_71 = "27.0.0.71400-1", "26.1.0.70100-1"
POLICY = '[policy]\nname = "amdsmi"\n[companions]\namdsmi = true\nfabricmanager = false\ndcgm = false\n' \
         'dcgm_exporter = false\n'


def _debs() -> List[FakePackage]:
    """TheRock 7.14 as its base, amdsmi and core packages (exact = dependencies; the tree carries no version file,
    as a TheRock image need not), and two builds of the packaged amdsmi binding."""
    dep = f"amdrocm-base7.14 (= {V714})"
    return [
        FakePackage("amdrocm-base7.14", V714, files=((f"{TREE}/bin/rocminfo", "fake rocminfo\n"),)),
        FakePackage("amdrocm-amdsmi7.14", V714, depends=dep,
                    files=((f"{TREE}/lib/libamd_smi.so.27", "fake libamd_smi, SONAME libamd_smi.so.27\n"),)),
        FakePackage("amdrocm-core7.14", V714, depends=f"{dep}, amdrocm-amdsmi7.14 (= {V714})"),
        FakePackage("python3-amdsmi", BINDING_71),
        FakePackage("python3-amdsmi", BINDING_714),
    ]


def _amd(chroot: Chroot) -> Dict[str, str]:
    return {n: v for n, v in chroot.present().items() if n.startswith(("rocm", "amdrocm", "python3-amdsmi"))}


@pytest.fixture
def rock714(chroot: Chroot, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Chroot]:
    """The chroot as a TheRock 7.14 host (classic ROCm removed) with only the amdsmi rule in its policy; its
    packages, the pip binding and the policy taken out after the test."""
    policy_dir = chroot.root / "etc/gpuguard/policy.d"
    pip_dir = chroot.root / "usr/local/lib/python3.11/dist-packages/amdsmi-7.0.2.dist-info"
    with chroot.packages_in_repo(_debs(), tmp_path_factory.mktemp("rock714-debs")):
        try:
            gone = chroot.apt("remove", "rocm-hip-runtime", "rocm-core", hook=False)
            assert gone.returncode == 0, gone.stdout + gone.stderr
            got = chroot.apt("install", f"amdrocm-core7.14={V714}", hook=False)
            assert got.returncode == 0, got.stdout + got.stderr
            for old in policy_dir.glob("*.toml"):
                old.unlink()
            (policy_dir / "10-amdsmi.toml").write_text(POLICY)
            code, out = gpuguard(chroot, "policy", "compile")
            assert code == 0, out
            yield chroot
        finally:
            names = [n for n in _amd(chroot) if n.startswith(("amdrocm", "python3-amdsmi"))]
            if names:
                chroot.run("dpkg", "--purge", "--force-depends", *names, check=True)
            for extra in policy_dir.glob("*.toml"):
                extra.unlink()
            if pip_dir.exists():
                (pip_dir / "METADATA").unlink()
                pip_dir.rmdir()


def test_the_7_14_binding_is_allowed_and_a_7_1_binding_refused_naming_both_releases(rock714: Chroot) -> None:
    """apt-get install python3-amdsmi=26.1.0.70100-1 on TheRock 7.14 is refused as ROCm 7.1 against 7.14.0 with
    nothing changed; python3-amdsmi=27.0.0.71400-1 installs (today it reads as "ROCm 27.0" and is refused)."""
    before, packages = rock714.status_bytes(), _amd(rock714)
    refused = rock714.apt("install", f"python3-amdsmi={BINDING_71}")
    assert refused.returncode == 100, refused.stdout + refused.stderr
    assert "gpuguard: REFUSED (companion.amdsmi)" in refused.stderr, refused.stderr
    assert (f"python3-amdsmi {BINDING_71} (amdsmi 26.1.0 for ROCm 7.1.0) needs libamd_smi of ROCm 7.1; the "
            f"transaction leaves libamd_smi of ROCm 7.14.0 (amdrocm-amdsmi7.14)") in refused.stderr, refused.stderr
    assert rock714.status_bytes() == before and _amd(rock714) == packages

    allowed = rock714.apt("install", f"python3-amdsmi={BINDING_714}")
    assert allowed.returncode == 0, allowed.stdout + allowed.stderr
    assert _amd(rock714)["python3-amdsmi"] == BINDING_714
    code, out = gpuguard(rock714, "policy", "explain")
    assert code == 0 and out.splitlines()[-1] == "current state: compliant", out


def test_the_snapshot_reads_the_release_package_and_reports_the_pip_binding(rock714: Chroot) -> None:
    """With no .info/version in /opt/rocm/core-7.14 the snapshot says ROCm 7.14.0 from amdrocm-base7.14; PyPI's
    amdsmi 7.0.2 pip installed is reported with the companion finding ``policy explain`` gives."""
    assert not (rock714.root / TREE.lstrip("/") / ".info/version").exists()
    pip_dir = rock714.root / "usr/local/lib/python3.11/dist-packages/amdsmi-7.0.2.dist-info"
    pip_dir.mkdir(parents=True)
    (pip_dir / "METADATA").write_text("Metadata-Version: 2.1\nName: amdsmi\nVersion: 7.0.2\n")
    code, out = gpuguard(rock714, "snapshot", "--json")
    assert code == 0, out
    rocm = json.loads(out)["rocm"]["data"]
    assert (rocm["version"], rocm["version_source"]) == ("7.14.0", "amdrocm-base7.14")
    assert rocm["installs"] == [{"amd_smi_soname": "libamd_smi.so.27", "path": TREE, "version": "7.14.0",
                                 "version_source": "amdrocm-base7.14"}]
    assert rocm["amdsmi_binding"] == {"site_directory": "/usr/local/lib/python3.11/dist-packages",
                                      "version": "7.0.2"}
    findings = [f for f in json.loads(out)["findings"] if f["kind"] == "companion_mismatch"]
    code, explained = gpuguard(rock714, "policy", "explain", "--json")
    violations = {v["rule"]: v["message"] for v in json.loads(explained)["violations"]}
    assert [f["message"] for f in findings] == [violations["companion.amdsmi"]]
    assert findings[0]["message"].startswith("the pip amdsmi binding 7.0.2 (/usr/local/lib/python3.11/dist-packages) "
                                             "needs libamd_smi of ROCm 7.0; the host has libamd_smi of ROCm 7.14.0")


def test_a_refusal_on_the_therock_only_host_names_its_release_package(rock714: Chroot) -> None:
    """Frozen, the TheRock-only host refuses ``apt-get remove amdrocm-base7.14`` naming amdrocm-base7.14 as what the
    set is left without and TheRock's package in the hint, never rocm-core."""
    target = rock714.root / "etc/gpuguard/policy.d/50-freeze.toml"
    code, out = gpuguard(rock714, "policy", "freeze", "--output", str(target))
    assert code == 0, out
    code, out = gpuguard(rock714, "policy", "compile")
    assert code == 0, out
    before = rock714.status_bytes()
    refused = rock714.apt("remove", "amdrocm-base7.14")
    assert refused.returncode == 100, refused.stdout + refused.stderr
    assert "gpuguard: REFUSED (amd.pairing)" in refused.stderr, refused.stderr
    assert "with no amdrocm-base7.14 matches no allowed pairing" in refused.stderr, refused.stderr
    assert re.search(r"(?<![\w-])rocm-core", refused.stderr) is None, refused.stderr  # amdrocm-core7.14 is fine
    assert "move amdgpu-dkms and TheRock's amdrocm-base<release> together" in refused.stderr, refused.stderr
    assert rock714.status_bytes() == before
