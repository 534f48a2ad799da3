"""The host's current stack pairing, distilled from a snapshot: what fleet questions are asked about."""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

from agent.models import FrozenModel

if TYPE_CHECKING:  # pragma: no cover
    from agent.snapshot.model import Snapshot

# Pairing is part of the report schema (agent/report/events.py): the collectors are imported only by pairing_of, so
# the daemon, which sends pairings it gets from its snapshot child, does not load them (issue #17).


class Pairing(FrozenModel):
    """Kernel, OS, driver and user-space versions, as loaded and as installed."""

    os_id: Optional[str] = None
    os_version_id: Optional[str] = None
    kernel_running: Optional[str] = None
    kernel_next_boot: Optional[str] = None
    amdgpu_loaded: Optional[str] = None
    amdgpu_dkms_package: Optional[str] = None
    rocm: Optional[str] = None
    rocm_core_package: Optional[str] = None
    rocm_releases: str = ""  # every ROCm release installed, classic and TheRock: "6.4.1 (rocm-core), 7.13.0 (...)"
    # the tree update-alternatives points at, of side-by-side trees: "/opt/rocm/core-10.0" (None: no alternative)
    rocm_active_tree: Optional[str] = None
    nvidia_loaded: Optional[str] = None
    cuda_driver_api: Optional[str] = None
    gpu_count: int = 0
    gpu_models: str = ""


def pairing_of(snap: Snapshot) -> Pairing:
    """Summarise a snapshot into its pairing."""
    from agent.collectors.packages import find_version
    from agent.defaults import AMD_DRIVER_PACKAGE, ROCM_CORE_PACKAGE
    from agent.policy.globs import any_glob
    from agent.policy.releases import rocm_package_patterns, rocm_release

    packages = snap.packages()
    amd, nv, rocm = snap.amdgpu.data, snap.nvidia.data, snap.rocm.data
    carries_rocm = any_glob(rocm_package_patterns(ROCM_CORE_PACKAGE))
    rocm_found = sorted((key.split(":", 1)[0], info.version) for key, info in packages.items()
                        if carries_rocm(key.split(":", 1)[0]))
    models = sorted({g.market_name or "?" for g in (amd.gpus if amd else [])}
                    | {g.name or "?" for g in (nv.gpus if nv else [])})
    return Pairing(
        os_id=snap.os.data.id if snap.os.data else None,
        os_version_id=snap.os.data.version_id if snap.os.data else None,
        kernel_running=snap.kernel.data.running_release if snap.kernel.data else None,
        kernel_next_boot=snap.kernel.data.next_boot if snap.kernel.data else None,
        amdgpu_loaded=amd.driver_version if amd else None,
        amdgpu_dkms_package=find_version(packages, AMD_DRIVER_PACKAGE),
        rocm=rocm.version if rocm else None,
        rocm_core_package=find_version(packages, ROCM_CORE_PACKAGE),
        rocm_releases=", ".join(f"{rocm_release(v) or v} ({n})" for n, v in rocm_found),
        rocm_active_tree=rocm.alternative.target if rocm is not None and rocm.alternative is not None else None,
        nvidia_loaded=nv.driver_version if nv else None,
        cuda_driver_api=nv.cuda_driver_version if nv else None,
        gpu_count=(len(amd.gpus) if amd else 0) + (len(nv.gpus) if nv else 0),
        gpu_models=", ".join(models),
    )
