"""Whether a host has a GPU at all (agent/health/presence.py), read from fixture roots modelled on real hosts."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.health.presence import no_gpu_reason
from tests.health.helpers import make_fake_nvml, make_host, make_snapshot

ROOTS = Path(__file__).resolve().parents[1] / "fixtures" / "roots"


@pytest.mark.parametrize("scenario", ["nvidia-h200-ubuntu2404", "mi300x-rocm62-ubuntu2204"])
def test_gpu_hosts_have_gpus(scenario: str) -> None:
    """The H200 host (NVIDIA display function in sysfs) and the MI300X host (AMD accelerator, class 0x12) have GPUs."""
    assert no_gpu_reason(make_host(root=ROOTS / scenario)) is None


def test_gpuless_host_has_none() -> None:
    """The GPU-less Debian 12 root, with no SMI library, has no GPU, and the reason says where it looked."""
    reason = no_gpu_reason(make_host(root=ROOTS / "gpuless-debian12"))
    assert reason is not None and reason.startswith("no GPU on this host") and "/sys/bus/pci/devices" in reason


def test_nvswitch_alone_is_no_gpu(tmp_path: Path) -> None:
    """An NVIDIA function of class 0x0680 (an NVSwitch) is not a GPU; the same vendor with class 0x0302 is."""
    device = tmp_path / "sys" / "bus" / "pci" / "devices" / "0000:05:00.0"
    device.mkdir(parents=True)
    (device / "vendor").write_text("0x10de\n")
    (device / "class").write_text("0x068000\n")
    assert no_gpu_reason(make_host(root=tmp_path)) is not None
    (device / "class").write_text("0x030200\n")
    assert no_gpu_reason(make_host(root=tmp_path)) is None


@pytest.mark.parametrize("node", ["kfd", "nvidia0", "nvidia7"])
def test_device_nodes_are_gpus(tmp_path: Path, node: str) -> None:
    """/dev/kfd or /dev/nvidia<N> means a GPU; /dev/nvidiactl alone does not."""
    (tmp_path / "dev").mkdir()
    (tmp_path / "dev" / "nvidiactl").write_text("")
    assert no_gpu_reason(make_host(root=tmp_path)) is not None
    (tmp_path / "dev" / node).write_text("")
    assert no_gpu_reason(make_host(root=tmp_path)) is None


def test_snapshot_or_smi_library_is_enough(tmp_path: Path) -> None:
    """With nothing on disk, a snapshot listing a GPU or an SMI library enumerating one says the host has GPUs."""
    assert no_gpu_reason(make_host(root=tmp_path), make_snapshot(nvidia_gpus=1)) is None
    assert no_gpu_reason(make_host(root=tmp_path), make_snapshot(nvidia_gpus=0)) is not None
    assert no_gpu_reason(make_host({"pynvml": make_fake_nvml([[0.0]])}, root=tmp_path)) is None
