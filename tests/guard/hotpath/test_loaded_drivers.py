"""A driver no package carries is judged by the loaded module (seen on the H200 VM, docs/hardware.md).

There the NVIDIA driver is the VM host's (module 580.159.04, no nvidia-driver-* package) and only CUDA 13
packages are installed. Before the hook read the loaded module, every apt run there printed "the host already
violates the policy ... NVIDIA driver none" and the guard could never record a known-good set.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.guard.hotpath import decision as exits
from agent.hostfacts.loaded_modules import loaded_drivers
from agent.policy.load import load_and_compile, write_compiled
from tests.guard.apt.test_hook import run_hook

REPO = Path(__file__).resolve().parents[3]
H200_ROOT = REPO / "tests/fixtures/roots/nvidia-h200-ubuntu2404"
OPEN_LINE = ("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build  "
             "(dvs-builder@U22-I3-AF03-09-1)  Thu Nov 20 00:52:37 UTC 2025\n")
PROPRIETARY_LINE = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.183.01  Sun May 12 19:39:15 UTC 2024\n"
POLICY = """
[policy]
name = "h200-r580-cuda13"
[[nvidia.pairing]]
name = "r580-cuda13"
driver = "580.*"
cuda = "13.0.*"
[frozen]
packages = ["cuda-compat-13-0"]
"""
STATUS = "".join(
    f"Package: {name}\nStatus: install ok installed\nArchitecture: amd64\nVersion: {version}\nDescription: x\n\n"
    for name, version in [("cuda-cudart-13-0", "13.0.96-1"), ("cuda-compat-13-0", "580.95.05-0ubuntu1"),
                          ("vim", "2:9.1.0016-1ubuntu7")])
HEAD = "VERSION 3\nAPT::Architecture=amd64\nCommandLine::AsString=apt-get%20install\n\n"


def test_reads_the_real_h200_fixture() -> None:
    """On the recorded H200 root the loaded nvidia module's version is read from sysfs."""
    assert loaded_drivers(str(H200_ROOT)) == {"nvidia": "580.159.04"}


@pytest.mark.parametrize("text,expected", [
    (OPEN_LINE, {"nvidia": "580.159.04"}),
    (PROPRIETARY_LINE, {"nvidia": "535.183.01"}),
    ("NVRM version: something else entirely\n", {}),
    ("", {}),
])
def test_proc_version_when_sysfs_has_no_version(tmp_path: Path, text: str, expected: dict) -> None:
    """Without a sysfs version the NVIDIA version comes from /proc/driver/nvidia/version (open or proprietary), else
    none."""
    (tmp_path / "proc/driver/nvidia").mkdir(parents=True)
    (tmp_path / "proc/driver/nvidia/version").write_text(text)
    assert loaded_drivers(str(tmp_path)) == expected


def test_no_module_no_driver(tmp_path: Path) -> None:
    """A root with no GPU module loaded gives no loaded driver."""
    assert loaded_drivers(str(tmp_path)) == {}


@pytest.fixture
def h200(tmp_path: Path) -> Path:
    (tmp_path / "var/lib/dpkg").mkdir(parents=True)
    (tmp_path / "var/lib/dpkg/status").write_text(STATUS)
    (tmp_path / "sys/module/nvidia").mkdir(parents=True)
    (tmp_path / "sys/module/nvidia/version").write_text("580.159.04\n")
    policy = tmp_path / "policy.toml"
    policy.write_text(POLICY)
    _, compiled = load_and_compile(str(policy))
    write_compiled(str(tmp_path / "var/lib/gpuguard/policy.compiled.json"), compiled)
    return tmp_path


def test_unrelated_upgrade_on_the_h200_is_silent(h200: Path) -> None:
    """On the H200 root an unrelated upgrade passes silently: the loaded module stands for the driver no package
    carries."""
    code, out = run_hook(h200, HEAD + "vim 2:9.1.0016-1ubuntu7 amd64 none < 2:9.1.0016-1ubuntu8 amd64 none /x.deb\n")
    assert (code, out) == (exits.EXIT_ALLOW, "")


def test_removing_the_frozen_package_is_refused_without_a_false_pairing_note(h200: Path) -> None:
    """Removing a frozen package on the H200 is refused for that, with no false note that the host already violates."""
    code, out = run_hook(h200, HEAD + "cuda-compat-13-0 580.95.05-0ubuntu1 amd64 none < - - none **REMOVE**\n")
    assert code == exits.EXIT_REFUSED
    assert "REFUSED (frozen): cuda-compat-13-0 580.95.05-0ubuntu1 -> (removed)" in out
    assert "already violates" not in out


def test_cuda_upgrade_past_the_pairing_names_the_loaded_module(h200: Path) -> None:
    """A CUDA upgrade past the pairing is refused, naming the loaded nvidia module as the driver."""
    code, out = run_hook(h200, HEAD + "cuda-cudart-13-0 13.0.96-1 amd64 none < 13.1.80-1 amd64 none /x.deb\n")
    assert code == exits.EXIT_REFUSED
    assert "NVIDIA driver 580.159.04 (loaded nvidia module, no driver package) with CUDA 13.1.80" in out


def test_without_the_module_the_old_false_note_would_show(h200: Path) -> None:
    """Without the module's version the hook sees no driver and notes a violation: what reading the module prevents."""
    (h200 / "sys/module/nvidia/version").unlink()
    code, out = run_hook(h200, HEAD + "vim 2:9.1.0016-1ubuntu7 amd64 none < 2:9.1.0016-1ubuntu8 amd64 none /x.deb\n")
    assert code == exits.EXIT_ALLOW
    assert "already violates the policy (nvidia.pairing): NVIDIA driver none" in out
