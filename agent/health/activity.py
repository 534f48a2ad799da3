"""Sample the GPUs' SMI activity counters while the probe runs: independent proof that the work reached a GPU.

NVML's utilization (percent of time a kernel ran) and amdsmi's GFX activity are read through ``host.load_module``
on a background thread every ``interval_seconds``; the first reading, taken before the probe starts, is the idle
level. Library errors are mapped here, at the boundary: a library that cannot start gives a report with its
reason; a failed single reading is counted, not raised.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Callable, List, Optional, Protocol, Sequence

from agent.errors import LibraryUnavailable
from agent.health.model import ActivityReport, GpuActivity
from agent.log import get_logger

log = get_logger("health.activity")


@dataclass(frozen=True)
class SmiDevice:
    """One GPU as the SMI library enumerates it."""

    smi_index: int
    bdf: Optional[str]
    uuid: Optional[str]


class SmiReader(Protocol):
    """Reads one activity percentage per GPU; None where a GPU gave no reading."""

    library: str
    devices: Sequence[SmiDevice]

    def read(self) -> List[Optional[float]]: ...

    def close(self) -> None: ...


def _text(value: Any) -> Optional[str]:
    if value is None:
        return None
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    return str(value).strip("\x00 ") or None


def _percent(value: Any) -> Optional[float]:
    """A reading as a float percentage; amdsmi says "N/A" for counters a GPU does not have."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return None


class NvmlReader:
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

    def read(self) -> List[Optional[float]]:
        out: List[Optional[float]] = []
        for handle in self._handles:
            try:
                out.append(_percent(self._nvml.nvmlDeviceGetUtilizationRates(handle).gpu))
            except Exception:  # noqa: BLE001 - one failed reading is counted by the sampler
                out.append(None)
        return out

    def close(self) -> None:
        try:
            self._nvml.nvmlShutdown()
        except Exception:  # noqa: BLE001 - nothing to do about a failed shutdown
            pass


class AmdsmiReader:
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

    def read(self) -> List[Optional[float]]:
        out: List[Optional[float]] = []
        for handle in self._handles:
            try:
                out.append(_percent(self._amdsmi.amdsmi_get_gpu_activity(handle).get("gfx_activity")))
            except Exception:  # noqa: BLE001 - one failed reading is counted by the sampler
                out.append(None)
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
              interval_seconds: float) -> ActivityReport:
    """Idle level (first reading) and peak per GPU over all readings."""
    gpus = []
    errors = 0
    for dev in devices:
        values = [r[dev.smi_index] if dev.smi_index < len(r) else None for r in readings]
        errors += sum(1 for v in values if v is None)
        seen = [v for v in values if v is not None]
        gpus.append(GpuActivity(smi_index=dev.smi_index, bdf=dev.bdf, uuid=dev.uuid,
                                idle_percent=values[0] if values else None,
                                max_percent=max(seen) if seen else None, samples=len(seen)))
    return ActivityReport(library=library, interval_seconds=interval_seconds, read_errors=errors, gpus=gpus)


class ActivitySampler:
    """Reads activity on a thread from ``start()`` to ``stop()``; ``stop()`` returns the report."""

    def __init__(self, load_module: Callable[[str], ModuleType], vendor: Optional[str],
                 interval_seconds: float) -> None:
        self._load_module = load_module
        self._vendor = vendor
        self._interval = interval_seconds
        self._reader: Optional[SmiReader] = None
        self._unavailable: Optional[str] = None
        self._readings: List[List[Optional[float]]] = []
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def start(self) -> None:
        try:
            self._reader = open_reader(self._load_module, self._vendor)
        except LibraryUnavailable as exc:
            self._unavailable = str(exc)
            log.info("health_activity_unavailable", reason=self._unavailable)
            return
        self._readings.append(self._reader.read())  # the idle level, before the probe starts
        self._thread = threading.Thread(target=self._loop, name="gpuguard-activity", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        assert self._reader is not None
        while not self._stop.wait(self._interval):
            self._readings.append(self._reader.read())

    def stop(self) -> ActivityReport:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self._reader is None:
            return ActivityReport(unavailable_reason=self._unavailable, interval_seconds=self._interval)
        self._reader.close()
        return summarize(self._reader.library, self._reader.devices, list(self._readings), self._interval)
