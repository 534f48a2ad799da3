"""A pinned AMD host under real apt and dpkg: AMD's Ubuntu-style driver builds (the driver needs its firmware at
exactly its version), ROCm 6.2 with its ``rocm`` meta and the versioned side-by-side ``rocm6.2.2`` install, under
a policy that allows two pairings (6.2 and 6.3); the repository offers ROCm 6.3, newer driver builds of both
pairings and an update of an unrelated package. After `gpuguard pin apply` a routine upgrade exits 0 through the
hook, moves nothing guarded and still upgrades the unrelated package."""

from __future__ import annotations

from pathlib import Path
from typing import Dict, Iterator, List

import pytest

from tests.guard.apt.chroot.conftest import gpuguard
from tests.guard.apt.chroot.harness import (
    AMDGPU_62_U,
    AMDGPU_63_U,
    FIRMWARE,
    ROCM_62,
    ROCM_63,
    Chroot,
    FakePackage,
)

pytestmark = pytest.mark.timeout(900)

D62 = "1:6.8.5.60202-2041575.22.04"  # driver 6.2.2, the host's build
D624 = "1:6.8.5.60204-2055000.22.04"  # driver 6.2.4: same pairing, a newer build
D63 = "1:6.10.5.60300-2084815.22.04"  # driver 6.3.0: the other allowed pairing
HELLO_NEW = "1.1-1"


def _amd_packages(arch: str) -> List[FakePackage]:
    out: List[FakePackage] = []
    for build in (D62, D624, D63):
        out += [FakePackage(FIRMWARE, build), FakePackage("amdgpu-dkms", build, depends=f"{FIRMWARE} (= {build})")]
    for rocm, series in ((ROCM_62, "6.2.2"), (ROCM_63, "6.3.0")):
        out += [
            FakePackage("rocm", rocm, arch, f"rocm-core (= {rocm}), rocm-hip-runtime (= {rocm})"),
            FakePackage(f"rocm-core{series}", rocm, arch),
            FakePackage(f"rocm{series}", rocm, arch, f"rocm-core{series} (= {rocm})"),
        ]
    return [*out, FakePackage("hello-fake", HELLO_NEW)]


HOST = {"amdgpu-dkms": D62, FIRMWARE: D62, "rocm-core": ROCM_62, "rocm-hip-runtime": ROCM_62, "rocm": ROCM_62,
        "rocm-core6.2.2": ROCM_62, "rocm6.2.2": ROCM_62, "linux-image-6.1.0-26-amd64": "6.1.112-1"}
ON_63 = {"amdgpu-dkms": D63, FIRMWARE: D63, "rocm-core": ROCM_63, "rocm-hip-runtime": ROCM_63, "rocm": ROCM_63,
         "rocm-core6.3.0": ROCM_63, "rocm6.3.0": ROCM_63, "linux-image-6.1.0-26-amd64": "6.1.112-1"}
EXTRA = ("rocm", "rocm-core6.2.2", "rocm6.2.2", "rocm-core6.3.0", "rocm6.3.0")
HOOK_LOG = "var/tmp/gpuguard-hook-calls"


@pytest.fixture(scope="module")
def amd_repo(chroot_session: Chroot, tmp_path_factory: pytest.TempPathFactory) -> Iterator[List[Path]]:
    """The packages above added to the session repository for this module, and taken out again after it."""
    packages = _amd_packages(chroot_session.native_arch)
    with chroot_session.packages_in_repo(packages, tmp_path_factory.mktemp("amd-debs")) as debs:
        yield debs


def _versions(chroot: Chroot) -> Dict[str, str]:
    """Every AMD, kernel and ROCm package dpkg has in any present state (a half-installed one counts)."""
    out = chroot.run("dpkg-query", "-W", "-f", "${Package} ${Version} ${db:Status-Abbrev}\n", check=True).stdout
    rows = [line.split() for line in out.splitlines()]
    return {r[0]: r[1] for r in rows if len(r) >= 3 and r[2][1] not in "nc"
            and r[0].startswith(("amdgpu", "rocm", "linux-image"))}


def _hook_calls(chroot: Chroot) -> List[str]:
    path = chroot.root / HOOK_LOG
    return path.read_text().split() if path.exists() else []


def _log_hook_calls(chroot: Chroot) -> None:
    """Wrap the installed hook launcher so that each call leaves its exit code in HOOK_LOG (the fixture's
    install_gpuguard puts the plain launcher back for the next test)."""
    launcher = chroot.root / "usr/lib/gpuguard/gpuguard-apt-hook"
    launcher.rename(launcher.with_name("gpuguard-apt-hook.real"))
    launcher.write_text(f'#!/bin/sh\n/usr/lib/gpuguard/gpuguard-apt-hook.real "$@"\nrc=$?\n'
                        f'echo "rc=$rc" >> /{HOOK_LOG}\nexit $rc\n')
    launcher.chmod(0o755)
    (chroot.root / HOOK_LOG).unlink(missing_ok=True)


def _assert_clean(chroot: Chroot) -> None:
    audit = chroot.run("dpkg", "--audit")
    assert audit.returncode == 0 and not audit.stdout.strip(), audit.stdout
    check = chroot.run("apt-get", "-o", "Dir::Cache::pkgcache=", "-o", "Dir::Cache::srcpkgcache=", "check")
    assert check.returncode == 0, check.stdout + check.stderr


@pytest.fixture
def amd_host(chroot: Chroot, amd_repo: List[Path]) -> Iterator[Chroot]:
    """The host on the 6.2 pairing with AMD's packaging, installed through apt with the hook active."""
    installed = chroot.apt("install", *(f"{n}={v}" for n, v in HOST.items()), "hello-fake=1.0-1")
    assert installed.returncode == 0, installed.stdout + installed.stderr
    assert _versions(chroot) == HOST
    _log_hook_calls(chroot)
    yield chroot
    chroot.run("dpkg", "--purge", "--force-depends", *EXTRA, check=True)


def _pinned(chroot: Chroot) -> str:
    code, out = gpuguard(chroot, "pin", "apply")
    assert code == 0 and "note: the AMD pins keep this host on its installed pairing" in out, out
    return (chroot.root / "etc/apt/preferences.d/gpuguard-forbidden.pref").read_text()


def test_unpinned_upgrade_is_refused_by_the_hook(amd_host: Chroot) -> None:
    """Without pins apt picks ROCm 6.3 and the newest driver build, beside the versioned ROCm 6.2: refused."""
    result = amd_host.apt("upgrade")
    assert result.returncode != 0 and "REFUSED (amd.pairing)" in result.stdout + result.stderr, result.stdout
    assert _versions(amd_host) == HOST


def test_pins_forbid_what_the_hook_would_refuse_beside_the_installed_set(amd_host: Chroot) -> None:
    """ROCm 6.3 (plain and versioned) and every other driver or firmware build, of either pairing, are forbidden."""
    forbidden = _pinned(amd_host)
    for name, version in [("rocm-core", ROCM_63), ("rocm-core6.3.0", ROCM_63), ("amdgpu-dkms", D624),
                          ("amdgpu-dkms", D63), ("amdgpu-dkms", AMDGPU_62_U), ("amdgpu-dkms", AMDGPU_63_U),
                          (FIRMWARE, D624), (FIRMWARE, D63)]:
        assert f"Package: {name}\nPin: version {version}\nPin-Priority: -1" in forbidden, (name, version)
    assert "Package: rocm-core6.2.2\n" not in forbidden and f"Pin: version {D62}\n" not in forbidden
    assert "run gpuguard pin apply again" in forbidden
    assert "Candidate: " + ROCM_62 in amd_host.run("apt-cache", "policy", "rocm-core").stdout


@pytest.mark.parametrize("command", ["upgrade", "dist-upgrade"])
def test_pinned_routine_upgrade_exits_0_and_moves_nothing_guarded(amd_host: Chroot, command: str) -> None:
    """The hook runs and allows; every AMD, ROCm and kernel package keeps its exact version; hello-fake moves."""
    _pinned(amd_host)
    result = amd_host.apt(command)
    assert result.returncode == 0, result.stdout + result.stderr
    assert _hook_calls(amd_host) == ["rc=0"]
    assert _versions(amd_host) == HOST
    assert amd_host.installed()["hello-fake"] == HELLO_NEW
    _assert_clean(amd_host)


def test_a_deliberate_move_names_its_versions_and_pin_apply_runs_again(amd_host: Chroot) -> None:
    """Explicit versions override the pins (the hook judges the whole move and allows it); pin apply then keeps
    the host on the 6.3 pairing, and the next routine upgrade again moves nothing guarded."""
    _pinned(amd_host)
    moved = amd_host.apt("install", *(f"{n}={v}" for n, v in ON_63.items()), "rocm6.2.2-", "rocm-core6.2.2-")
    assert moved.returncode == 0, moved.stdout + moved.stderr
    assert _versions(amd_host) == ON_63
    forbidden = _pinned(amd_host)
    assert f"Package: rocm-core\nPin: version {ROCM_62}\nPin-Priority: -1" in forbidden
    assert f"Package: amdgpu-dkms\nPin: version {D62}\nPin-Priority: -1" in forbidden
    assert f"Pin: version {ROCM_63}\n" not in forbidden
    result = amd_host.apt("upgrade")
    assert result.returncode == 0, result.stdout + result.stderr
    assert _versions(amd_host) == ON_63 and amd_host.installed()["hello-fake"] == HELLO_NEW
    _assert_clean(amd_host)
