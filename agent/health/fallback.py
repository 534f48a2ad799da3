"""Fallback rules (pure): evidence that the probe's work did not really run on the host's GPUs.

Each rule returns reasons, never raises; the classifier turns any reason into ``cpu_fallback``. A rule that lacks
its evidence (no SMI library, no inventory) stays silent rather than guess.
"""

from __future__ import annotations

import re
from typing import Dict, List, Literal, Optional

from agent.health.model import ActivityReport, FallbackReason, GpuActivity, ProbeResult
from agent.health.settings import HealthSettings
from agent.models import FrozenModel

Vendor = Literal["amd", "nvidia"]
# An idle reading this high means other work keeps the GPU busy: "did not rise" cannot be judged then.
_BUSY_BEFORE_PERCENT = 90.0
_BDF = re.compile(r"^(?:([0-9a-fA-F]{1,8}):)?([0-9a-fA-F]{1,2}):([0-9a-fA-F]{1,2})\.([0-7])$")


class GpuInventory(FrozenModel):
    """The GPUs the host has, from the snapshot and the SMI library: what the framework must see."""

    vendor: Optional[Vendor] = None
    gpu_count: int = 0
    sources: List[str] = []


def normalise_bdf(text: Optional[str]) -> Optional[str]:
    """``0000:19:00.0`` from NVML's ``00000000:19:00.0``, sysfs or amdsmi forms; None when not a PCI address."""
    if not text:
        return None
    match = _BDF.match(text.strip())
    if match is None:
        return None
    domain, bus, device, function = match.groups()
    return "{:04x}:{:02x}:{:02x}.{}".format(int(domain or "0", 16), int(bus, 16), int(device, 16), function)


def normalise_uuid(text: Optional[str]) -> Optional[str]:
    """A GPU UUID without NVML's ``GPU-`` prefix, lower case."""
    if not text:
        return None
    value = text.strip().lower()
    return value[4:] if value.startswith("gpu-") else value


def merge_inventory(snapshot_vendor: Optional[Vendor], snapshot_count: int, activity: Optional[ActivityReport],
                    expected_count: Optional[int]) -> GpuInventory:
    """The host's GPUs: the configured count if set, else the larger of the snapshot's and the SMI library's."""
    sources = []
    vendor = snapshot_vendor
    count = snapshot_count
    if snapshot_count:
        sources.append("snapshot")
    if activity is not None and activity.library is not None and activity.gpus:
        sources.append(activity.library)
        count = max(count, len(activity.gpus))
        if vendor is None:
            vendor = "nvidia" if activity.library == "pynvml" else "amd"
    if expected_count is not None:
        return GpuInventory(vendor=vendor, gpu_count=expected_count, sources=["config"])
    return GpuInventory(vendor=vendor, gpu_count=count, sources=sources)


def build_rules(probe: ProbeResult, inventory: GpuInventory, settings: HealthSettings) -> List[FallbackReason]:
    """A CPU-only or wrong-vendor framework build, or fewer GPUs than the host has, or a run on the CPU."""
    reasons: List[FallbackReason] = []
    fw = probe.framework
    build = fw.build if fw is not None else None
    if build == "cpu" and settings.require_accelerator:
        reasons.append(FallbackReason(code="cpu_only_build",
                                      message=f"{fw.name} {fw.version} is a CPU-only build" if fw else "CPU build"))
    if fw is not None and inventory.vendor == "amd" and build == "cuda":
        reasons.append(FallbackReason(code="wrong_vendor_build",
                                      message=f"{fw.name} {fw.version} is a CUDA build on an AMD GPU host"))
    if fw is not None and inventory.vendor == "nvidia" and build == "rocm":
        reasons.append(FallbackReason(code="wrong_vendor_build",
                                      message=f"{fw.name} {fw.version} is a ROCm build on an NVIDIA GPU host"))
    if probe.device_count < inventory.gpu_count:
        reasons.append(FallbackReason(
            code="fewer_gpus_than_inventory",
            message=f"the framework sees {probe.device_count} of the host's {inventory.gpu_count} GPUs "
                    f"(inventory from {', '.join(inventory.sources) or 'config'})"))
    if probe.ran_on == "cpu" and settings.require_accelerator and not reasons:
        reasons.append(FallbackReason(code="ran_on_cpu", message="the framework saw no GPU and ran on the CPU"))
    return reasons


def activity_rose(gpu: GpuActivity, min_percent: float) -> Optional[bool]:
    """True/False whether the GPU's activity rose during the run; None when it cannot be judged."""
    if gpu.samples == 0 or gpu.max_percent is None:
        return None
    idle = gpu.idle_percent if gpu.idle_percent is not None else 0.0
    if idle >= _BUSY_BEFORE_PERCENT:
        return None
    return gpu.max_percent >= min_percent and gpu.max_percent > idle


def match_activity(probe: ProbeResult, activity: Optional[ActivityReport]) -> Dict[int, GpuActivity]:
    """The SMI reading of each GPU the probe used, matched by UUID, else by PCI address; unmatched ones left out."""
    if activity is None or not activity.gpus:
        return {}
    by_uuid = {normalise_uuid(g.uuid): g for g in activity.gpus if normalise_uuid(g.uuid)}
    by_bdf = {normalise_bdf(g.bdf): g for g in activity.gpus if normalise_bdf(g.bdf)}
    devices = {d.index: d for d in probe.devices}
    out: Dict[int, GpuActivity] = {}
    for gpu in probe.gpus:
        dev = devices.get(gpu.index)
        if dev is None:
            continue
        smi = by_uuid.get(normalise_uuid(dev.uuid)) or by_bdf.get(normalise_bdf(dev.pci_bus_id))
        if smi is not None:
            out[gpu.index] = smi
    return out


def activity_rules(probe: ProbeResult, activity: Optional[ActivityReport],
                   settings: HealthSettings) -> List[FallbackReason]:
    """Every GPU the probe says it used must show SMI activity; matched by UUID or PCI address when both know it."""
    if probe.ran_on != "gpu" or activity is None or activity.library is None or not activity.gpus:
        return []
    matched = match_activity(probe, activity)
    reasons: List[FallbackReason] = []
    for index, smi in sorted(matched.items()):
        if activity_rose(smi, settings.activity_min_percent) is False:
            idle = "?" if smi.idle_percent is None else f"{smi.idle_percent:g}%"
            reasons.append(FallbackReason(
                code="smi_activity_flat", gpu=index,
                message=f"GPU {index} ({smi.bdf or smi.uuid}): {activity.library} activity peaked at "
                        f"{smi.max_percent:g}% (idle {idle}) while the probe said it computed there"))
    unmatched = [g.index for g in probe.gpus if g.index not in matched]
    if unmatched:
        # Without a mapping, at least as many SMI GPUs must have risen as the probe used.
        judged = [activity_rose(g, settings.activity_min_percent) for g in activity.gpus]
        risen = sum(1 for j in judged if j)
        if all(j is not None for j in judged) and risen < len(probe.gpus):
            reasons.append(FallbackReason(
                code="smi_activity_flat",
                message=f"the probe used {len(probe.gpus)} GPUs but {activity.library} saw activity rise on "
                        f"{risen}"))
    return reasons


def throughput_rules(probe: ProbeResult, settings: HealthSettings) -> List[FallbackReason]:
    """Figures below any data-center GPU's rate: the work ran somewhere else (CPU, emulation, a wrong device)."""
    if probe.ran_on != "gpu" or not settings.require_accelerator:
        return []
    reasons: List[FallbackReason] = []
    for gpu in probe.gpus:
        gemm = gpu.gemm_tflops
        if gemm is not None and gemm < settings.min_gemm_tflops:
            reasons.append(FallbackReason(
                code="implausible_throughput", gpu=gpu.index,
                message=f"GPU {gpu.index}: {gpu.gemm_dtype} GEMM at {gemm:.2f} TFLOP/s is below any GPU's rate "
                        f"(floor {settings.min_gemm_tflops:g})"))
        if gpu.copy_bandwidth_gbps is not None and gpu.copy_bandwidth_gbps < settings.min_copy_gbps:
            reasons.append(FallbackReason(
                code="implausible_throughput", gpu=gpu.index,
                message=f"GPU {gpu.index}: device copy at {gpu.copy_bandwidth_gbps:.1f} GB/s is below any GPU's "
                        f"memory bandwidth (floor {settings.min_copy_gbps:g})"))
    return reasons


def detect_fallback(probe: ProbeResult, inventory: GpuInventory, activity: Optional[ActivityReport],
                    settings: HealthSettings) -> List[FallbackReason]:
    """Every fallback reason the evidence supports, in a stable order."""
    return [*build_rules(probe, inventory, settings), *activity_rules(probe, activity, settings),
            *throughput_rules(probe, settings)]
