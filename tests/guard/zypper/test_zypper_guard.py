"""Real zypper 1.14 and libzypp 17.25 on a SLES-like overlay host: gpuguard's rpm plugin refuses what breaks the
policy before any package changes and lets the paired move through (the commit plugin's plan)."""

from __future__ import annotations

import subprocess
from typing import Dict

import pytest

from tests.guard.zypper.conftest import AMDGPU_63, BASELINE, CUDA_131, HELLO_11, KMP, KMP_RELEASE, NV_NEW, ROCM_63, spec
from tests.guard.zypper.harness import ZypperHost

pytestmark = pytest.mark.timeout(600)


def output(result: subprocess.CompletedProcess) -> str:
    return result.stdout + result.stderr


def tree(host: ZypperHost) -> Dict[str, bytes]:
    """Every payload file the fake packages installed, with its bytes."""
    base = host.path("/usr/share/gpuguard-fake")
    return {str(p.relative_to(base)): p.read_bytes() for p in sorted(base.rglob("*")) if p.is_file()}


def assert_refused_unchanged(host: ZypperHost, result: subprocess.CompletedProcess, rule: str,
                             before: Dict[str, bytes]) -> None:
    text = output(result)
    assert result.returncode != 0, text
    assert f"gpuguard: REFUSED ({rule})" in text, text
    assert "nothing was changed" in text
    assert host.installed() == BASELINE
    assert tree(host) == before


def test_a_mispaired_amdgpu_upgrade_is_refused_and_nothing_changes(host: ZypperHost) -> None:
    """zypper install amdgpu-dkms 6.3 beside ROCm 6.2: refused with the pairing line, installed set unchanged."""
    before = tree(host)
    result = host.zypper("install", spec("amdgpu-dkms", AMDGPU_63))
    assert_refused_unchanged(host, result, "amd.pairing", before)
    assert "move amdgpu-dkms and rocm-core" in output(result)


def test_a_cuda_release_outside_the_pairing_is_refused(host: ZypperHost) -> None:
    """zypper install cuda-toolkit-13-1 beside driver 580.95.05 (paired with CUDA 13.0 only): refused."""
    before = tree(host)
    result = host.zypper("install", spec("cuda-toolkit-13-1", CUDA_131))
    assert_refused_unchanged(host, result, "nvidia.pairing", before)


def test_zypper_update_moving_the_driver_alone_is_refused_at_its_first_package(host: ZypperHost) -> None:
    """zypper update (every newer package, the NVIDIA G06 driver among them) is judged whole and refused before
    its first package, the harmless one included."""
    before = tree(host)
    result = host.zypper("update")
    assert_refused_unchanged(host, result, "nvidia.pairing", before)


def test_removing_a_driver_part_is_refused(host: ZypperHost) -> None:
    """zypper remove nvidia-compute-G06 (one part of the driver build, the kernel module stays): refused."""
    before = tree(host)
    result = host.zypper("remove", "nvidia-compute-G06")
    text = output(result)
    assert result.returncode != 0 and "gpuguard: REFUSED" in text, text
    assert host.installed() == BASELINE and tree(host) == before


def test_the_paired_amd_upgrade_is_allowed(host: ZypperHost) -> None:
    """amdgpu-dkms and rocm-core to 6.3 in one zypper run: allowed, although libzypp runs rpm once per package
    and amdgpu 6.3 beside ROCm 6.2 would be refused alone (the commit plugin's plan judges the whole commit)."""
    result = host.zypper("install", spec("amdgpu-dkms", AMDGPU_63), spec("rocm-core", ROCM_63))
    assert result.returncode == 0, output(result)
    assert "REFUSED" not in output(result)
    assert host.installed() == {**BASELINE, "amdgpu-dkms": AMDGPU_63, "rocm-core": ROCM_63}


def test_without_the_commit_plugin_the_paired_upgrade_is_refused_at_its_first_rpm_run(host: ZypperHost) -> None:
    """Why the commit plugin is there: without its plan the first rpm run (one package) is judged alone and
    refused, and zypper stops with nothing changed."""
    host.path("/usr/lib/zypp/plugins/commit/gpuguard").unlink()
    result = host.zypper("install", spec("amdgpu-dkms", AMDGPU_63), spec("rocm-core", ROCM_63))
    assert result.returncode != 0 and "REFUSED (amd.pairing)" in output(result)
    assert host.installed() == BASELINE


def test_an_unguarded_update_goes_through(host: ZypperHost) -> None:
    """zypper install hello-fake 1.1: allowed, silently."""
    result = host.zypper("install", spec("hello-fake", HELLO_11))
    assert result.returncode == 0, output(result)
    assert "gpuguard" not in output(result)
    assert host.installed()["hello-fake"] == HELLO_11


def test_rpm_by_hand_is_judged_too(host: ZypperHost) -> None:
    """rpm -U --nodeps of the new driver KMP (no zypper, no plan): the plugin judges and refuses it."""
    rpm_file = f"{host.repo_dir}/{KMP}-{NV_NEW}{KMP_RELEASE}.x86_64.rpm"
    result = host.rpm("-U", "--nodeps", rpm_file)
    text = output(result)
    assert result.returncode != 0 and "gpuguard: REFUSED (nvidia" in text, text
    assert host.installed() == BASELINE


ERROR_PLUGIN = """#!/usr/bin/python3
import sys
buffer = b""
while True:
    chunk = sys.stdin.buffer.read1(65536)
    if not chunk:
        break
    buffer += chunk
    while b"\\0" in buffer:
        frame, _, buffer = buffer.partition(b"\\0")
        command = frame.decode().lstrip("\\n").split("\\n", 1)[0]
        sys.stdout.write(("ERROR" if command == "COMMITBEGIN" else "ACK") + "\\n\\n\\0")
        sys.stdout.flush()
"""


def test_a_commit_plugin_answering_error_does_not_stop_the_commit(host: ZypperHost) -> None:
    """The evidence for docs/guard.md: libzypp unloads a commit plugin that answers COMMITBEGIN with ERROR and
    commits anyway, so a commit plugin cannot be the veto (gpuguard's rpm plugin removed for this run)."""
    host.path("/usr/lib/rpm/macros.d/macros.transaction_gpuguard").unlink()
    host.write("/usr/lib/zypp/plugins/commit/gpuguard", ERROR_PLUGIN, 0o755)
    result = host.zypper("install", spec("hello-fake", HELLO_11))
    assert result.returncode == 0, output(result)
    assert host.installed()["hello-fake"] == HELLO_11
    log = host.read("/var/log/zypper.log") or ""
    assert "Bad plugin response from PluginScript" in log and "PluginFrame[ERROR]" in log


def test_zypper_dup_moving_the_driver_alone_is_refused(host: ZypperHost) -> None:
    """zypper dup (a distribution upgrade to every newest build) is judged whole and refused before any change."""
    before = tree(host)
    result = host.zypper("dup")
    assert_refused_unchanged(host, result, "nvidia.pairing", before)


def test_a_hook_that_cannot_run_fails_the_transaction(host: ZypperHost) -> None:
    """The rpm plugin fails closed: with its hook gone, even a harmless install is refused, nothing changes."""
    host.path("/usr/lib/gpuguard/gpuguard-zypper-hook").unlink()
    result = host.zypper("install", spec("hello-fake", HELLO_11))
    assert result.returncode != 0
    assert "gpuguard: REFUSED by fail-safe: cannot run /usr/lib/gpuguard/gpuguard-zypper-hook" in output(result)
    assert host.installed() == BASELINE


def test_an_override_window_lets_the_mispaired_upgrade_through_and_says_so(host: ZypperHost) -> None:
    """gpuguard override start opens the same audited window as on apt and dnf: the refused upgrade now passes with
    the hook's override line, and the use of the window is audited."""
    opened = host.gpuguard("override", "start", "--minutes", "30", "--reason", "driver 6.3 rollout")
    assert opened.returncode == 0, output(opened)
    result = host.zypper("install", spec("amdgpu-dkms", AMDGPU_63))
    assert result.returncode == 0, output(result)
    assert "override" in output(result).lower()
    assert host.installed()["amdgpu-dkms"] == AMDGPU_63
    assert '"event":"override_used"' in (host.read("/var/lib/gpuguard/audit.log") or "")
