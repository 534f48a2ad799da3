"""NVIDIA driver and per-GPU inventory: NVML (nvidia-ml-py) first, /proc/driver/nvidia and sysfs otherwise."""

from __future__ import annotations

from typing import List, Literal, Optional

from agent.models import FrozenModel

Source = Literal["nvml", "procfs"]
ModuleFlavor = Literal["open", "proprietary"]


class NvidiaGpu(FrozenModel):
    """One NVIDIA GPU."""

    index: int
    bdf: str
    name: Optional[str] = None
    uuid: Optional[str] = None
    vbios_version: Optional[str] = None
    inforom_image_version: Optional[str] = None
    memory_total_bytes: Optional[int] = None
    ecc_enabled: Optional[bool] = None
    ecc_corrected_volatile_count: Optional[int] = None
    ecc_uncorrected_volatile_count: Optional[int] = None


class NvidiaInfo(FrozenModel):
    """The loaded nvidia driver and the GPUs it drives."""

    module_loaded: bool
    driver_version: Optional[str] = None
    module_flavor: Optional[ModuleFlavor] = None
    cuda_driver_version: Optional[str] = None
    source: Source
    nvml_unavailable_reason: Optional[str] = None
    gpus: List[NvidiaGpu] = []


class NvidiaCollector:
    """Placeholder until implemented."""

    name = "nvidia"

    def collect(self, host) -> NvidiaInfo:  # pragma: no cover - replaced by the real collector
        from agent.errors import CollectorUnavailable

        raise CollectorUnavailable("not implemented yet")
