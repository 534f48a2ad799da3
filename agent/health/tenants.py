"""Other jobs on the GPUs: who uses each GPU before and while the probe runs, and what the check may do there.

Read through the same SMI seam as the activity sampler (``host.load_module`` -> pynvml / amdsmi): per GPU the
compute processes (NVML ``nvmlDeviceGetComputeRunningProcesses``, amdsmi ``amdsmi_get_gpu_process_list``), their
device memory, the utilization and the free device memory. A process is named from ``/proc/<pid>/comm`` through the
host root seam; a pid from another PID namespace (a container) does not resolve there, and the report says so.

The decision is pure (``decide``): a GPU that other processes hold, or whose utilization is above the threshold
before the probe starts, is busy. On a busy host the probe gets a device-memory budget (a fraction of the smallest
free memory, less a reserve for its own context) and only its functional checks count; below the minimum budget,
or when configured to wait, nothing runs and the check is deferred. Performance is never judged on a busy GPU.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Tuple

from agent.errors import GpuguardError
from agent.health.activity import SmiDevice, SmiOccupancy
from agent.health.model import GpuOccupancy, GpuTenant, HealthMode, OccupancyReport
from agent.health.settings import HealthSettings
from agent.host import Host

_NAME_UNRESOLVED = "not in this PID namespace (a container's process?)"


def process_name(host: Host, pid: int) -> Optional[str]:
    """The process's name from ``/proc/<pid>/comm`` under the host root; None when that pid is not there."""
    line = host.read_first_line(f"/proc/{pid}/comm")
    return line.strip() or None if line is not None else None


def process_session(host: Host, pid: int) -> Optional[int]:
    """The session id of a process (field 6 of ``/proc/<pid>/stat``), None when unreadable."""
    text = host.read_text(f"/proc/{pid}/stat")
    if not text or ")" not in text:
        return None
    fields = text.rsplit(")", 1)[1].split()
    try:
        return int(fields[3])  # state ppid pgrp session
    except (IndexError, ValueError):
        return None


def process_uid(host: Host, pid: int) -> Optional[int]:
    """The real uid of a process (the first ``Uid:`` field of ``/proc/<pid>/status``), None when unreadable."""
    try:
        text = host.read_text(f"/proc/{pid}/status")
    except GpuguardError:  # gone or hidden mid-read: not known to be gpuguard's, so it counts
        return None
    for line in (text or "").splitlines():
        if line.startswith("Uid:"):
            fields = line.split()
            return int(fields[1]) if len(fields) > 1 and fields[1].isdigit() else None
    return None


@dataclass(frozen=True)
class OwnProbes:
    """How gpuguard's own probes are told from other jobs on the GPUs: by identity, never by process name.

    ``uid``: the dedicated probe user's uid (a sandbox that dropped to ``gpuguard-probe``): a process of that user is
    a probe, whoever started it. ``sessions``: probe sessions (a probe's pid is its session id) that a check-lock
    record names, each with the uid it ran as (None: not recorded), so that a probe left behind by a killed check
    is still gpuguard's own, and a reused pid of another user is not.
    """

    uid: Optional[int] = None
    sessions: Tuple[Tuple[int, Optional[int]], ...] = ()

    def is_own(self, host: Host, pid: int) -> bool:
        if self.uid is None and not self.sessions:
            return False
        uid = process_uid(host, pid)
        if self.uid is not None and uid == self.uid:
            return True
        if self.sessions:
            session = process_session(host, pid)
            return any(session == s and (want is None or uid == want) for s, want in self.sessions)
        return False


NO_OWN_PROBES = OwnProbes()


def tenants_of(host: Host, occupancy: SmiOccupancy, seen: str,
               is_own: Callable[[int], bool] = lambda pid: False) -> List[GpuTenant]:
    """The GPU's processes other than the probe's own, named from /proc (else by the SMI library)."""
    out: List[GpuTenant] = []
    for proc in occupancy.processes or []:
        if is_own(proc.pid):
            continue
        name = process_name(host, proc.pid)
        out.append(GpuTenant(pid=proc.pid, name=name or proc.name, used_memory_bytes=proc.used_memory_bytes,
                             name_unresolved=None if name else _NAME_UNRESOLVED, seen=seen))
    return out


def occupancy_of(host: Host, devices: Sequence[SmiDevice], readings: Sequence[SmiOccupancy],
                 settings: HealthSettings, confirmed: Optional[Sequence[SmiOccupancy]] = None,
                 own: OwnProbes = NO_OWN_PROBES) -> List[GpuOccupancy]:
    """Each GPU before the probe: its tenants, utilization, memory, and whether it is busy (with the reasons).

    ``confirmed``: a second reading taken ``busy_utilization_confirm_seconds`` later; where given, utilization makes
    a GPU busy only when both readings reach the threshold (the first may still average a job that has just ended).
    ``own``: gpuguard's own probes, which are never tenants.
    """
    out: List[GpuOccupancy] = []
    for index, (dev, reading) in enumerate(zip(devices, readings)):
        tenants = tenants_of(host, reading, "before", lambda pid: own.is_own(host, pid))
        reasons: List[str] = []
        if tenants:
            reasons.append("in use by " + ", ".join(describe_tenant(t) for t in tenants))
        util = reading.utilization_percent
        if confirmed is not None and index < len(confirmed):
            later = confirmed[index].utilization_percent
            util = None if util is None or later is None else min(util, later)
        if util is not None and util >= settings.busy_utilization_percent:
            reasons.append(f"utilization {util:.0f}% before the probe started")
        total, free = reading.memory_total_bytes, reading.memory_free_bytes
        if not reading.processes and total is not None and free is not None \
                and total - free >= settings.busy_memory_used_bytes:
            # Processes the library cannot list (another PID namespace, a sandboxed driver) still hold memory.
            reasons.append(f"{(total - free) / (1 << 30):.1f} GiB of device memory in use by processes not listed")
        out.append(GpuOccupancy(smi_index=dev.smi_index, bdf=dev.bdf, uuid=dev.uuid, utilization_percent=util,
                                memory_total_bytes=reading.memory_total_bytes,
                                memory_free_bytes=reading.memory_free_bytes, tenants=tenants,
                                busy=bool(reasons), reasons=reasons))
    return out


def describe_tenant(t: GpuTenant) -> str:
    """``pid 4242 (python3, 71.2 GiB)``; the unresolved-name reason when /proc does not know the pid."""
    parts = [t.name or t.name_unresolved or "name unknown"]
    if t.used_memory_bytes is not None:
        parts.append(f"{t.used_memory_bytes / (1 << 30):.1f} GiB")
    return f"pid {t.pid} ({', '.join(parts)})"


@dataclass(frozen=True)
class Plan:
    """What this check does: run (with an optional budget, judging performance or not), or defer."""

    run: bool
    judge_performance: bool
    device_memory_budget_bytes: Optional[int]
    reason: Optional[str]


def decide(gpus: Sequence[GpuOccupancy], settings: HealthSettings, mode: HealthMode) -> Plan:
    """The plan for this check from the GPUs' occupancy before the probe (pure)."""
    busy = [g for g in gpus if g.busy]
    if not busy:
        if mode == "functional":
            return Plan(True, False, None, "functional mode: performance is not judged")
        return Plan(True, True, None, None)
    named = "; ".join(f"GPU {g.smi_index}: {', '.join(g.reasons)}" for g in busy)
    if mode == "full" or (mode == "auto" and settings.busy_action == "defer"):
        return Plan(False, False, None, f"busy, waiting for idle GPUs ({named})")
    budget = budget_for(busy, settings)
    if budget < settings.busy_min_budget_bytes:
        return Plan(False, False, budget,
                    f"busy and too little free device memory for even the smallest check "
                    f"({budget / (1 << 20):.0f} MiB budget < {settings.busy_min_budget_bytes / (1 << 20):.0f} MiB; "
                    f"{named})")
    return Plan(True, False, budget, f"busy: performance not judged ({named})")


def budget_for(busy: Iterable[GpuOccupancy], settings: HealthSettings) -> int:
    """Bytes per GPU the probe may allocate: a fraction of the least free memory of the busy GPUs, less a reserve.

    A GPU whose free memory the library does not report gets the minimum budget: the smallest functional sizes.
    """
    free = [g.memory_free_bytes for g in busy]
    if any(f is None for f in free):
        return settings.busy_min_budget_bytes
    least = min(f for f in free if f is not None)
    return max(0, int(least * settings.busy_memory_fraction) - settings.busy_memory_reserve_bytes)


def merge_during(report: OccupancyReport, during: Dict[int, List[GpuTenant]]) -> OccupancyReport:
    """The report with the tenants first seen while the probe ran added (such a GPU is busy too)."""
    gpus = []
    for g in report.gpus:
        known = {t.pid for t in g.tenants}
        new = [t for t in during.get(g.smi_index, []) if t.pid not in known]
        if new:
            reasons = [*g.reasons, "used while the probe ran by " + ", ".join(describe_tenant(t) for t in new)]
            g = g.model_copy(update={"tenants": [*g.tenants, *new], "busy": True, "reasons": reasons})
        gpus.append(g)
    return report.model_copy(update={"gpus": gpus})
