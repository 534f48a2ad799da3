"""Sample the GPUs' SMI activity counters while the probe runs: independent proof that the work reached a GPU.

NVML's utilization (percent of time a kernel ran) and amdsmi's GFX activity, and each GPU's device memory in use
(NVML's total - free, amdsmi's VRAM used), are read through ``host.load_module`` on a background thread every
``interval_seconds``; the first reading, taken before the probe starts, is the idle level and the memory other
tenants hold. Library errors are mapped here, at the boundary: a library that cannot start gives a report with its
reason; a failed single reading is counted, not raised.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Callable, List, Optional, Protocol, Sequence, Tuple

from agent.errors import LibraryUnavailable
from agent.health.model import ActivityReport, GpuActivity, OccupancyReport
from agent.log import get_logger

log = get_logger("health.activity")


@dataclass(frozen=True)
class SmiProcess:
    """A process with a context on one GPU, as the SMI library lists it."""

    pid: int
    used_memory_bytes: Optional[int]
    name: Optional[str] = None


@dataclass(frozen=True)
class SmiOccupancy:
    """One GPU's compute processes, utilization and device memory at one moment; None where it cannot tell.

    ``processes`` is None when the library could not list them (then only utilization and memory speak).
    """

    utilization_percent: Optional[float]
    memory_total_bytes: Optional[int]
    memory_free_bytes: Optional[int]
    processes: Optional[List[SmiProcess]]


@dataclass(frozen=True)
class SmiDevice:
    """One GPU as the SMI library enumerates it."""

    smi_index: int
    bdf: Optional[str]
    uuid: Optional[str]


class SmiReader(Protocol):
    """Reads one activity percentage and one device-memory figure per GPU; None where a GPU gave no reading."""

    library: str
    devices: Sequence[SmiDevice]

    def read(self) -> List[Optional[float]]: ...

    def memory_used(self) -> List[Optional[int]]: ...

    def occupancy(self) -> List[SmiOccupancy]: ...

    def close(self) -> None: ...


def _text(value: Any) -> Optional[str]:
    if value is None:
        return None
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    return str(value).strip("\x00 ") or None


def _count(value: Any) -> Optional[int]:
    """A byte count or pid; None for "N/A", None, negative values and NVML's not-available marker (2**64 - 1)."""
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < (1 << 63):
        return value
    return None


def _percent(value: Any) -> Optional[float]:
    """A reading as a float percentage; amdsmi says "N/A" for counters a GPU does not have."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return None


class _HandleReader:
    """What the NVML and amdsmi readers share: one reading per GPU handle, a failed one read as None."""

    _handles: List[Any]

    def _utilization(self, handle: Any) -> Optional[float]:
        raise NotImplementedError

    def _memory(self, handle: Any) -> Tuple[Optional[int], Optional[int]]:
        """(total, free) device memory in bytes."""
        raise NotImplementedError

    def _processes(self, handle: Any) -> Optional[List[SmiProcess]]:
        raise NotImplementedError

    def read(self) -> List[Optional[float]]:
        out: List[Optional[float]] = []
        for handle in self._handles:
            try:
                out.append(self._utilization(handle))
            except Exception:  # noqa: BLE001 - one failed reading is counted by the sampler
                out.append(None)
        return out

    def memory_used(self) -> List[Optional[int]]:
        """Device memory in use per GPU (total - free), bytes."""
        out: List[Optional[int]] = []
        for handle in self._handles:
            try:
                total, free = self._memory(handle)
            except Exception:  # noqa: BLE001 - one failed reading leaves the memory rule fewer samples
                total = free = None
            out.append(total - free if total is not None and free is not None and free <= total else None)
        return out

    def occupancy(self) -> List[SmiOccupancy]:
        out: List[SmiOccupancy] = []
        for handle, util in zip(self._handles, self.read()):
            try:
                total, free = self._memory(handle)
            except Exception:  # noqa: BLE001 - memory unknown: the budget falls back to the smallest size
                total = free = None
            out.append(SmiOccupancy(util, total, free, self._processes(handle)))
        return out


class NvmlReader(_HandleReader):
    """NVML utilization (``nvmlDeviceGetUtilizationRates(h).gpu``), one value per GPU."""

    library = "pynvml"

    def __init__(self, nvml: ModuleType) -> None:
        self._nvml = nvml
        try:
            nvml.nvmlInit()
            count = nvml.nvmlDeviceGetCount()
            self._handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        except Exception as exc:  # noqa: BLE001 - NVMLError and ctypes errors, mapped once here
            raise LibraryUnavailable("pynvml", f"cannot start NVML ({type(exc).__name__}: {exc})") from exc
        devices: List[SmiDevice] = []
        for i, handle in enumerate(self._handles):
            devices.append(SmiDevice(i, self._safe(lambda h: nvml.nvmlDeviceGetPciInfo(h).busId, handle),
                                     self._safe(nvml.nvmlDeviceGetUUID, handle)))
        self.devices: Sequence[SmiDevice] = devices

    @staticmethod
    def _safe(call: Callable[[Any], Any], handle: Any) -> Optional[str]:
        """``call(handle)`` as text, None when NVML cannot tell."""
        try:
            return _text(call(handle))
        except Exception:  # noqa: BLE001 - an identity detail a GPU does not report only weakens the mapping
            return None

    def _utilization(self, handle: Any) -> Optional[float]:
        return _percent(self._nvml.nvmlDeviceGetUtilizationRates(handle).gpu)

    def _memory(self, handle: Any) -> Tuple[Optional[int], Optional[int]]:
        memory = self._nvml.nvmlDeviceGetMemoryInfo(handle)
        return _count(memory.total), _count(memory.free)

    def _processes(self, handle: Any) -> Optional[List[SmiProcess]]:
        """``nvmlDeviceGetComputeRunningProcesses`` (pynvml maps it to _v3), else the _v2 call older drivers have."""
        calls = [getattr(self._nvml, name, None) for name in (
            "nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetComputeRunningProcesses_v2")]
        for call in calls:
            if call is None:
                continue
            try:
                infos = call(handle)
            except Exception:  # noqa: BLE001 - NVMLError_FunctionNotFound on an older driver: try the next one
                continue
            out = []
            for info in infos or []:
                pid = _count(getattr(info, "pid", None))
                if pid is not None:
                    out.append(SmiProcess(pid, _count(getattr(info, "usedGpuMemory", None))))
            return out
        return None

    def close(self) -> None:
        try:
            self._nvml.nvmlShutdown()
        except Exception:  # noqa: BLE001 - nothing to do about a failed shutdown
            pass


class AmdsmiReader(_HandleReader):
    """amdsmi GFX activity (``amdsmi_get_gpu_activity(h)["gfx_activity"]``), one value per GPU."""

    library = "amdsmi"

    def __init__(self, amdsmi: ModuleType) -> None:
        self._amdsmi = amdsmi
        try:
            amdsmi.amdsmi_init()
            self._handles = list(amdsmi.amdsmi_get_processor_handles())
        except Exception as exc:  # noqa: BLE001 - AmdSmiException and ctypes errors, mapped once here
            raise LibraryUnavailable("amdsmi", f"cannot start amdsmi ({type(exc).__name__}: {exc})") from exc
        devices: List[SmiDevice] = []
        for i, handle in enumerate(self._handles):
            try:
                bdf = _text(amdsmi.amdsmi_get_gpu_device_bdf(handle))
            except Exception:  # noqa: BLE001 - the mapping falls back to counting
                bdf = None
            devices.append(SmiDevice(i, bdf, None))
        self.devices: Sequence[SmiDevice] = devices

    def _utilization(self, handle: Any) -> Optional[float]:
        return _percent(self._amdsmi.amdsmi_get_gpu_activity(handle).get("gfx_activity"))

    def _memory(self, handle: Any) -> Tuple[Optional[int], Optional[int]]:
        vram = self._amdsmi.amdsmi_get_gpu_vram_usage(handle)  # MB
        total_mb, used_mb = _count(vram.get("vram_total")), _count(vram.get("vram_used"))
        if total_mb is None or used_mb is None:
            return None, None
        return total_mb * (1 << 20), max(0, total_mb - used_mb) * (1 << 20)

    def _processes(self, handle: Any) -> Optional[List[SmiProcess]]:
        """``amdsmi_get_gpu_process_list``: dicts (pid, name, memory_usage.vram_mem) in amdsmi 6.2 and later; older
        bindings return process handles that ``amdsmi_get_gpu_process_info`` resolves to the same dicts."""
        amdsmi = self._amdsmi
        try:
            entries = list(amdsmi.amdsmi_get_gpu_process_list(handle))
        except Exception:  # noqa: BLE001 - no process list from this library or driver
            return None
        out = []
        for entry in entries:
            info = entry
            if not isinstance(entry, dict):
                try:
                    info = amdsmi.amdsmi_get_gpu_process_info(handle, entry)
                except Exception:  # noqa: BLE001 - a process that exited between the two calls
                    continue
            if not isinstance(info, dict):
                continue
            pid = _count(info.get("pid"))
            usage = info.get("memory_usage")
            vram = _count(usage.get("vram_mem")) if isinstance(usage, dict) else None
            name = _text(info.get("name"))
            if pid is not None:
                out.append(SmiProcess(pid, vram if vram is not None else _count(info.get("mem")),
                                      None if name in (None, "N/A") else name))
        return out

    def close(self) -> None:
        try:
            self._amdsmi.amdsmi_shut_down()
        except Exception:  # noqa: BLE001 - nothing to do about a failed shutdown
            pass


def open_reader(load_module: Callable[[str], ModuleType], vendor: Optional[str]) -> SmiReader:
    """The SMI reader for the host's GPU vendor (both tried when unknown); LibraryUnavailable when none starts."""
    order = {"nvidia": ("pynvml",), "amd": ("amdsmi",)}.get(vendor or "", ("pynvml", "amdsmi"))
    reasons = []
    for name in order:
        try:
            module = load_module(name)
            reader: SmiReader = NvmlReader(module) if name == "pynvml" else AmdsmiReader(module)
        except LibraryUnavailable as exc:
            reasons.append(str(exc))
            continue
        if reader.devices:
            return reader
        reader.close()
        reasons.append(f"{name}: no GPUs enumerated")
    raise LibraryUnavailable("/".join(order), "; ".join(reasons) or "no SMI library")


def summarize(library: str, devices: Sequence[SmiDevice], readings: Sequence[Sequence[Optional[float]]],
              interval_seconds: float, memory: Sequence[Sequence[Optional[int]]] = (),
              times: Sequence[float] = ()) -> ActivityReport:
    """Idle level (first reading) and peak per GPU over all readings; device memory before the run (the first
    reading), its lowest and highest over all readings and how many readings the run had; the longest gap between
    two readings' monotonic ``times``."""
    gpus = []
    errors = 0
    for dev in devices:
        values = [r[dev.smi_index] if dev.smi_index < len(r) else None for r in readings]
        errors += sum(1 for v in values if v is None)
        seen = [v for v in values if v is not None]
        used = [m[dev.smi_index] if dev.smi_index < len(m) else None for m in memory]
        before = used[0] if used else None
        during = [u for u in used[1:] if u is not None]
        every = during + ([before] if before is not None else [])
        gpus.append(GpuActivity(smi_index=dev.smi_index, bdf=dev.bdf, uuid=dev.uuid,
                                idle_percent=values[0] if values else None,
                                max_percent=max(seen) if seen else None, samples=len(seen),
                                memory_before_bytes=before, memory_low_bytes=min(every) if every else None,
                                memory_peak_bytes=max(during) if during else None, memory_samples=len(during)))
    gaps = [b - a for a, b in zip(times, times[1:])]
    return ActivityReport(library=library, interval_seconds=interval_seconds, read_errors=errors,
                          max_gap_seconds=round(max(gaps), 4) if gaps else None, gpus=gpus)


def with_memory_looked_before(activity: ActivityReport, before: OccupancyReport) -> ActivityReport:
    """The report with the device memory the look before the probe read (certainly before the probe started, where
    the sampler's first reading may come while it imports its framework) as each GPU's reading before the run, and
    its lowest level lowered to it; the same library and PCI address, or nothing changes."""
    if activity.library is None or before.library != activity.library:
        return activity
    looked = {g.smi_index: g for g in before.gpus}
    gpus = []
    for gpu in activity.gpus:
        seen = looked.get(gpu.smi_index)
        total, free = (seen.memory_total_bytes, seen.memory_free_bytes) if seen is not None else (None, None)
        if seen is None or seen.bdf != gpu.bdf or total is None or free is None or free > total:
            gpus.append(gpu)
            continue
        used = total - free
        low = used if gpu.memory_low_bytes is None else min(used, gpu.memory_low_bytes)
        gpus.append(gpu.model_copy(update={"memory_before_bytes": used, "memory_low_bytes": low}))
    return activity.model_copy(update={"gpus": gpus})


class ActivitySampler:
    """Reads activity on a thread from ``start()`` to ``stop()``; ``stop()`` returns the report."""

    def __init__(self, load_module: Callable[[str], ModuleType], vendor: Optional[str],
                 interval_seconds: float,
                 on_occupancy: Optional[Callable[[Sequence[SmiDevice], List[SmiOccupancy]], None]] = None,
                 occupancy_interval_seconds: float = 0.5) -> None:
        self._load_module = load_module
        self._vendor = vendor
        self._interval = interval_seconds
        # Processes are listed less often than utilization is read: a tenant that starts mid-run holds on for longer.
        self._on_occupancy = on_occupancy
        self._occupancy_every = max(1, round(occupancy_interval_seconds / interval_seconds))
        self._reader: Optional[SmiReader] = None
        self._unavailable: Optional[str] = None
        self._readings: List[List[Optional[float]]] = []
        self._memory: List[List[Optional[int]]] = []
        self._times: List[float] = []
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def start(self) -> None:
        try:
            self._reader = open_reader(self._load_module, self._vendor)
        except LibraryUnavailable as exc:
            self._unavailable = str(exc)
            log.info("health_activity_unavailable", reason=self._unavailable)
            return
        self._tick()  # the idle level and the memory others hold, before the probe starts
        self._thread = threading.Thread(target=self._loop, name="gpuguard-activity", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        assert self._reader is not None
        ticks = 0
        while not self._stop.wait(self._interval):
            self._tick()
            ticks += 1
            if self._on_occupancy is not None and ticks % self._occupancy_every == 0:
                self.watch_occupancy()

    def _tick(self) -> None:
        """One reading of every GPU's activity and device memory, and when it was taken."""
        assert self._reader is not None
        self._times.append(time.monotonic())
        self._readings.append(self._reader.read())
        self._memory.append(self._reader.memory_used())

    def watch_occupancy(self) -> None:
        """Hand the GPUs' current processes to ``on_occupancy`` (also called once more as the probe ends)."""
        if self._reader is None or self._on_occupancy is None:
            return
        try:
            self._on_occupancy(self._reader.devices, self._reader.occupancy())
        except Exception as exc:  # noqa: BLE001 - a failed watch must not end the utilization sampling
            log.warning("health_occupancy_watch_failed", error=f"{type(exc).__name__}: {exc}")

    def stop(self) -> ActivityReport:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self.watch_occupancy()
        if self._reader is None:
            return ActivityReport(unavailable_reason=self._unavailable, interval_seconds=self._interval)
        self._reader.close()
        return summarize(self._reader.library, self._reader.devices, list(self._readings), self._interval,
                         list(self._memory), list(self._times))
