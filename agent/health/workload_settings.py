"""A registered workload: ``[[health.workloads]]`` in /etc/gpuguard/agent.toml (docs/health.md "Your workloads")."""

from __future__ import annotations

import re
from typing import List, Optional

from pydantic import Field, model_validator

from agent.models import FrozenModel
from agent.wire import workload_name_ok

_MODULE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
_METRIC = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


class WorkloadSettings(FrozenModel):
    """One of the team's own workloads, run by gpuguard's shim under the probe's user, limits and watch.

    Exactly one of ``module`` (run as ``python -m`` would, in the host's ML environment: ``[health] python`` and
    ``python_path``), ``script`` (an absolute path) or ``container_image`` (with ``module`` or ``script`` naming what
    to run inside it, the shim mounted read-only) says where it runs.
    """

    name: str
    module: Optional[str] = None
    script: Optional[str] = None
    args: List[str] = []
    container_image: Optional[str] = None
    timeout_seconds: float = Field(600.0, gt=0, le=7200)
    # Device memory the workload may take per GPU; a busy GPU with less free than this defers the workload.
    device_memory_budget_bytes: Optional[int] = Field(None, ge=1 << 20)
    # The figure compared with the workload's baseline (a key of its gpuguard_result line), and which way is better.
    metric: Optional[str] = None
    higher_is_better: bool = True
    noise_band_fraction: float = Field(0.10, gt=0.0, lt=1.0)
    # A gating workload's failure fails the health check: it holds a node, halts a rollout's batch and, with
    # [health] after_change = "rollback", undoes the change (docs/guard.md "Rollback on a failed check").
    gates: bool = True
    # The op-level CPU-fallback evidence (workload_shim.py); off only for a workload that cannot run under it.
    instrument_ops: bool = True
    # The PyTorch device type the GPU work runs on (cuda on NVIDIA and ROCm builds, xpu on Intel), and the host's.
    accelerator_device: str = "cuda"
    host_device: str = "cpu"

    @model_validator(mode="after")
    def _one_way_to_run(self) -> "WorkloadSettings":
        if not workload_name_ok(self.name):
            raise ValueError(f"name {self.name!r}: 1-64 of a-z 0-9 _ . - starting with a letter or digit")
        if (self.module is None) == (self.script is None):
            raise ValueError(f"workload {self.name!r}: give exactly one of module or script")
        if self.module is not None and not _MODULE.match(self.module):
            raise ValueError(f"workload {self.name!r}: module {self.module!r} is not a dotted module name")
        if self.script is not None and not self.script.startswith("/"):
            raise ValueError(f"workload {self.name!r}: script {self.script!r} is not an absolute path")
        if self.container_image is not None and not self.container_image.strip():
            raise ValueError(f"workload {self.name!r}: container_image must not be empty")
        if self.metric is not None and not _METRIC.match(self.metric):
            raise ValueError(f"workload {self.name!r}: metric {self.metric!r}: 1-64 of A-Z a-z 0-9 _ . -")
        for device in (self.accelerator_device, self.host_device):
            if not re.match(r"^[a-z][a-z0-9_]{0,31}$", device):
                raise ValueError(f"workload {self.name!r}: {device!r} is not a PyTorch device type")
        return self


def unique_names(workloads: List[WorkloadSettings]) -> Optional[str]:
    """The first name given twice, if any."""
    seen = set()
    for workload in workloads:
        if workload.name in seen:
            return workload.name
        seen.add(workload.name)
    return None
