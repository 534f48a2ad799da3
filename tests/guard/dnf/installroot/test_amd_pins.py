"""A pinned AMD host under real dnf4, rpm and versionlock: the driver with its firmware at exactly its build,
ROCm 6.2 with a package that requires rocm-core at exactly its build and the versioned side-by-side
``rocm-core6.2.2``, under a policy that allows two pairings (6.2 and 6.3); the repository offers ROCm 6.3 and newer
driver builds of both pairings. After `gpuguard pin apply` a routine `dnf upgrade` (best=True, as RHEL 9 sets it)
exits 0 with the gpuguard plugin loaded, moves nothing guarded and still upgrades the unrelated package."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Dict, Iterator, List

import pytest

from tests import needs
from tests.guard.dnf.installroot.conftest import compile_policy
from tests.guard.dnf.installroot.harness import (
    AMDGPU_62,
    AMDGPU_63,
    ROCM_62,
    ROCM_63,
    FakeRpm,
    Installroot,
    build_repo,
    install_specs,
    missing_tools,
    run,
)
from tests.guard.dnf.installroot.rollback_support import agent_config, cli, enable_versionlock

pytestmark = pytest.mark.timeout(600)

# A 6.2 driver build newer than the harness's AMDGPU_62, for the pin tests' upgrades inside the pairing.
AMDGPU_624 = "1:6.8.5.60204-2055000.el9"
POLICY = """\
[policy]
name = "amd-two-pairings"
action = "block"

[[amd.pairing]]
name = "rocm-6.2"
amdgpu = "6.2.*"
rocm = "6.2.*"

[[amd.pairing]]
name = "rocm-6.3"
amdgpu = "6.3.*"
rocm = "6.3.*"
"""
HOST = {"amdgpu-dkms": AMDGPU_62, "amdgpu-dkms-firmware": AMDGPU_62, "rocm-core": ROCM_62, "rocm-hip-runtime": ROCM_62,
        "rocm-core6.2.2": ROCM_62}


def _amd_rpms() -> List[FakeRpm]:
    out: List[FakeRpm] = []
    for build in (AMDGPU_62, AMDGPU_624, AMDGPU_63):
        out += [FakeRpm("amdgpu-dkms-firmware", build),
                FakeRpm("amdgpu-dkms", build, requires=f"amdgpu-dkms-firmware = {build}")]
    for rocm, series in ((ROCM_62, "6.2.2"), (ROCM_63, "6.3.0")):
        out += [FakeRpm("rocm-core", rocm, "x86_64"),
                FakeRpm("rocm-hip-runtime", rocm, "x86_64", requires=f"rocm-core = {rocm}"),
                FakeRpm(f"rocm-core{series}", rocm, "x86_64")]
    return [*out, FakeRpm("hello-fake", "1.0-1"), FakeRpm("hello-fake", "1.1-1")]


@pytest.fixture(scope="module")
def amd_root(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Installroot]:
    """Its own repository and installroot: the 6.2 host installed, saved, and restored before each test."""
    missing = missing_tools()
    if missing:
        needs.unavailable("installroot tests", f"missing: {', '.join(missing)}")
    base = tmp_path_factory.mktemp("amd-pins")
    repo = build_repo(base / "repo", base / "rpmbuild", _amd_rpms())
    root = Installroot(base / "root", repo, base / "work")
    root.install_gpuguard(POLICY)
    compile_policy(root)
    root.dnf("install", *install_specs(HOST), "hello-fake-1.0-1", plugin=False, check=True)
    root.save(base / "baseline")
    try:
        yield root
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def amd(amd_root: Installroot) -> Installroot:
    amd_root.restore(amd_root.root.parent / "baseline")
    amd_root.write_plugin_conf()
    return amd_root


def _upgrade(root: Installroot, conf: Path) -> subprocess.CompletedProcess:
    """`dnf upgrade` with both versionlock and the gpuguard plugin loaded, best=True as on RHEL 9."""
    return run(["/usr/bin/dnf", "-c", str(conf), f"--installroot={root.root}", "--releasever=9", "-y",
                "--setopt=best=True", "upgrade"], root.env, check=False)


def _guarded(root: Installroot) -> Dict[str, str]:
    return {k: v for k, v in root.installed().items() if k.startswith(("amdgpu", "rocm"))}


def test_unpinned_upgrade_is_refused_by_the_plugin(amd: Installroot) -> None:
    """Without pins dnf takes the whole stack to 6.3 beside the versioned ROCm 6.2: the plugin refuses it."""
    result = amd.dnf("upgrade")
    assert result.returncode != 0 and "REFUSED (amd.pairing)" in result.stdout + result.stderr, result.stdout
    assert _guarded(amd) == HOST


def test_pin_apply_then_dnf_upgrade_exits_0_and_moves_nothing_guarded(amd: Installroot) -> None:
    """Real dnf: after pin apply a plain dnf upgrade exits 0, moves nothing guarded and leaves a consistent database."""
    conf = enable_versionlock(amd)
    code, out = cli(amd, "pin", "apply", config=agent_config(amd))
    assert code == 0 and "run gpuguard pin apply again" in out, out
    locklist = (amd.root / "etc/dnf/plugins/versionlock.list").read_text()
    for name, evr in [("rocm-core", ROCM_63), ("rocm-core6.3.0", ROCM_63), ("amdgpu-dkms", AMDGPU_624),
                      ("amdgpu-dkms", AMDGPU_63), ("amdgpu-dkms-firmware", AMDGPU_624),
                      ("amdgpu-dkms-firmware", AMDGPU_63), ("rocm-hip-runtime", ROCM_63)]:
        assert f"!{name}-{evr if ':' in evr else '0:' + evr}.*" in locklist, (name, evr, locklist)
    upgraded = _upgrade(amd, conf)
    assert upgraded.returncode == 0, upgraded.stdout + upgraded.stderr
    assert _guarded(amd) == HOST
    assert amd.installed()["hello-fake"] == "1.1-1"  # the routine upgrade did its work
    check = run(["/usr/bin/dnf", "-c", str(conf), f"--installroot={amd.root}", "--releasever=9", "-q", "check"],
                amd.env, check=False)
    assert check.returncode == 0 and not check.stdout.strip(), check.stdout + check.stderr
