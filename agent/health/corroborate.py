"""Corroboration (pure): a probe result counts only where it agrees with what root saw itself.

The probe runs the host's ML interpreter as an unprivileged user, and anyone who can write to that environment
decides what it prints. Root therefore holds every claim against its own evidence, in this order:

    1. identity     no GPU index, UUID or PCI address listed twice; figures only for a device the result lists
                    (``duplicate_gpu``, ``unlisted_index``)
    2. count        no more GPUs than root's inventory (the snapshot's NVML/sysfs GPUs, the SMI library's, or
                    ``expected_gpu_count``) (``more_gpus_than_host``)
    3. devices      every PCI address the framework names is one root enumerated; on NVIDIA every UUID too (NVML's
                    and CUDA's are the same); a model name that maps to another SKU than root's (``unknown_device``)
    4. time         nothing negative; no zero where work was done; no GPU or phase longer than the run root timed
                    (``impossible_time``)
    5. figures      no negative size; a memory peak or a copy (source and destination) within the GPU's memory
                    (``impossible_figure``)
    6. peaks        no GEMM above the SKU's dense bf16/fp16 datasheet peak, no copy above its memory bandwidth, each
                    times ``MARGIN`` (``above_peak``); the SKU is root's own (snapshot), else the probe's claim
                    (which can only tighten the bound); an unknown SKU keeps the generic bounds (finite, 0..1e7:
                    model.py) and ``unverified`` says so
    7. memory       every GPU the probe says worked with a device-memory peak of at least ``MEMORY_CLAIM_MIN_BYTES``
                    showed, in root's SMI readings during the run, memory in use above the lowest level root saw
                    (the reading before the probe, or lower) by ``MEMORY_RISE_FRACTION`` of the claim, and at least
                    ``MEMORY_RISE_MIN_BYTES`` (``memory_unseen``); checked only where the SMI library read that GPU
                    at least ``MEMORY_MIN_SAMPLES`` times during the run, no two readings more than
                    ``MEMORY_MAX_GAP_SECONDS`` apart, else ``unverified`` says why

A rule that lacks root's evidence (no inventory, no PCI address) does not guess: the claim goes to ``unverified``.
Any disagreement makes the check ``failed`` (classify.py) and keeps the result out of the baseline; its ``kind``
decides, its message is for people. The utilization rule (root's SMI sampler saw no rise on a GPU the probe says it
used) lives in fallback.py and makes the check ``cpu_fallback``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

from agent.health.fallback import GpuInventory, match_activity, normalise_bdf, normalise_uuid
from agent.health.model import (
    ActivityReport,
    Corroboration,
    DisagreementKind,
    GpuFigures,
    ProbeDevice,
    ProbeDisagreement,
    ProbeResult,
)
from agent.health.sku_limits import MARGIN, SkuLimits, lookup
from agent.snapshot.model import Snapshot

# A copy smaller than this can be served from an on-die cache (MI300X: 256 MB Infinity Cache, about 17 TB/s), so
# its bound is CACHE_FACTOR times the HBM peak; the probe's full-size copy is 4 GiB.
CACHE_SAFE_COPY_BYTES = 1 << 30
CACHE_FACTOR = 4.0
# The run root timed (interpreter start to exit) against the probe's own clocks: slack for rounding and scheduling.
WALL_SLACK_FRACTION = 0.05
WALL_SLACK_SECONDS = 0.5
# The memory rule. The real probe's peak is its copy step's two 4 GiB buffers (9.7 GB claimed on the H100 and H200),
# held about 0.15-0.3 s (docs/hardware/); the probe empties the allocator's cache after every step. Readings at most
# MEMORY_MAX_GAP_SECONDS apart cannot miss a peak held that long, and NVML's "used" holds the CUDA context besides
# what torch counts, so an honest run shows the whole claim: a quarter of it (and 128 MiB) is a wide margin.
MEMORY_CLAIM_MIN_BYTES = 256 << 20
MEMORY_RISE_FRACTION = 0.25
MEMORY_RISE_MIN_BYTES = 128 << 20
MEMORY_MIN_SAMPLES = 2
MEMORY_MAX_GAP_SECONDS = 0.1


@dataclass(frozen=True)
class RootGpu:
    """One GPU as root enumerated it (snapshot, SMI library): what the probe's claims are held against."""

    bdf: Optional[str]
    uuid: Optional[str] = None
    model: Optional[str] = None
    device_id: Optional[str] = None
    memory_total_bytes: Optional[int] = None


@dataclass(frozen=True)
class RootView:
    """What root saw itself: the inventory's count, each GPU's identity and model, the run's wall time."""

    inventory: GpuInventory
    gpus: Tuple[RootGpu, ...] = ()
    # UUIDs are compared only where they are the framework's too (NVML and CUDA share them; amdsmi's and HIP's differ).
    uuids_comparable: bool = False
    probe_wall_seconds: Optional[float] = None
    # The SMI sampler's readings during the run (activity, device memory); None where root has none to offer.
    activity: Optional[ActivityReport] = None

    @property
    def bdfs(self) -> Dict[str, RootGpu]:
        return {g.bdf: g for g in self.gpus if g.bdf}

    @property
    def uuids(self) -> Dict[str, RootGpu]:
        return {g.uuid: g for g in self.gpus if g.uuid}


def root_view(snapshot: Optional[Snapshot], activity: Optional[ActivityReport], inventory: GpuInventory,
              probe_wall_seconds: Optional[float] = None) -> RootView:
    """Root's own GPUs from the snapshot (NVML or /proc and sysfs on NVIDIA, sysfs and amdsmi on AMD) and the SMI
    sampler, merged by PCI address."""
    merged: Dict[str, RootGpu] = {}
    loose: List[RootGpu] = []
    nvidia = False

    def add(gpu: RootGpu) -> None:
        if gpu.bdf is None:
            loose.append(gpu)
            return
        old = merged.get(gpu.bdf)
        merged[gpu.bdf] = gpu if old is None else RootGpu(
            gpu.bdf, old.uuid or gpu.uuid, old.model or gpu.model, old.device_id or gpu.device_id,
            old.memory_total_bytes or gpu.memory_total_bytes)

    if snapshot is not None and snapshot.nvidia.data is not None:
        nvidia = nvidia or bool(snapshot.nvidia.data.gpus)
        for nv in snapshot.nvidia.data.gpus:
            add(RootGpu(normalise_bdf(nv.bdf), normalise_uuid(nv.uuid), nv.name, None, nv.memory_total_bytes))
    if snapshot is not None and snapshot.amdgpu.data is not None:
        for amd in snapshot.amdgpu.data.gpus:
            add(RootGpu(normalise_bdf(amd.bdf), None, amd.market_name, amd.device_id, amd.vram_total_bytes))
    if activity is not None and activity.library is not None:
        nvidia = nvidia or activity.library == "pynvml"
        for smi in activity.gpus:
            add(RootGpu(normalise_bdf(smi.bdf), normalise_uuid(smi.uuid) if activity.library == "pynvml" else None))
    return RootView(inventory, tuple(merged.values()) + tuple(loose), uuids_comparable=nvidia,
                    probe_wall_seconds=probe_wall_seconds, activity=activity)


class _Findings:
    """What the rules found: disagreements, the checks that held, the claims that could not be checked."""

    def __init__(self) -> None:
        self.disagreements: List[ProbeDisagreement] = []
        self.checked: List[str] = []
        self.unverified: List[str] = []

    def refuse(self, kind: DisagreementKind, message: str, gpu: Optional[int] = None) -> None:
        self.disagreements.append(ProbeDisagreement(kind=kind, message=message, gpu=gpu))


def _gpu_rows(probe: ProbeResult) -> List[GpuFigures]:
    """The rows that claim work on a GPU (a CPU run's row is the CPU's, judged by fallback.py)."""
    return [g for g in probe.gpus if g.device != "cpu"] if probe.ran_on == "gpu" else []


def _duplicates(values: Iterable[Optional[str]]) -> List[str]:
    seen: Dict[str, int] = {}
    for value in values:
        if value:
            seen[value] = seen.get(value, 0) + 1
    return sorted(v for v, n in seen.items() if n > 1)


def identity_rules(probe: ProbeResult, found: _Findings) -> None:
    """Each device and each GPU's figures once; figures only for a device the result lists."""
    rows = _gpu_rows(probe)
    for what, values in (("device index", [str(d.index) for d in probe.devices]),
                         ("GPU index with figures", [str(g.index) for g in rows]),
                         ("device UUID", [normalise_uuid(d.uuid) for d in probe.devices]),
                         ("device PCI address", [normalise_bdf(d.pci_bus_id) for d in probe.devices])):
        for value in _duplicates(values):
            found.refuse("duplicate_gpu", f"the result lists {what} {value} more than once")
    listed = {d.index for d in probe.devices}
    for gpu in rows:
        if gpu.index not in listed:
            found.refuse("unlisted_index", f"figures for GPU {gpu.index}, which the result's devices do not list "
                                           f"({sorted(listed) or 'none'})", gpu.index)
    for dev in probe.devices:
        if dev.index >= probe.device_count:
            found.refuse("unlisted_index", f"device index {dev.index} beyond the result's own device count "
                                           f"{probe.device_count}", dev.index)
    if probe.ran_on == "gpu" and probe.collective is not None and probe.collective.world_size > len(listed):
        found.refuse("unlisted_index", f"an all-reduce over {probe.collective.world_size} ranks with "
                                       f"{len(listed)} devices listed")
    if not found.disagreements:
        found.checked.append(f"identity: {len(probe.devices)} device(s), {len(rows)} with figures, each once")


def count_rules(probe: ProbeResult, view: RootView, found: _Findings) -> None:
    """No more GPUs than root's own inventory."""
    count = view.inventory.gpu_count
    sources = ", ".join(view.inventory.sources) or "none"
    if count <= 0:
        if probe.device_count or probe.devices:
            found.unverified.append(f"GPU count: root enumerated no GPUs itself, the probe's "
                                    f"{probe.device_count} not checked")
        return
    claimed = max(probe.device_count, len(probe.devices), len({g.index for g in _gpu_rows(probe)}))
    if claimed > count:
        found.refuse("more_gpus_than_host", f"the probe claims {claimed} GPUs; root's inventory has {count} "
                                            f"({sources})")
    else:
        found.checked.append(f"GPU count: {claimed} <= {count} in root's inventory ({sources})")


def _root_gpu_of(dev: Optional[ProbeDevice], view: RootView) -> Optional[RootGpu]:
    if dev is None:
        return None
    by_bdf = view.bdfs.get(normalise_bdf(dev.pci_bus_id) or "")
    if by_bdf is not None:
        return by_bdf
    return view.uuids.get(normalise_uuid(dev.uuid) or "") if view.uuids_comparable else None


def device_rules(probe: ProbeResult, view: RootView, found: _Findings) -> None:
    """Every PCI address (and on NVIDIA every UUID) the framework names is one root enumerated, of the same SKU."""
    bdfs, uuids = view.bdfs, view.uuids if view.uuids_comparable else {}
    for dev in probe.devices:
        bdf, uuid = normalise_bdf(dev.pci_bus_id), normalise_uuid(dev.uuid)
        if bdfs and bdf is not None and bdf not in bdfs:
            found.refuse("unknown_device", f"GPU {dev.index}: PCI address {bdf} is none of root's "
                                           f"({', '.join(sorted(bdfs))})", dev.index)
        elif uuids and uuid is not None and uuid not in uuids:
            found.refuse("unknown_device", f"GPU {dev.index}: UUID {uuid} is none that NVML enumerates", dev.index)
        elif (bdf is None or not bdfs) and (uuid is None or not uuids):
            found.unverified.append(f"GPU {dev.index}: identity not checked (root knows no PCI address or UUID "
                                    "to hold it against, or the framework named none)")
            continue
        mine = _root_gpu_of(dev, view)
        claimed, own = lookup(dev.name), lookup(mine.model, mine.device_id) if mine is not None else None
        if claimed is not None and own is not None and claimed.name != own.name:
            found.refuse("unknown_device", f"GPU {dev.index}: the framework names it {dev.name!r}, root's "
                                           f"inventory {mine.model if mine else None!r}", dev.index)
    if bdfs or uuids:
        found.checked.append(f"devices: PCI addresses{' and UUIDs' if uuids else ''} against root's "
                             f"{len(view.gpus)} GPU(s)")


def _did_work(gpu: GpuFigures) -> bool:
    return (gpu.gemm_tflops is not None or gpu.copy_bandwidth_gbps is not None or gpu.train_ok is True
            or gpu.checkpoint_ok is True)


def time_rules(probe: ProbeResult, view: RootView, found: _Findings) -> None:
    """Nothing negative, nothing zero where work was done, nothing longer than the run root timed."""
    wall = view.probe_wall_seconds
    limit = None if wall is None else wall * (1 + WALL_SLACK_FRACTION) + WALL_SLACK_SECONDS
    before = len(found.disagreements)
    for name, value in sorted(probe.phase_seconds.items()):
        if value < 0 or not math.isfinite(value):
            found.refuse("impossible_time", f"phase {name!r} took {value:g} s")
        elif limit is not None and value > limit:
            found.refuse("impossible_time", f"phase {name!r} took {value:g} s of a run root timed at "
                                            f"{wall:.3f} s")
    for gpu in probe.gpus:
        timed: Dict[str, Optional[float]] = {
            "seconds": gpu.seconds, "train_first_step_seconds": gpu.train_first_step_seconds,
            "train_step_seconds": gpu.train_step_seconds, "checkpoint_seconds": gpu.checkpoint_seconds,
            **{f"step_seconds.{k}": v for k, v in gpu.step_seconds.items()}}
        must_be_positive = {"seconds": _did_work(gpu), "train_first_step_seconds": bool(gpu.train_steps),
                            "train_step_seconds": bool(gpu.train_steps), "checkpoint_seconds": gpu.checkpoint_ok}
        for name, took in timed.items():
            if took is None:
                continue
            if took < 0 or not math.isfinite(took) or (took == 0 and must_be_positive.get(name)):
                found.refuse("impossible_time", f"GPU {gpu.index}: {name} = {took:g} s", gpu.index)
            elif limit is not None and took > limit:
                found.refuse("impossible_time", f"GPU {gpu.index}: {name} = {took:g} s, longer than the run root "
                                                f"timed ({wall:.3f} s)", gpu.index)
    if len(found.disagreements) == before:
        found.checked.append("times: none negative, none zero where work was done"
                             + (f", none beyond the {wall:.3f} s root timed" if wall is not None else ""))


def figure_rules(probe: ProbeResult, view: RootView, found: _Findings) -> None:
    """No negative size or count; the memory the probe says it used fits the GPU."""
    devices = {d.index: d for d in probe.devices}
    before = len(found.disagreements)
    for gpu in probe.gpus:
        sizes = {"gemm_size": gpu.gemm_size, "copy_bytes": gpu.copy_bytes, "train_steps": gpu.train_steps,
                 "checkpoint_bytes": gpu.checkpoint_bytes, "device_memory_peak_bytes": gpu.device_memory_peak_bytes}
        for name, value in sizes.items():
            if value is not None and value < 0:
                found.refuse("impossible_figure", f"GPU {gpu.index}: {name} = {value}", gpu.index)
        if gpu.device == "cpu":
            continue
        dev = devices.get(gpu.index)
        mine = _root_gpu_of(dev, view)
        total = (mine.memory_total_bytes if mine is not None else None) or (dev.memory_total_bytes if dev else None)
        if total is None:
            continue
        if gpu.device_memory_peak_bytes is not None and gpu.device_memory_peak_bytes > total:
            found.refuse("impossible_figure", f"GPU {gpu.index}: a device-memory peak of "
                                              f"{gpu.device_memory_peak_bytes} bytes on a {total}-byte GPU", gpu.index)
        if gpu.copy_bytes is not None and 2 * gpu.copy_bytes > total:
            found.refuse("impossible_figure", f"GPU {gpu.index}: a copy of {gpu.copy_bytes} bytes (and its "
                                              f"destination) on a {total}-byte GPU", gpu.index)
    if len(found.disagreements) == before:
        found.checked.append("sizes: none negative, memory within each GPU's")


def _peak_for(dev: Optional[ProbeDevice], gpu: GpuFigures, view: RootView) -> Tuple[Optional[SkuLimits], str]:
    """The SKU whose peaks bound a GPU's figures, and whose word that is."""
    mine = _root_gpu_of(dev, view)
    if mine is not None:
        own = lookup(mine.model, mine.device_id)
        if own is not None:
            return own, "root's inventory"
    models = {p.name: p for p in (lookup(g.model, g.device_id) for g in view.gpus) if p is not None}
    if len(models) == 1 and len(view.gpus) == sum(1 for g in view.gpus if lookup(g.model, g.device_id)):
        return next(iter(models.values())), "root's inventory"
    if models:
        # Root knows its models but not which one this is: the fastest of them bounds it.
        return max(models.values(), key=lambda p: (p.bf16_tflops, p.hbm_gbps)), "the fastest of root's models"
    # Root knows no model: the probe's own claim can only tighten the generic bound, never loosen it.
    claimed = lookup(gpu.name) or lookup(dev.name if dev else None)
    return claimed, "the probe's own claim"


def peak_rules(probe: ProbeResult, view: RootView, found: _Findings) -> None:
    """GEMM and copy figures within the SKU's datasheet peaks times MARGIN."""
    devices = {d.index: d for d in probe.devices}
    for gpu in _gpu_rows(probe):
        peak, whose = _peak_for(devices.get(gpu.index), gpu, view)
        if peak is None:
            found.unverified.append(f"GPU {gpu.index}: model {gpu.name!r} has no datasheet peak here: only the "
                                    "generic bounds (finite, 0..1e7) hold")
            continue
        gemm = gpu.gemm_tflops
        gemm_peak = peak.bf16_tflops if gpu.gemm_dtype == "bf16" else peak.fp16_tflops
        failed = False
        if gemm is not None and gemm > gemm_peak * MARGIN:
            failed = True
            found.refuse("above_peak", f"GPU {gpu.index}: {gpu.gemm_dtype} GEMM at {gemm:g} TFLOP/s, above the "
                                       f"{peak.name}'s dense peak {gemm_peak:g} x {MARGIN:g} ({whose})", gpu.index)
        copy = gpu.copy_bandwidth_gbps
        small = gpu.copy_bytes is not None and gpu.copy_bytes < CACHE_SAFE_COPY_BYTES
        copy_peak = peak.hbm_gbps * (CACHE_FACTOR if small else 1.0)
        if copy is not None and copy > copy_peak * MARGIN:
            failed = True
            found.refuse("above_peak", f"GPU {gpu.index}: device copy at {copy:g} GB/s, above the {peak.name}'s "
                                       f"{'cache bound' if small else 'memory bandwidth'} {copy_peak:g} x "
                                       f"{MARGIN:g} ({whose})", gpu.index)
        if not failed:
            found.checked.append(f"GPU {gpu.index}: figures within the {peak.name}'s datasheet peaks x "
                                 f"{MARGIN:g} ({whose})")
    if probe.collective is not None and probe.collective.bus_bandwidth_gbps is not None:
        found.unverified.append("all-reduce bus bandwidth: no interconnect peak here, only the generic bounds")


def _mib(value: int) -> str:
    return f"{value / (1 << 20):.0f} MiB"


def memory_rules(probe: ProbeResult, view: RootView, found: _Findings) -> None:
    """Each GPU that claims a device-memory peak worth checking showed memory in use rise in root's SMI readings."""
    claims = [g for g in _gpu_rows(probe) if _did_work(g) and g.device_memory_peak_bytes is not None
              and g.device_memory_peak_bytes >= MEMORY_CLAIM_MIN_BYTES]
    if not claims:
        return
    activity = view.activity
    if activity is None or activity.library is None:
        why = activity.unavailable_reason if activity is not None and activity.unavailable_reason else "no readings"
        found.unverified.append(f"device memory: no SMI library read it during the run ({why})")
        return
    gap = activity.max_gap_seconds
    matched = match_activity(probe, activity)
    for gpu in claims:
        claim = gpu.device_memory_peak_bytes
        assert claim is not None
        smi = matched.get(gpu.index)
        if smi is None:
            found.unverified.append(f"GPU {gpu.index}: device memory not checked ({activity.library} lists no GPU "
                                    "with its UUID or PCI address)")
            continue
        if smi.memory_samples < MEMORY_MIN_SAMPLES or smi.memory_low_bytes is None or smi.memory_peak_bytes is None:
            found.unverified.append(f"GPU {gpu.index}: device memory not checked ({smi.memory_samples} "
                                    f"{activity.library} reading(s) during the run, {MEMORY_MIN_SAMPLES} needed)")
            continue
        needed = max(MEMORY_RISE_MIN_BYTES, int(claim * MEMORY_RISE_FRACTION))
        rise = smi.memory_peak_bytes - smi.memory_low_bytes
        # A rise seen is evidence whatever the gaps; a rise missed proves nothing unless no peak could fall between
        # two readings (on a real H100 some gaps reached 0.106-0.124 s though the sampler asks every 0.02 s).
        if rise < needed and (gap is None or gap > MEMORY_MAX_GAP_SECONDS):
            found.unverified.append(f"GPU {gpu.index}: device memory not checked ({activity.library} saw a rise of "
                                    f"{_mib(max(rise, 0))}, readings up to {gap if gap is not None else '?'} s "
                                    f"apart, more than {MEMORY_MAX_GAP_SECONDS:g} s: a peak could fall between them)")
            continue
        if rise < needed:
            found.refuse("memory_unseen", f"GPU {gpu.index}: the probe claims a device-memory peak of {_mib(claim)}; "
                                          f"{activity.library} saw memory in use rise by {_mib(max(rise, 0))} "
                                          f"({smi.memory_samples} readings; {_mib(needed)} needed)", gpu.index)
        else:
            found.checked.append(f"GPU {gpu.index}: device memory rose by {_mib(rise)} in {activity.library}'s "
                                 f"readings (claim {_mib(claim)}, {_mib(needed)} needed)")


def corroborate(probe: ProbeResult, view: RootView) -> Corroboration:
    """Every rule in order; the result lists each disagreement, each check that held, each claim left unchecked."""
    found = _Findings()
    identity_rules(probe, found)
    count_rules(probe, view, found)
    device_rules(probe, view, found)
    time_rules(probe, view, found)
    figure_rules(probe, view, found)
    peak_rules(probe, view, found)
    memory_rules(probe, view, found)
    count = view.inventory.gpu_count
    return Corroboration(inventory_gpu_count=count if count > 0 else None,
                         inventory_sources=list(view.inventory.sources), checked=found.checked,
                         unverified=found.unverified, disagreements=found.disagreements)


def disagreement_lines(disagreements: Sequence[ProbeDisagreement]) -> List[str]:
    """One line per disagreement, as the result's failures list them."""
    return [f"not corroborated ({d.kind}): {d.message}" for d in disagreements]


__all__ = ["corroborate", "root_view", "RootView", "RootGpu", "MARGIN",
           "disagreement_lines"]
