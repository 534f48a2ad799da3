"""``gpuguard policy freeze`` under real apt and dpkg: the baseline host (driver 6.2, ROCm 6.2, kernel
6.1.0-26) frozen into the only policy file, checked and compiled; then every driver move (another release, and
another build of the same release), every ROCm move and a new kernel are refused by the hook with nothing changed,
and an unrelated install passes."""

from __future__ import annotations

from pathlib import Path
from typing import Dict, Iterator, List

import pytest

from tests.guard.apt.chroot.conftest import gpuguard
from tests.guard.apt.chroot.harness import (
    AMDGPU_62_U,
    AMDGPU_63,
    BASELINE,
    FIRMWARE,
    KERNEL_27,
    KERNEL_28,
    ROCM_63,
    Chroot,
)

pytestmark = pytest.mark.timeout(900)


def _guarded(chroot: Chroot) -> Dict[str, str]:
    return {n: v for n, v in chroot.installed().items() if n.startswith(("amdgpu", "rocm", "linux-image"))}


@pytest.fixture
def frozen(chroot: Chroot) -> Iterator[Chroot]:
    """The baseline frozen with `policy freeze --output` into policy.d as its only file, checked and compiled (the
    chroot fixture puts the test policy and the compiled baseline back for the next test)."""
    policy_dir = chroot.root / "etc/gpuguard/policy.d"
    (policy_dir / "10-test.toml").unlink()  # its two pairings would be alternatives to the frozen one
    target = policy_dir / "50-freeze.toml"
    target.unlink(missing_ok=True)
    code, out = gpuguard(chroot, "policy", "freeze", "--output", str(target))
    assert code == 0 and out.startswith(f"wrote {target}"), out
    text = target.read_text()
    assert 'amdgpu_package = "1:6.8.5.60202-2041575"  # this exact build' in text
    assert 'rocm_package = "6.2.2.60202-116~12"  # this exact build of rocm-core' in text
    assert '  "6.1.0-26-amd64",  # ' in text and '  "rocm-hip-runtime",  # installed 6.2.2.60202-116~12' in text
    from agent.cli import main

    assert main(["policy", "check", str(target)]) == 0
    code, out = gpuguard(chroot, "policy", "compile")
    assert code == 0, out
    code, out = gpuguard(chroot, "policy", "explain")
    assert code == 0 and out.splitlines()[-1] == "current state: compliant", out
    yield chroot
    target.unlink()


@pytest.mark.parametrize(("what", "args", "rule"), [
    ("driver release", ["install", f"amdgpu-dkms={AMDGPU_63}"], "amd.pairing"),
    ("driver build", ["install", f"amdgpu-dkms={AMDGPU_62_U}", f"{FIRMWARE}={AMDGPU_62_U}"], "amd.pairing"),
    ("ROCm", ["install", f"rocm-core={ROCM_63}", f"rocm-hip-runtime={ROCM_63}"], "amd.pairing"),
    ("ROCm with its driver", ["install", f"amdgpu-dkms={AMDGPU_63}", f"rocm-core={ROCM_63}",
                              f"rocm-hip-runtime={ROCM_63}"], "amd.pairing"),
    ("a frozen stack package removed", ["remove", "rocm-hip-runtime"], "frozen"),
])
def test_every_driver_and_rocm_move_is_refused(frozen: Chroot, what: str, args: List[str], rule: str) -> None:
    """apt exits 100 before dpkg runs; the hook names the rule; the status file is byte-identical."""
    before = frozen.status_bytes()
    result = frozen.apt(*args)
    assert result.returncode == 100, (what, result.stdout + result.stderr)
    assert f"gpuguard: REFUSED ({rule})" in result.stderr, (what, result.stderr)
    assert frozen.status_bytes() == before
    assert _guarded(frozen) == BASELINE


def test_a_new_kernel_is_refused(frozen: Chroot) -> None:
    """A kernel that is neither installed nor running is refused (this machine's running kernel is allowed)."""
    running = Path("/proc/sys/kernel/osrelease").read_text().strip()
    kernel = next(k for k in (KERNEL_27, KERNEL_28) if not k.endswith(running))
    before = frozen.status_bytes()
    result = frozen.apt("install", kernel)
    assert result.returncode == 100, result.stdout + result.stderr
    assert "gpuguard: REFUSED (kernel.allow)" in result.stderr and "gpuguard: REFUSED (amd.pairing.kernels)" in \
        result.stderr, result.stderr
    assert frozen.status_bytes() == before


def test_an_unrelated_install_passes(frozen: Chroot) -> None:
    """hello-fake is guarded by nothing: the hook allows it and the GPU stack stays as frozen."""
    result = frozen.apt("install", "hello-fake")
    assert result.returncode == 0, result.stdout + result.stderr
    assert frozen.installed()["hello-fake"] == "1.0-1"
    assert _guarded(frozen) == BASELINE
