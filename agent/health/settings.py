"""Health-check settings: the ``[health]`` section of /etc/gpuguard/agent.toml."""

from __future__ import annotations

from typing import Dict, List, Literal, Optional

from pydantic import Field, model_validator

from agent.health.workload_settings import WorkloadSettings, unique_names
from agent.models import FrozenModel

GIB = 1 << 30
MIB = 1 << 20
DEFAULT_PROBE_USER = "gpuguard-probe"
# auto: judge performance on idle GPUs; functional: never judge it; full: it must be judged (docs/health.md).
HealthMode = Literal["auto", "functional", "full"]


class HealthSettings(FrozenModel):
    """How to run the probe, how long to wait for it, and how to judge its figures.

    The probe runs under the interpreter (``python``) or container image (``container_image``) that the host's ML
    jobs use, never the agent's own: the point is to prove *their* stack computes on the GPU.
    """

    python: str = "python3"
    container_image: Optional[str] = None
    container_runtime: Literal["docker", "podman"] = "docker"
    # Inserted before the image name, after the device flags gpuguard adds for the host's GPU vendor.
    container_args: List[str] = []
    container_python: str = "python3"
    timeout_seconds: float = Field(120.0, gt=0, le=3600)
    # Extra arguments for the probe (e.g. ["--max-gpus", "4"]); tests use ["--size", "small"].
    probe_args: List[str] = []
    extra_env: Dict[str, str] = {}
    throttle_fraction: float = Field(0.0, ge=0.0, lt=1.0)
    noise_band_fraction: float = Field(0.10, gt=0.0, lt=1.0)
    # The noise band is never tighter than this many times the baseline's measured run-to-run spread.
    spread_multiplier: float = Field(3.0, ge=0.0)
    baseline_runs: int = Field(5, ge=1, le=100)
    # A GPU slower than the mean of the host's other GPUs of its model by more than this is named (as DCGM does).
    peer_tolerance_fraction: float = Field(0.10, gt=0.0, lt=1.0)
    activity_interval_seconds: float = Field(0.02, gt=0, le=5)
    # A GPU whose SMI activity never reached this (and never rose above its idle reading) did no work.
    activity_min_percent: float = Field(10.0, ge=0, le=100)
    # Floors below which a figure cannot come from any data-center GPU: far under every current part's rate.
    min_gemm_tflops: float = Field(5.0, ge=0)
    min_copy_gbps: float = Field(150.0, ge=0)
    # How many GPUs the framework must see; None: as many as the snapshot and the SMI library report.
    expected_gpu_count: Optional[int] = Field(None, ge=0)
    # False only on a CPU-only development box or in tests: a CPU run is then judged like a GPU run (and a host
    # without GPUs is checked on its CPU, not skipped: agent/health/presence.py).
    require_accelerator: bool = True

    # How long a check waits for another one to finish (the daemon's and `gpuguard health run` never run together;
    # docs/health.md "One check at a time"); still running then, this check is deferred.
    check_lock_wait_seconds: float = Field(600.0, ge=0, le=7200)

    # --- other jobs on the GPUs (docs/health.md "Busy GPUs") ---
    # auto: judge performance on idle GPUs; on a busy GPU run the functional checks only (status busy).
    # functional: never judge performance (the daemon's check right after a package change).
    # full: performance must be judged: a busy GPU defers the whole check (status deferred).
    mode: HealthMode = "auto"
    # A GPU whose utilization is at least this before the probe starts is busy, even with no process listed.
    busy_utilization_percent: float = Field(5.0, ge=0, le=100)
    # ... when a second reading this much later says so too: NVML and amdsmi report utilization averaged over their
    # last sample period (up to a second), so a job that has just ended still reads 100% for a moment.
    busy_utilization_confirm_seconds: float = Field(1.5, ge=0, le=30)
    # ... or whose used device memory is at least this with no process listed (idle: the driver's few hundred MiB).
    busy_memory_used_bytes: int = Field(2 * GIB, ge=0)
    # What to do on a busy GPU in auto mode: run the functional checks in its free memory, or wait.
    busy_action: Literal["functional", "defer"] = "functional"
    # On a busy GPU the probe may allocate this fraction of the free device memory, less the reserve below.
    busy_memory_fraction: float = Field(0.5, gt=0, le=0.9)
    # Kept out of the budget for the probe's own CUDA/HIP context (about 0.5 GiB on an H200).
    busy_memory_reserve_bytes: int = Field(GIB, ge=0)
    # Below this budget not even the smallest functional check fits: the check is deferred.
    busy_min_budget_bytes: int = Field(256 * MIB, ge=16 * MIB)
    # The daemon retries a busy/deferred check with mode full after this, doubling up to the max, for this long;
    # then it reports health_deferred and keeps its normal interval (docs/health.md "Deferral").
    defer_window_seconds: float = Field(6 * 3600.0, gt=0)
    defer_first_retry_seconds: float = Field(300.0, gt=0)
    defer_max_retry_seconds: float = Field(3600.0, gt=0)

    # --- who the probe runs as, and its limits (docs/health.md "The probe's user and limits") ---
    # A system user with only GPU device access (the packages create gpuguard-probe in groups video and render).
    # "root" keeps root, with a warning; when the agent itself is not root the probe runs as the agent's user.
    run_as: str = DEFAULT_PROBE_USER
    # Host memory of the probe and its children: a cgroup v2 memory.max where the agent can create one, else an
    # RSS watchdog that kills the probe's process group. Not RLIMIT_AS: CUDA and ROCm reserve terabytes of
    # virtual address space and fail under it.
    memory_max_bytes: int = Field(32 * GIB, ge=64 * MIB)
    cpu_seconds_max: int = Field(7200, ge=1)
    open_files_max: int = Field(4096, ge=64)
    # Processes and threads of the probe's user (RLIMIT_NPROC, a dropped user only), and processes below the probe's
    # supervisor (the watchdog, any user).
    processes_max: int = Field(4096, ge=16)
    # What the probe may write in its per-run home and TMPDIR (a tmpfs of this size in its own mounts, else a
    # directory the watchdog checks), and RLIMIT_FSIZE for each file anywhere.
    home_max_bytes: int = Field(GIB, ge=MIB)
    # Directories put first on the probe's sys.path (what PYTHONPATH did: the interpreter starts isolated, -I, and
    # ignores every PYTHON* variable). Absolute paths, read as the probe's user.
    python_path: List[str] = []
    # The team's own workloads, run after the built-in probe under the same user, limits and watch
    # (docs/health.md "Your workloads").
    workloads: List[WorkloadSettings] = []

    @model_validator(mode="after")
    def _one_way_to_run(self) -> "HealthSettings":
        if self.container_image is not None and not self.container_image.strip():
            raise ValueError("container_image must not be empty (leave it out to use the python interpreter)")
        if not self.run_as.strip() or any(c in self.run_as for c in ":/ \t\n"):
            raise ValueError(f"run_as must be a user name or a numeric uid, not {self.run_as!r}")
        python_vars = sorted(k for k in self.extra_env if k.upper().startswith("PYTHON"))
        if python_vars and self.container_image is None:
            raise ValueError(f"extra_env: {', '.join(python_vars)} would be ignored: the probe's interpreter starts "
                             "isolated (-I); put directories in [health] python_path instead")
        twice = unique_names(self.workloads)
        if twice is not None:
            raise ValueError(f"workloads: the name {twice!r} is given twice")
        relative = [p for p in self.python_path if not p.startswith("/")]
        if relative:
            raise ValueError(f"python_path: {relative[0]!r} is not an absolute path")
        return self
