"""Health-check models: what the probe reports (per GPU, by device index), and what the agent concludes.

The probe's JSON is validated into ``ProbeResult`` (unknown fields rejected, so probe and agent cannot drift
apart silently). Figures carry their unit in their name: ``gemm_bf16_tflops`` (10^12 multiply-adds x 2 per
second), ``copy_bandwidth_gbps`` (10^9 bytes read plus written per second), ``bus_bandwidth_gbps`` (nccl-tests'
bus bandwidth of an all-reduce).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from typing import Annotated, Any, Dict, List, Literal, Optional

from pydantic import ConfigDict, Field

from agent.health.settings import HealthMode
from agent.models import FrozenModel

HealthStatus = Literal["pass", "regression", "cpu_fallback", "failed", "timeout", "skipped", "busy", "deferred"]
# Distinct exit codes, so a systemd unit or a script can tell the outcomes apart; 1-10 are gpuguard's errors.
# busy: the functional checks ran and passed on a GPU another job was using, its speed was not judged;
# deferred: nothing could run without risk to that job (too little free device memory, or configured to wait).
STATUS_EXIT_CODES: Dict[str, int] = {"pass": 0, "regression": 20, "cpu_fallback": 21, "failed": 22,
                                     "timeout": 23, "skipped": 24, "busy": 25, "deferred": 26}
# The stand-alone scripts' wire (agent/health/probe.py, workload_shim.py: they import nothing from the agent and
# carry their own copies, which tests/health/test_standalone_constants.py holds equal to these).
RESULT_MARKER = "GPUGUARD_PROBE_RESULT "
WORKLOAD_REPORT_MARKER = "GPUGUARD_WORKLOAD_REPORT "
WORKLOAD_NONCE_ENV = "GPUGUARD_WORKLOAD_NONCE"

# Bounds on what the probe may say: it runs the host's ML stack and is not trusted. A real result for eight GPUs is
# far inside them; a figure above FIGURE_MAX is no device's (an H200's dense bf16 GEMM is about 1,000 TFLOP/s, its
# device copy about 9,000 GB/s) and would only poison the baseline it is recorded into.
PROBE_TEXT_MAX_CHARS = 4096
PROBE_ITEMS_MAX = 1024
FIGURE_MAX = 1e7
Figure = Annotated[float, Field(ge=0, le=FIGURE_MAX)]
DeviceIndex = Annotated[int, Field(ge=0, lt=PROBE_ITEMS_MAX)]


def _items(default: Any) -> Any:
    """A list or mapping field of at most PROBE_ITEMS_MAX items."""
    return Field(default=default, max_length=PROBE_ITEMS_MAX)


def _short_id(model: FrozenModel) -> str:
    """A short stable id of a baseline's key (Fingerprint, WorkloadStack): sha256 of its canonical JSON, 16 hex
    digits."""
    canonical = json.dumps(model.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:16]


class ProbeModel(FrozenModel):
    """A part of the probe's result: every string at most PROBE_TEXT_MAX_CHARS long."""

    model_config = ConfigDict(str_max_length=PROBE_TEXT_MAX_CHARS)


class ProbeFramework(ProbeModel):
    """The ML framework the probe imported, and what it was built for."""

    name: str
    version: Optional[str] = None
    build: Optional[Literal["cuda", "rocm", "cpu"]] = None
    cuda: Optional[str] = None
    hip: Optional[str] = None
    nccl: Optional[str] = None
    import_error: Optional[str] = None


class ProbeDevice(ProbeModel):
    """One device as the framework enumerates it."""

    index: DeviceIndex
    name: Optional[str] = None
    memory_total_bytes: Optional[int] = None
    uuid: Optional[str] = None
    pci_bus_id: Optional[str] = None
    capability: Optional[str] = None
    multiprocessors: Optional[int] = None
    gcn_arch: Optional[str] = None


class GpuFigures(ProbeModel):
    """Every figure and check of one device (a GPU index, or the CPU when the framework saw no GPU)."""

    index: DeviceIndex
    device: str
    name: Optional[str] = None
    gemm_dtype: Literal["bf16", "fp16"]
    gemm_size: Optional[int] = None
    gemm_bf16_tflops: Optional[Figure] = None
    gemm_fp16_tflops: Optional[Figure] = None
    gemm_batch_spread_fraction: Optional[float] = None
    gemm_reference_rel_error: Optional[float] = None
    gemm_reference_ok: Optional[bool] = None
    copy_bytes: Optional[int] = None
    copy_bandwidth_gbps: Optional[Figure] = None
    copy_batch_spread_fraction: Optional[float] = None
    copy_verified: Optional[bool] = None
    train_steps: Optional[int] = None
    train_first_step_seconds: Optional[float] = None
    train_step_seconds: Optional[float] = None
    train_loss_first: Optional[float] = None
    train_loss_last: Optional[float] = None
    train_ok: Optional[bool] = None
    checkpoint_bytes: Optional[int] = None
    checkpoint_seconds: Optional[float] = None
    checkpoint_ok: Optional[bool] = None
    device_memory_peak_bytes: Optional[int] = None
    step_seconds: Dict[str, float] = _items({})
    seconds: Optional[float] = None
    errors: List[str] = _items([])

    @property
    def gemm_tflops(self) -> Optional[float]:
        """The GEMM figure in whichever low precision the device ran (bf16, else fp16)."""
        return self.gemm_bf16_tflops if self.gemm_dtype == "bf16" else self.gemm_fp16_tflops


class CollectiveRank(ProbeModel):
    """How one rank of the all-reduce ended."""

    rank: DeviceIndex
    status: Literal["ok", "failed", "aborted", "timeout"]
    error: Optional[str] = None
    bus_bandwidth_gbps: Optional[Figure] = None


class CollectiveResult(ProbeModel):
    """The all-reduce across the host's GPUs: a correct sum, and its bus bandwidth (the slowest rank's view)."""

    backend: Optional[str] = None
    world_size: Annotated[int, Field(ge=0, le=PROBE_ITEMS_MAX)]
    bytes: int
    sum_correct: Optional[bool] = None
    bus_bandwidth_gbps: Optional[Figure] = None
    ranks: List[CollectiveRank] = _items([])


class ProbeResult(ProbeModel):
    """The probe's one JSON line."""

    probe_schema_version: Literal[1]
    python: str
    framework: Optional[ProbeFramework] = None
    skipped_reason: Optional[str] = None
    accelerator_available: bool = False
    device_count: Annotated[int, Field(ge=0, le=PROBE_ITEMS_MAX)] = 0
    devices: List[ProbeDevice] = _items([])
    ran_on: Optional[Literal["gpu", "cpu"]] = None
    gpus: List[GpuFigures] = _items([])
    collective: Optional[CollectiveResult] = None
    phase_seconds: Dict[str, float] = _items({})
    throttle_fraction: float = 0.0
    # Set when the agent gave the probe a device-memory budget (bytes per GPU): the work was sized to fit in it.
    device_memory_budget_bytes: Optional[int] = None
    # Who the probe ran as (os.getuid() etc. inside the probe), so the report shows the privilege drop held.
    uid: Optional[int] = None
    gid: Optional[int] = None
    groups: List[int] = _items([])
    errors: List[str] = _items([])


class Fingerprint(FrozenModel):
    """What a baseline belongs to: GPU model, driver, ROCm/CUDA, kernel and framework versions."""

    gpu_models: str = ""
    driver: Optional[str] = None
    gpu_stack: Optional[str] = None
    kernel: Optional[str] = None
    framework: Optional[str] = None
    framework_build: Optional[str] = None

    @property
    def id(self) -> str:
        """A short stable id (:func:`_short_id`)."""
        return _short_id(self)

    def describe(self) -> str:
        parts = [self.gpu_models or "no GPU model", f"driver {self.driver or '?'}", self.gpu_stack or "no ROCm/CUDA",
                 f"kernel {self.kernel or '?'}", self.framework or "no framework"]
        return " | ".join(parts)


class GpuActivity(FrozenModel):
    """One GPU's SMI activity counter (GFX activity / NVML utilization, percent) around the probe run."""

    smi_index: int
    bdf: Optional[str] = None
    uuid: Optional[str] = None
    idle_percent: Optional[float] = None
    max_percent: Optional[float] = None
    samples: int = 0
    # Device memory in use as the SMI library reports it (NVML total - free, amdsmi's VRAM used), in bytes: the
    # reading before the probe started (other tenants), the lowest and highest during the run, and how many readings
    # the run had (the one before not counted). Absent in results recorded before issue 39's memory rule.
    memory_before_bytes: Optional[int] = None
    memory_low_bytes: Optional[int] = None
    memory_peak_bytes: Optional[int] = None
    memory_samples: int = 0


class ActivityReport(FrozenModel):
    """What the agent's SMI sampler saw while the probe ran."""

    library: Optional[Literal["pynvml", "amdsmi"]] = None
    unavailable_reason: Optional[str] = None
    interval_seconds: float = 0.0
    read_errors: int = 0
    # The longest time between two consecutive readings (the one before the probe included): a peak held for less
    # could fall between them. None with fewer than two readings.
    max_gap_seconds: Optional[float] = None
    gpus: List[GpuActivity] = []


FallbackCode = Literal["cpu_only_build", "wrong_vendor_build", "fewer_gpus_than_inventory", "ran_on_cpu",
                       "smi_activity_flat", "implausible_throughput"]


class FallbackReason(FrozenModel):
    """One piece of evidence that the workload did not really run on the GPU."""

    code: FallbackCode
    message: str
    gpu: Optional[int] = None


# Why root does not believe a probe's result (agent/health/corroborate.py, in the order its rules run).
DisagreementKind = Literal["more_gpus_than_host", "duplicate_gpu", "unlisted_index", "unknown_device",
                           "impossible_time", "impossible_figure", "above_peak", "memory_unseen"]


class ProbeDisagreement(FrozenModel):
    """One claim of the probe's that what root saw itself contradicts; ``kind`` decides, ``message`` is for people."""

    kind: DisagreementKind
    message: str
    gpu: Optional[int] = None


class Corroboration(FrozenModel):
    """What root held the probe's claims against: its own inventory, identities and the SKUs' datasheet peaks."""

    # The GPUs root enumerated itself (None: it enumerated none, so the count was not checked) and from where.
    inventory_gpu_count: Optional[int] = None
    inventory_sources: List[str] = []
    # One line per check that held, and per claim that could not be checked (and why); for people.
    checked: List[str] = []
    unverified: List[str] = []
    disagreements: List[ProbeDisagreement] = []


class MetricRegression(FrozenModel):
    """A figure that dropped beyond its noise band, against a baseline or against the host's other GPUs."""

    metric: str
    gpu: Optional[int] = None
    against: Literal["baseline", "peers"]
    baseline_value: float
    current_value: float
    drop_fraction: float
    threshold_fraction: float
    baseline_fingerprint: Optional[str] = None


class BaselineComparison(FrozenModel):
    """Which baseline this run was held against, and how far along this fingerprint's own baseline is."""

    fingerprint_id: str
    reference_fingerprint_id: Optional[str] = None
    reference_runs: int = 0
    own_runs: int = 0
    runs_needed: int = 0
    established: bool = False
    recorded: bool = False
    noise_band_fraction: Dict[str, float] = {}
    # Whether root believed the run enough to let it feed the baseline (runner.corroborated), and why it did not
    # join when it did not; the rule that moved the baseline on this run (baseline.py), if any.
    corroborated: bool = False
    refused: List[str] = []
    moved: Optional[Literal["first_runs", "relearned", "drift", "reset"]] = None
    # The SKU whose physical limits bounded the figures (agent/health/sku_limits.py), and the stored baselines
    # beyond them (never compared with).
    sku_limits: Optional[str] = None
    suspicious: List[str] = []


class GpuTenant(FrozenModel):
    """A process other than the probe that holds a GPU context, as the SMI library lists it."""

    pid: int
    # From /proc/<pid>/comm (the SMI library's name where /proc does not resolve it); None when neither tells.
    name: Optional[str] = None
    # Why the name is missing: a pid from another PID namespace (a container) is not in this /proc.
    name_unresolved: Optional[str] = None
    used_memory_bytes: Optional[int] = None
    seen: Literal["before", "during"] = "before"


class GpuOccupancy(FrozenModel):
    """One GPU's other users before (and while) the probe ran, and its device memory before the probe."""

    smi_index: int
    bdf: Optional[str] = None
    uuid: Optional[str] = None
    utilization_percent: Optional[float] = None
    memory_total_bytes: Optional[int] = None
    memory_free_bytes: Optional[int] = None
    tenants: List[GpuTenant] = []
    busy: bool = False
    reasons: List[str] = []


class OccupancyReport(FrozenModel):
    """What the agent saw of other jobs on the GPUs, and what it decided about the run."""

    library: Optional[Literal["pynvml", "amdsmi"]] = None
    unavailable_reason: Optional[str] = None
    mode: HealthMode = "auto"
    gpus: List[GpuOccupancy] = []
    # The device-memory budget given to the probe (bytes per GPU); None: the full, idle-GPU workload.
    device_memory_budget_bytes: Optional[int] = None
    # Why the performance figures were not judged (a busy GPU, functional mode); None when they were.
    performance_not_judged: Optional[str] = None

    @property
    def busy_gpus(self) -> List[GpuOccupancy]:
        return [g for g in self.gpus if g.busy]


class SandboxReport(FrozenModel):
    """Who the probe ran as and which limits held it."""

    user: str
    uid: int
    gid: int
    groups: List[int] = []
    dropped: bool = False
    home: Optional[str] = None
    # "cgroup <path> memory.max=N", "rss watchdog N bytes", or "none: <why>".
    memory_limit: str = "none"
    rlimits: Dict[str, int] = {}
    notes: List[str] = []
    # Set when the memory limit ended the probe.
    killed_for_memory: Optional[str] = None
    # How the probe's whole tree was held (reaper.py): "pid-namespace", "subreaper" or "process-group".
    containment: Optional[str] = None
    # The process limits over the whole tree: RLIMIT_NPROC (a dropped user), the watchdog's count.
    process_limit: str = "none"
    # What bounded its writes: "tmpfs N bytes (...)" or "directory checked by the watchdog, N bytes, ...".
    home_limit: str = "none"
    # Set when the watchdog ended the probe for its processes or its home's size.
    killed_for_limit: Optional[str] = None


# --- registered workloads (agent/health/workloads.py) ------------------------------------------------------------

WorkloadStatus = Literal["pass", "regression", "cpu_fallback", "failed", "timeout", "busy", "deferred"]


class OpCount(FrozenModel):
    """How often one operator ran on one device type."""

    op: str = Field(max_length=200)
    device: str = Field(max_length=32)
    calls: int = Field(ge=0)


class FallbackOp(FrozenModel):
    """An operator that computed on the host from data that came from the accelerator."""

    op: str = Field(max_length=200)
    calls: int = Field(ge=1)


class UnsupportedOp(FrozenModel):
    """An operator that raised "not implemented" for the accelerator."""

    op: str = Field(max_length=200)
    error: str = Field(max_length=400)


class ShimTorch(FrozenModel):
    """The framework the workload ran with, as the shim saw it after the run."""

    version: Optional[str] = Field(None, max_length=100)
    hip: Optional[str] = Field(None, max_length=100)
    cuda: Optional[str] = Field(None, max_length=100)
    device_count: int = Field(0, ge=0, le=1024)
    peak_device_memory_bytes: Optional[int] = Field(None, ge=0)
    error: Optional[str] = Field(None, max_length=400)


class ShimEnded(FrozenModel):
    """How the workload's code ended inside the shim."""

    kind: Literal["returned", "system_exit", "exception"]
    code: int
    error: Optional[str] = Field(None, max_length=400)
    traceback: Optional[str] = Field(None, max_length=4000)


class ShimReport(FrozenModel):
    """The shim's ``GPUGUARD_WORKLOAD_REPORT`` line (agent/health/workload_shim.py)."""

    shim_schema_version: Literal[1]
    nonce: str = Field(max_length=64)
    python: str = Field(max_length=40)
    instrumented: bool
    instrument_error: Optional[str] = Field(None, max_length=400)
    torch: Optional[ShimTorch] = None
    ended: ShimEnded
    wall_seconds: float = Field(ge=0)
    ops: List[OpCount] = Field([], max_length=4000)
    ops_truncated: bool = False
    fallback_ops: List[FallbackOp] = Field([], max_length=2000)
    unsupported_ops: List[UnsupportedOp] = Field([], max_length=2000)

    def calls_on(self, device: str) -> int:
        return sum(row.calls for row in self.ops if row.device == device)


class WorkloadStack(FrozenModel):
    """What a workload's baseline belongs to: the host's GPU stack and the workload's own framework and image."""

    gpu_models: str = ""
    driver: Optional[str] = None
    gpu_stack: Optional[str] = None
    framework: Optional[str] = None
    image: Optional[str] = None

    @property
    def id(self) -> str:
        """A short stable id (:func:`_short_id`)."""
        return _short_id(self)

    def describe(self) -> str:
        parts = [f"driver {self.driver or '?'}", self.gpu_stack or "no ROCm/CUDA", self.framework or "no framework"]
        if self.image:
            parts.append(f"image {self.image}")
        return ", ".join(parts)


class WorkloadResult(FrozenModel):
    """One registered workload's run and its verdict."""

    name: str
    status: WorkloadStatus
    summary: str
    gates: bool
    wall_seconds: float
    exit_code: Optional[int] = None
    metrics: Dict[str, float] = {}
    stack: Optional[WorkloadStack] = None
    stack_id: Optional[str] = None
    fallback_ops: List[FallbackOp] = []
    unsupported_ops: List[UnsupportedOp] = []
    accelerator_calls: int = 0
    host_calls: int = 0
    instrumented: bool = False
    failures: List[str] = []
    regressions: List[MetricRegression] = []
    baseline_runs: int = 0
    stderr_tail: Optional[str] = None


class HealthResult(FrozenModel):
    """The outcome of one health check."""

    status: HealthStatus
    summary: str
    started_at: dt.datetime
    wall_seconds: float
    probe_wall_seconds: Optional[float] = None
    probe_argv: List[str] = []
    probe_exit_code: Optional[int] = None
    probe_stderr_tail: Optional[str] = None
    fingerprint: Optional[Fingerprint] = None
    fingerprint_id: Optional[str] = None
    inventory_gpu_count: int = 0
    probe: Optional[ProbeResult] = None
    activity: Optional[ActivityReport] = None
    fallback_reasons: List[FallbackReason] = []
    corroboration: Optional[Corroboration] = None
    failures: List[str] = []
    regressions: List[MetricRegression] = []
    baseline: Optional[BaselineComparison] = None
    occupancy: Optional[OccupancyReport] = None
    sandbox: Optional[SandboxReport] = None
    # The team's registered workloads, run after the probe (agent/health/workloads.py); a gating one that failed
    # set the check's status.
    workloads: List[WorkloadResult] = []

    @property
    def exit_code(self) -> int:
        return STATUS_EXIT_CODES[self.status]

    def to_json(self, indent: Optional[int] = 2) -> str:
        return json.dumps(self.model_dump(mode="json"), sort_keys=True, indent=indent) + "\n"

