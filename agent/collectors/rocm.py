"""ROCm user space: the active /opt/rocm, every installed /opt/rocm-X.Y.Z, and what amdsmi says."""

from __future__ import annotations

from typing import List, Optional

from agent.models import FrozenModel


class RocmInstall(FrozenModel):
    """One ROCm tree on disk."""

    path: str
    version: Optional[str] = None


class RocmInfo(FrozenModel):
    """Which ROCm is active and which are installed."""

    active_path: Optional[str] = None
    version: Optional[str] = None
    installs: List[RocmInstall] = []
    smi_rocm_version: Optional[str] = None


class RocmCollector:
    """Placeholder until implemented."""

    name = "rocm"

    def collect(self, host) -> RocmInfo:  # pragma: no cover - replaced by the real collector
        from agent.errors import CollectorUnavailable

        raise CollectorUnavailable("not implemented yet")
