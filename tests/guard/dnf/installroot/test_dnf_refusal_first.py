"""dnf prints a plugin's error as "Error: <message>": gpuguard's REFUSED line comes first, before its warnings."""

from __future__ import annotations

import os

import pytest

from tests.guard.dnf.installroot.harness import ROCM_62, ROCM_63, Installroot

pytestmark = pytest.mark.timeout(120)


def test_the_error_prefix_lands_on_the_refusal_not_on_a_warning(installroot: Installroot) -> None:
    """A policy file newer than the compiled policy makes the checker warn before it refuses: dnf's first line is
    still the refusal, and the warning follows."""
    policy = installroot.root / "etc/gpuguard/policy.d/10-test.toml"
    compiled = installroot.state_dir / "policy.compiled.json"
    later = compiled.stat().st_mtime + 60
    os.utime(policy, (later, later))
    result = installroot.dnf("upgrade", "rocm-core")
    assert result.returncode == 1
    lines = result.stderr.splitlines()
    assert lines[0].startswith("Error: gpuguard: REFUSED (amd.pairing): amdgpu-dkms "), lines
    assert f"rocm-core {ROCM_62} -> {ROCM_63}" in lines[0]
    assert any(line.startswith("gpuguard: warning: 10-test.toml in ") for line in lines[1:]), lines
    assert installroot.installed()["rocm-core"] == ROCM_62
