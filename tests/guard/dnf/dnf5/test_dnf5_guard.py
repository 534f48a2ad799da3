"""gpuguard's packaged dnf5 action in real dnf5 transactions (Debian sid's dnf5 5.4, its actions plugin, rpm 6):
the dnf4 installroot tests' table of cases, with the rpm database unchanged whenever a transaction is refused."""

from __future__ import annotations

import json

import pytest

from agent.guard.hotpath.overrides import start_window
from tests.guard.dnf.dnf5.conftest import compile_policy
from tests.guard.dnf.dnf5.harness import FIRMWARE, LIB, Dnf5Root
from tests.guard.dnf.installroot.harness import (
    AMDGPU_62,
    AMDGPU_63,
    KERNEL_427,
    KERNEL_503,
    KERNEL_570,
    ROCM_62,
    ROCM_63,
    TEST_POLICY,
    FakeRpm,
)

pytestmark = pytest.mark.timeout(180)


def events(root: Dnf5Root) -> list:
    path = root.state_dir / "guard-events.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def snapshot(root: Dnf5Root) -> tuple:
    return root.nevras(), root.rpmdb_bytes()


def assert_refused_unchanged(root: Dnf5Root, result, before: tuple, fragment: str) -> None:
    """dnf5 exits 1, gpuguard's line says why, and the installed set and rpm database are exactly as before."""
    output = result.stdout + result.stderr
    assert result.returncode == 1, output
    assert fragment in output, output
    assert "Traceback" not in output
    assert "Exit code: 1" in output  # the actions plugin's own line for the refusing action (raise_error=1)
    assert snapshot(root) == before


def test_allowed_pair_upgrade_passes(dnf5_root: Dnf5Root) -> None:
    """Driver (with its exact-EVR firmware) and ROCm moving together to the other allowed pairing: all upgraded."""
    result = dnf5_root.dnf5("upgrade", "amdgpu-dkms", "rocm-core")
    assert result.returncode == 0, result.stdout + result.stderr
    installed = dnf5_root.installed()
    assert (installed["amdgpu-dkms"], installed[FIRMWARE], installed["rocm-core"]) == (AMDGPU_63, AMDGPU_63, ROCM_63)
    assert "REFUSED" not in result.stderr and events(dnf5_root) == []
    assert dnf5_root.verify().returncode == 0


def test_rocm_upgrade_alone_breaks_the_pairing_and_is_refused(dnf5_root: Dnf5Root) -> None:
    """rocm-core alone breaks the pinned pairing: refused with the pairing line, recorded as a dnf5 event."""
    before = snapshot(dnf5_root)
    result = dnf5_root.dnf5("upgrade", "rocm-core")
    assert_refused_unchanged(dnf5_root, result, before, (
        f"gpuguard: REFUSED (amd.pairing): amdgpu-dkms {AMDGPU_62}, rocm-core {ROCM_62} -> {ROCM_63}: breaks the "
        f"pinned AMD pairing 'rocm-6.2'"))
    assert "gpuguard: to proceed: " in result.stderr
    (event,) = events(dnf5_root)
    assert (event["kind"], event["tool"], event["rule"]) == ("transaction_blocked", "dnf5", "amd.pairing")


def test_driver_downgrade_alone_is_refused(dnf5_root: Dnf5Root) -> None:
    """After an allowed move to 6.3, taking only the driver (and its firmware) back breaks the 6.3 pairing."""
    assert dnf5_root.dnf5("upgrade", "amdgpu-dkms", "rocm-core").returncode == 0
    before = snapshot(dnf5_root)
    result = dnf5_root.dnf5("downgrade", "amdgpu-dkms", FIRMWARE)
    assert_refused_unchanged(dnf5_root, result, before, "REFUSED (amd.pairing)")


def test_removing_a_guarded_package_is_refused(dnf5_root: Dnf5Root) -> None:
    """Removing rocm-core leaves the driver without its ROCm: no allowed pairing."""
    before = snapshot(dnf5_root)
    result = dnf5_root.dnf5("remove", "rocm-core")
    assert_refused_unchanged(dnf5_root, result, before, f"rocm-core {ROCM_62} -> (removed)")


def test_new_unsupported_kernel_is_refused(dnf5_root: Dnf5Root) -> None:
    """kernel 570 is not in the pairing's kernels: refused as a new install-only package, old kernel untouched."""
    before = snapshot(dnf5_root)
    result = dnf5_root.dnf5("install", FakeRpm("kernel", KERNEL_570).spec)
    assert_refused_unchanged(dnf5_root, result, before,
                             f"REFUSED (amd.pairing.kernels): kernel@{KERNEL_570} (not installed) -> {KERNEL_570}")


def test_allowed_kernel_installs_side_by_side(dnf5_root: Dnf5Root) -> None:
    """kernel 503 is supported: installed beside 427 (install-only), not as an upgrade of it."""
    result = dnf5_root.dnf5("install", FakeRpm("kernel", KERNEL_503).spec)
    assert result.returncode == 0, result.stdout + result.stderr
    kernels = sorted(k for k in dnf5_root.installed() if k.startswith("kernel-core@"))
    assert kernels == [f"kernel-core@{KERNEL_427}", f"kernel-core@{KERNEL_503}"]


def test_override_window_lets_the_violation_through_and_is_audited(dnf5_root: Dnf5Root) -> None:
    """Real dnf5: an open override window lets a breaking upgrade through, says so, and records override_used."""
    state = dnf5_root.state_dir
    start_window(str(state / "overrides.json"), str(state / "audit.log"), minutes=30, reason="swap driver",
                 max_minutes=60, opened_by="ops")
    result = dnf5_root.dnf5("upgrade", "rocm-core")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "override window" in result.stderr and "swap driver" in result.stderr
    assert dnf5_root.installed()["rocm-core"] == ROCM_63
    assert [e["kind"] for e in events(dnf5_root)] == ["override_used"]


@pytest.mark.parametrize("compiled_text,fragment", [(None, "no compiled policy"), ("{not json", "not valid JSON")])
def test_missing_or_malformed_compiled_policy_fails_safe(dnf5_root: Dnf5Root, compiled_text, fragment) -> None:
    """Fail-safe block-guarded: a guarded package is refused (nothing changed), an unguarded one passes."""
    compiled = dnf5_root.state_dir / "policy.compiled.json"
    if compiled_text is None:
        compiled.unlink()
    else:
        compiled.write_text(compiled_text)
    before = snapshot(dnf5_root)
    result = dnf5_root.dnf5("upgrade", "amdgpu-dkms", "rocm-core")
    assert_refused_unchanged(dnf5_root, result, before, "REFUSED by fail-safe 'block-guarded'")
    assert fragment in result.stderr and "dnf5 --disable-plugin=actions" in result.stderr
    result = dnf5_root.dnf5("upgrade", "hello-fake")
    assert result.returncode == 0 and "lets this transaction through" in result.stderr
    assert dnf5_root.installed()["hello-fake"] == "1.1-1"


def test_action_whose_code_cannot_load_warns_and_lets_through(dnf5_root: Dnf5Root) -> None:
    """A half-removed gpuguard (the launcher without its agent/ tree) must not block dnf5, its repair included."""
    import shutil

    shutil.rmtree(dnf5_root.sid.path(LIB) / "agent")
    result = dnf5_root.dnf5("upgrade", "rocm-core")
    assert result.returncode == 0 and "this transaction is NOT checked" in result.stderr
    assert dnf5_root.installed()["rocm-core"] == ROCM_63


def test_disable_plugin_bypasses_the_guard(dnf5_root: Dnf5Root) -> None:
    """``--disable-plugin=actions`` (like plain rpm) is not checked: the rollback covers those."""
    result = dnf5_root.dnf5("upgrade", "rocm-core", plugin=False)
    assert result.returncode == 0 and "gpuguard" not in result.stderr
    assert dnf5_root.installed()["rocm-core"] == ROCM_63 and events(dnf5_root) == []


def test_frozen_package_is_refused(dnf5_root: Dnf5Root) -> None:
    """A [frozen] rocm-core may not move even inside an allowed pairing."""
    dnf5_root.install_gpuguard(TEST_POLICY + '\n[frozen]\npackages = ["rocm-core"]\n')
    compile_policy(dnf5_root)
    before = snapshot(dnf5_root)
    result = dnf5_root.dnf5("upgrade", "amdgpu-dkms", "rocm-core")
    assert_refused_unchanged(dnf5_root, result, before, "REFUSED (frozen)")


def test_crashing_action_fails_closed(dnf5_root: Dnf5Root) -> None:
    """A launcher that dies without a decision (exit 139): raise_error=1 makes dnf5 refuse, nothing changed."""
    launcher = dnf5_root.sid.path(LIB) / "gpuguard-dnf5-action"
    launcher.write_text("#!/bin/sh\nexit 139\n")
    before = snapshot(dnf5_root)
    result = dnf5_root.dnf5("upgrade", "hello-fake")
    assert result.returncode == 1 and "Exit code: 139" in result.stderr, result.stdout + result.stderr
    assert snapshot(dnf5_root) == before


def test_missing_launcher_blocks_every_transaction_until_the_plugin_is_disabled(dnf5_root: Dnf5Root) -> None:
    """Unlike the dnf4 plugin (which warns and lets through), the actions plugin refuses every transaction when the
    command of an actions line cannot be executed; ``--disable-plugin=actions`` is the way out (docs/guard.md)."""
    (dnf5_root.sid.path(LIB) / "gpuguard-dnf5-action").unlink()
    before = snapshot(dnf5_root)
    result = dnf5_root.dnf5("upgrade", "hello-fake")
    assert result.returncode == 1 and "Cannot execute action" in result.stderr, result.stdout + result.stderr
    assert snapshot(dnf5_root) == before
    assert dnf5_root.dnf5("upgrade", "hello-fake", plugin=False).returncode == 0
    assert dnf5_root.installed()["hello-fake"] == "1.1-1"
