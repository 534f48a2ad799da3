"""The dnf4 plugin end to end: real /usr/bin/dnf --installroot, fake rpms, the checker on /usr/bin/python3 -IS."""

from __future__ import annotations

import json

import pytest

from agent.guard.hotpath.overrides import start_window
from tests.guard.dnf.installroot.harness import (
    AMDGPU_62,
    AMDGPU_63,
    KERNEL_503,
    KERNEL_570,
    ROCM_62,
    ROCM_63,
    Installroot,
)

pytestmark = pytest.mark.timeout(120)


def events(root: Installroot) -> list:
    path = root.state_dir / "guard-events.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def assert_unchanged(root: Installroot, before: tuple) -> None:
    """The installed set, the rpm database bytes and the packages' files are exactly as before."""
    installed, rpmdb, payload = before
    assert root.installed() == installed
    assert root.rpmdb_bytes() == rpmdb
    assert root.payload_bytes() == payload


def snapshot(root: Installroot) -> tuple:
    return root.installed(), root.rpmdb_bytes(), root.payload_bytes()


def test_allowed_pair_upgrade_passes(installroot: Installroot) -> None:
    """Driver and ROCm moving together to the other allowed pairing: dnf exits 0 and both are upgraded."""
    result = installroot.dnf("upgrade", "amdgpu-dkms", "rocm-core")
    assert result.returncode == 0, result.stderr
    installed = installroot.installed()
    assert (installed["amdgpu-dkms"], installed["rocm-core"]) == (AMDGPU_63, ROCM_63)
    assert "REFUSED" not in result.stderr and events(installroot) == []


def test_violating_single_upgrade_is_refused_with_nothing_changed(installroot: Installroot) -> None:
    """rocm-core alone breaks the pinned pairing: dnf exits 1 with the REFUSED line, rpmdb and files untouched."""
    before = snapshot(installroot)
    result = installroot.dnf("upgrade", "rocm-core")
    assert result.returncode == 1
    lines = result.stderr.splitlines()
    assert lines[0] == (
        f"Error: gpuguard: REFUSED (amd.pairing): amdgpu-dkms {AMDGPU_62}, rocm-core {ROCM_62} -> {ROCM_63}: breaks "
        f"the pinned AMD pairing 'rocm-6.2' (amdgpu 6.2.* + ROCm 6.2.*): amdgpu-dkms {AMDGPU_62} (driver 6.2.2) with "
        f"rocm-core {ROCM_63} (ROCm 6.3.0) matches no allowed pairing (allowed: 'rocm-6.2' (amdgpu 6.2.* + ROCm "
        f"6.2.*); 'rocm-6.3' (amdgpu 6.3.* + ROCm 6.3.*))")
    assert any(line.startswith("gpuguard: to proceed: ") for line in lines)
    assert "Traceback" not in result.stderr
    assert_unchanged(installroot, before)
    (event,) = events(installroot)
    assert (event["kind"], event["tool"], event["rule"]) == ("transaction_blocked", "dnf", "amd.pairing")
    assert "upgrade rocm-core" in event["command_line"]


def test_driver_downgrade_alone_is_refused(installroot: Installroot) -> None:
    """After an allowed move to 6.3, taking only the driver back breaks the 6.3 pairing."""
    assert installroot.dnf("upgrade", "amdgpu-dkms", "rocm-core").returncode == 0
    before = snapshot(installroot)
    result = installroot.dnf("downgrade", "amdgpu-dkms")
    assert result.returncode == 1 and "REFUSED (amd.pairing)" in result.stderr
    assert_unchanged(installroot, before)


def test_new_unsupported_kernel_is_refused(installroot: Installroot) -> None:
    """kernel 570 is not in the pairing's kernels: refused as a new install, old kernel untouched."""
    before = snapshot(installroot)
    result = installroot.dnf("install", f"kernel-{KERNEL_570}")
    assert result.returncode == 1
    assert f"REFUSED (amd.pairing.kernels): kernel@{KERNEL_570} (not installed) -> {KERNEL_570}" in result.stderr
    assert_unchanged(installroot, before)


def test_allowed_kernel_installs_side_by_side(installroot: Installroot) -> None:
    """kernel 503 is supported: installed beside 427 (install-only), not as an upgrade of it."""
    result = installroot.dnf("install", f"kernel-{KERNEL_503}")
    assert result.returncode == 0, result.stderr
    kernels = sorted(k for k in installroot.installed() if k.startswith("kernel-core@"))
    assert kernels == ["kernel-core@5.14.0-427.el9", f"kernel-core@{KERNEL_503}"]


def test_override_window_lets_the_violation_through_and_is_audited(installroot: Installroot) -> None:
    """Real dnf4: an open override window lets a breaking upgrade through, says so, and records override_used."""
    state = installroot.state_dir
    start_window(str(state / "overrides.json"), str(state / "audit.log"), minutes=30, reason="swap driver",
                 max_minutes=60, opened_by="ops")
    result = installroot.dnf("upgrade", "rocm-core")
    assert result.returncode == 0, result.stderr
    assert "override window" in result.stderr and "swap driver" in result.stderr
    assert installroot.installed()["rocm-core"] == ROCM_63
    assert [e["kind"] for e in events(installroot)] == ["override_used"]


@pytest.mark.parametrize("compiled_text,fragment", [(None, "no compiled policy"), ("{not json", "not valid JSON")])
def test_missing_or_malformed_compiled_policy_fails_safe(installroot: Installroot, compiled_text, fragment) -> None:
    """Fail-safe block-guarded: a guarded package is refused (nothing changed), an unguarded one passes."""
    compiled = installroot.state_dir / "policy.compiled.json"
    if compiled_text is None:
        compiled.unlink()
    else:
        compiled.write_text(compiled_text)
    before = snapshot(installroot)
    result = installroot.dnf("upgrade", "amdgpu-dkms", "rocm-core")
    assert result.returncode == 1
    assert "REFUSED by fail-safe 'block-guarded'" in result.stderr and fragment in result.stderr
    assert "--disableplugin=gpuguard" in result.stderr
    assert_unchanged(installroot, before)
    result = installroot.dnf("upgrade", "hello-fake")
    assert result.returncode == 0 and "lets this transaction through" in result.stderr
    assert installroot.installed()["hello-fake"] == "1.1-1"


def test_broken_checker_fails_closed_with_a_bypass_hint(installroot: Installroot) -> None:
    """A checker that crashes without a decision refuses (dnf only honours dnf.exceptions.Error)."""
    broken = installroot.work / "broken-checker"
    broken.write_text("#!/bin/sh\nexit 139\n")
    broken.chmod(0o755)
    installroot.write_plugin_conf(checker=str(broken))
    before = snapshot(installroot)
    result = installroot.dnf("upgrade", "hello-fake")
    assert result.returncode == 1 and "exited 139 without a decision" in result.stderr
    assert "--disableplugin=gpuguard" in result.stderr and "Traceback" not in result.stderr
    assert_unchanged(installroot, before)


def test_missing_checker_warns_and_lets_through(installroot: Installroot) -> None:
    """A half-removed gpuguard must not block dnf, including the repair (the apt launcher's choice)."""
    installroot.write_plugin_conf(checker=str(installroot.work / "not-installed"))
    result = installroot.dnf("upgrade", "rocm-core")
    assert result.returncode == 0 and "is NOT checked" in result.stderr


def test_disableplugin_bypasses_the_guard(installroot: Installroot) -> None:
    """--disableplugin=gpuguard (like --noplugins, rpm -U, PackageKit) is not checked: rollback covers those."""
    result = installroot.dnf("upgrade", "rocm-core", plugin=False)
    assert result.returncode == 0 and "gpuguard" not in result.stderr
    assert installroot.installed()["rocm-core"] == ROCM_63 and events(installroot) == []
