"""The fallback rules: framework build, GPU count, SMI activity, implausible throughput."""

from __future__ import annotations

from typing import List, Optional

import pytest

from agent.health.fallback import (
    GpuInventory,
    activity_rose,
    detect_fallback,
    match_activity,
    merge_inventory,
    normalise_bdf,
)
from agent.health.model import ActivityReport, GpuActivity
from agent.health.settings import HealthSettings
from tests.health.probe_results import gpu_row, probe

NV = GpuInventory(vendor="nvidia", gpu_count=1, sources=["snapshot"])
AMD = GpuInventory(vendor="amd", gpu_count=1, sources=["snapshot"])
SETTINGS = HealthSettings()


def activity(*gpus: GpuActivity, library: str = "pynvml") -> ActivityReport:
    return ActivityReport(library=library, interval_seconds=0.02, gpus=list(gpus))


def act(index: int, idle: Optional[float], peak: Optional[float], bdf: Optional[str] = None,
        uuid: Optional[str] = None, samples: int = 10) -> GpuActivity:
    return GpuActivity(smi_index=index, bdf=bdf, uuid=uuid, idle_percent=idle, max_percent=peak, samples=samples)


def codes(reasons) -> List[str]:
    return [r.code for r in reasons]


def test_healthy_gpu_run_has_no_reason() -> None:
    """A CUDA build on an NVIDIA host, all GPUs seen, activity risen, plausible figures: no fallback."""
    busy = activity(act(0, 0.0, 98.0, bdf="00000000:00:06.0"))
    assert detect_fallback(probe(), NV, busy, SETTINGS) == []


@pytest.mark.parametrize("build, inventory, expected", [
    ("cpu", NV, ["cpu_only_build"]),
    ("cuda", AMD, ["wrong_vendor_build"]),
    ("rocm", NV, ["wrong_vendor_build"]),
    ("rocm", AMD, []),
    ("cuda", GpuInventory(), []),
])
def test_build_rules(build: str, inventory: GpuInventory, expected: List[str]) -> None:
    """CPU-only builds, and CUDA builds on AMD (or ROCm builds on NVIDIA) hosts, are fallbacks."""
    assert codes(detect_fallback(probe(build=build), inventory, None, SETTINGS)) == expected


def test_fewer_gpus_than_inventory_names_the_counts() -> None:
    """A framework that sees 2 of the host's 4 GPUs is a fallback that says so."""
    reasons = detect_fallback(probe([gpu_row(0), gpu_row(1)]), GpuInventory(vendor="nvidia", gpu_count=4), None,
                              SETTINGS)
    assert codes(reasons) == ["fewer_gpus_than_inventory"]
    assert "sees 2 of the host's 4 GPUs" in reasons[0].message


def test_cpu_run_without_inventory_is_still_a_fallback() -> None:
    """A CUDA build that saw no GPU and ran on the CPU is a fallback even when the inventory is unknown."""
    cpu = probe([gpu_row(0, gemm=0.3, copy=15.0, device="cpu")], device_count=0, ran_on="cpu")
    assert codes(detect_fallback(cpu, GpuInventory(), None, SETTINGS)) == ["ran_on_cpu"]


def test_require_accelerator_false_lets_a_cpu_run_pass() -> None:
    """On a CPU-only development box (require_accelerator false) a CPU run raises no fallback."""
    cpu = probe([gpu_row(0, gemm=0.3, copy=15.0, device="cpu")], build="cpu", device_count=0, ran_on="cpu")
    assert detect_fallback(cpu, GpuInventory(), None, HealthSettings(require_accelerator=False)) == []


def test_flat_activity_names_the_gpu_matched_by_bdf() -> None:
    """Of two GPUs, the one whose NVML utilization never rose is named; matched by PCI address."""
    two = probe([gpu_row(0), gpu_row(1)])
    report = activity(act(0, 0.0, 97.0, bdf="00000000:00:06.0"), act(1, 0.0, 0.0, bdf="00000000:00:07.0"))
    reasons = detect_fallback(two, GpuInventory(vendor="nvidia", gpu_count=2), report, SETTINGS)
    assert [(r.code, r.gpu) for r in reasons] == [("smi_activity_flat", 1)]


def test_flat_activity_matched_by_uuid() -> None:
    """NVML's GPU- prefixed UUID matches the framework's bare UUID."""
    report = activity(act(0, 5.0, 5.0, uuid="GPU-5A1B2C3D-0000-0000-0000-000000000000"))
    assert match_activity(probe(), report)[0].uuid.startswith("GPU-")
    assert codes(detect_fallback(probe(), NV, report, SETTINGS)) == ["smi_activity_flat"]


def test_unmatched_activity_is_judged_by_count() -> None:
    """Without a mapping, fewer risen SMI GPUs than GPUs used is a fallback; enough risen ones are not."""
    one = probe([gpu_row(0)], devices=[{"index": 0, "name": "GPU"}])
    flat = activity(act(0, 0.0, 0.0), act(1, 0.0, 0.0))
    risen = activity(act(0, 0.0, 0.0), act(1, 0.0, 60.0))
    assert codes(detect_fallback(one, GpuInventory(), flat, SETTINGS)) == ["smi_activity_flat"]
    assert detect_fallback(one, GpuInventory(), risen, SETTINGS) == []


@pytest.mark.parametrize("idle, peak, expected", [
    (0.0, 98.0, True), (0.0, 5.0, False), (40.0, 40.0, False), (40.0, 55.0, True), (95.0, 95.0, None),
    (None, 50.0, True), (0.0, None, None),
])
def test_activity_rose(idle: Optional[float], peak: Optional[float], expected: Optional[bool]) -> None:
    """Rose means a peak of at least 10% above the idle reading; a GPU busy before the run cannot be judged."""
    assert activity_rose(act(0, idle, peak), 10.0) is expected


def test_no_smi_library_means_no_activity_verdict() -> None:
    """When no SMI library could be loaded the activity rule stays silent."""
    report = ActivityReport(unavailable_reason="pynvml unavailable")
    assert detect_fallback(probe(), NV, report, SETTINGS) == []


def test_implausible_throughput_names_the_gpu() -> None:
    """A GEMM at CPU speed on a 'GPU' is a fallback for that GPU, as is a copy slower than any GPU memory."""
    slow = probe([gpu_row(0), gpu_row(1, gemm=1.2, copy=40.0)])
    reasons = detect_fallback(slow, GpuInventory(vendor="nvidia", gpu_count=2), None, SETTINGS)
    assert [(r.code, r.gpu) for r in reasons] == [("implausible_throughput", 1)] * 2


def test_merge_inventory_takes_the_larger_count_and_the_smi_vendor() -> None:
    """The SMI library's GPU count wins when larger; its library names the vendor; config overrides both."""
    report = activity(act(0, 0, 0), act(1, 0, 0), library="amdsmi")
    merged = merge_inventory(None, 1, report, None)
    assert (merged.vendor, merged.gpu_count, merged.sources) == ("amd", 2, ["snapshot", "amdsmi"])
    assert merge_inventory(None, 1, report, 8).gpu_count == 8


@pytest.mark.parametrize("text, expected", [
    ("00000000:19:00.0", "0000:19:00.0"), ("0000:C1:00.0", "0000:c1:00.0"), ("19:00.0", "0000:19:00.0"),
    ("GPU-xyz", None), (None, None),
])
def test_normalise_bdf(text: Optional[str], expected: Optional[str]) -> None:
    """NVML, amdsmi and sysfs PCI addresses normalise to one form."""
    assert normalise_bdf(text) == expected
