"""Health-check settings: the ``[health]`` section of /etc/gpuguard/agent.toml."""

from __future__ import annotations

from typing import Dict, List, Literal, Optional

from pydantic import Field, model_validator

from agent.models import FrozenModel


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
    activity_interval_seconds: float = Field(0.02, gt=0, le=5)
    # A GPU whose SMI activity never reached this (and never rose above its idle reading) did no work.
    activity_min_percent: float = Field(10.0, ge=0, le=100)
    # Floors below which a figure cannot come from any data-center GPU: far under every current part's rate.
    min_gemm_tflops: float = Field(5.0, ge=0)
    min_copy_gbps: float = Field(150.0, ge=0)
    # How many GPUs the framework must see; None: as many as the snapshot and the SMI library report.
    expected_gpu_count: Optional[int] = Field(None, ge=0)
    # False only on a CPU-only development box or in tests: a CPU run is then judged like a GPU run.
    require_accelerator: bool = True

    @model_validator(mode="after")
    def _one_way_to_run(self) -> "HealthSettings":
        if self.container_image is not None and not self.container_image.strip():
            raise ValueError("container_image must not be empty (leave it out to use the python interpreter)")
        return self
