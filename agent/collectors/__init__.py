"""Collectors, one per source; ``default_collectors`` is the explicit, ordered registry."""

from __future__ import annotations

from typing import Iterable, Tuple

from agent.collectors.amdgpu import AmdgpuCollector
from agent.collectors.base import Collector
from agent.collectors.container_cgroups import ContainerCgroupsCollector
from agent.collectors.containers import ContainersCollector
from agent.collectors.cuda import CudaCollector
from agent.collectors.dkms import DkmsCollector
from agent.collectors.dpkg import DpkgCollector
from agent.collectors.kernel import KernelCollector
from agent.collectors.nvidia import NvidiaCollector
from agent.collectors.os_release import OsReleaseCollector
from agent.collectors.packages import Watchlist
from agent.collectors.rocm import RocmCollector
from agent.collectors.rpm import RpmCollector
from agent.defaults import DEFAULT_WATCHED_PATTERNS


def default_collectors(watched_patterns: Iterable[str] = DEFAULT_WATCHED_PATTERNS) -> Tuple[Collector, ...]:
    """Every collector in snapshot order; the names match the Snapshot fields."""
    watch = Watchlist(watched_patterns)
    return (
        OsReleaseCollector(),
        KernelCollector(),
        DkmsCollector(),
        DpkgCollector(watch),
        RpmCollector(watch),
        AmdgpuCollector(),
        RocmCollector(),
        NvidiaCollector(),
        CudaCollector(),
        ContainersCollector(),
        ContainerCgroupsCollector(),
    )
