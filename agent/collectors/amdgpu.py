"""AMD GPU driver (amdgpu) and per-GPU inventory: amdsmi first, sysfs when amdsmi cannot be used."""

from __future__ import annotations

from typing import Dict, List, Literal, Optional

from agent.models import FrozenModel

DriverKind = Literal["dkms", "inbox", "not_loaded"]
Source = Literal["amdsmi", "sysfs"]


class AmdGpu(FrozenModel):
    """One AMD GPU (or partition) as the driver reports it."""

    bdf: str
    market_name: Optional[str] = None
    gfx_target: Optional[str] = None
    device_id: Optional[str] = None
    uuid: Optional[str] = None
    vbios_version: Optional[str] = None
    vbios_part_number: Optional[str] = None
    firmware: Dict[str, str] = {}
    vram_total_bytes: Optional[int] = None
    ecc_correctable_count: Optional[int] = None
    ecc_uncorrectable_count: Optional[int] = None


class AmdgpuInfo(FrozenModel):
    """The loaded amdgpu driver and the GPUs it drives."""

    module_loaded: bool
    driver_version: Optional[str] = None
    driver_kind: DriverKind
    source: Source
    smi_library_version: Optional[str] = None
    smi_unavailable_reason: Optional[str] = None
    gpus: List[AmdGpu] = []


class AmdgpuCollector:
    """Placeholder until implemented."""

    name = "amdgpu"

    def collect(self, host) -> AmdgpuInfo:  # pragma: no cover - replaced by the real collector
        from agent.errors import CollectorUnavailable

        raise CollectorUnavailable("not implemented yet")
