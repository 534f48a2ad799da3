"""[workloads] under real apt and dpkg in the Debian 12 chroot: a driver and ROCm upgrade that the AMD pairing
allows goes through onto a stack the hub's cached list verifies for the workload, and is refused, nothing changed,
naming the workload and the stack, onto one it does not."""

from __future__ import annotations

import json

import pytest

from tests.guard.apt.chroot.conftest import gpuguard
from tests.guard.apt.chroot.harness import AMDGPU_63, ROCM_63, TEST_POLICY, Chroot

pytestmark = pytest.mark.timeout(900)

UPGRADE = (f"amdgpu-dkms={AMDGPU_63}", f"rocm-core={ROCM_63}", f"rocm-hip-runtime={ROCM_63}")


def _with_list(chroot: Chroot, *stacks: dict) -> None:
    """The policy with [workloads] compiled in the chroot, and the hub's list as the daemon caches it."""
    (chroot.root / "etc/gpuguard/policy.d/10-test.toml").write_text(
        TEST_POLICY + '\n[workloads]\nverified = ["resnet-train"]\n')
    code, out = gpuguard(chroot, "policy", "compile")
    assert code == 0, out
    (chroot.state_dir / "workloads-verified.json").write_text(json.dumps(
        {"format": 1, "fetched_at": "2026-12-06T19:00:00.000000Z", "workloads": {"resnet-train": list(stacks)}}))


def test_an_upgrade_onto_a_verified_stack_goes_through(chroot: Chroot) -> None:
    """resnet-train passed on amdgpu 6.10.5 with ROCm 6.3.0 somewhere: apt installs the 6.3 pairing."""
    _with_list(chroot, {"driver": "amdgpu 6.10.5", "gpu_stack": "ROCm 6.3.0"})
    result = chroot.apt("install", *UPGRADE)
    assert result.returncode == 0, result.stdout + result.stderr
    assert chroot.installed()["rocm-core"] == ROCM_63


def test_an_upgrade_onto_an_unverified_stack_is_refused_and_nothing_changes(chroot: Chroot) -> None:
    """Only the 6.2 stack verified: apt exits 100 before dpkg runs, naming resnet-train and the new stack."""
    _with_list(chroot, {"driver": "amdgpu 6.8.5", "gpu_stack": "ROCm 6.2.2"})
    before = chroot.status_bytes()
    result = chroot.apt("install", *UPGRADE)
    assert result.returncode == 100, result.stdout + result.stderr
    assert "gpuguard: REFUSED (workloads.unverified)" in result.stderr
    assert "workload resnet-train never passed on amdgpu 6.10.5, ROCm 6.3.0 anywhere in the fleet" in result.stderr
    assert chroot.status_bytes() == before
