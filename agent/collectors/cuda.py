"""CUDA toolkits installed under /usr/local/cuda-X.Y and their forward-compat driver libraries."""

from __future__ import annotations

from typing import List, Optional

from agent.models import FrozenModel


class CudaToolkit(FrozenModel):
    """One CUDA toolkit tree."""

    path: str
    version: Optional[str] = None
    compat_driver_version: Optional[str] = None


class CudaInfo(FrozenModel):
    """Every toolkit on disk and which one /usr/local/cuda points at."""

    default_path: Optional[str] = None
    toolkits: List[CudaToolkit] = []


class CudaCollector:
    """Placeholder until implemented."""

    name = "cuda"

    def collect(self, host) -> CudaInfo:  # pragma: no cover - replaced by the real collector
        from agent.errors import CollectorUnavailable

        raise CollectorUnavailable("not implemented yet")
