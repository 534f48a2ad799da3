"""Run one health check: spawn the probe where the host's ML jobs run, watch the GPUs, judge, compare, record.

    snapshot ─────────────> inventory, pairing ──┐
    SMI sampler thread ───> activity ─────────────┼──> fallback rules ──┐
    probe (timeout) ──────> ProbeResult ──────────┴─────────────────────┴──> classify ──> baseline ──> HealthResult

The probe is an argv list (an interpreter, or a container runtime), never a shell line. Its environment is the
host's plus NCCL_NVLS_ENABLE=0 and the other NVLink-multicast switches, always.
"""

from __future__ import annotations

import datetime as dt
import json
import threading
import time
import uuid
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Tuple

from agent.errors import GpuguardError, InputFileError
from agent.files import write_atomically
from agent.health.activity import ActivitySampler
from agent.health.baseline import (
    BaselineStore,
    choose_reference,
    compare,
    fingerprint_of,
    health_dir,
    metrics_of,
    peer_outliers,
    record_run,
)
from agent.health.classify import classify
from agent.health.fallback import Inventory, Vendor, detect_fallback, merge_inventory
from agent.health.launch import Launcher, ProbeOutcome, launch_probe
from agent.health.model import BaselineComparison, HealthResult, MetricRegression, ProbeResult
from agent.health.parse import parse_probe_output
from agent.health.settings import HealthSettings
from agent.host import Host
from agent.log import get_logger
from agent.snapshot.model import Snapshot
from agent.snapshot.pairing import pairing_of

log = get_logger("health")

PROBE_PATH = Path(__file__).with_name("probe.py")
CONTAINER_PROBE_PATH = "/opt/gpuguard/probe.py"
LAST_RESULT_FILE = "last.json"
SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1",
            "PYTHONUNBUFFERED": "1"}
_STDERR_TAIL_CHARS = 2000


def probe_args(settings: HealthSettings) -> List[str]:
    """The probe's own options: throttle, and a rank deadline that leaves it time to name hung ranks."""
    rank_timeout = max(5.0, settings.timeout_seconds * 0.75)
    return ["--throttle-fraction", repr(settings.throttle_fraction), "--rank-timeout-seconds", f"{rank_timeout:g}",
            *settings.probe_args]


def probe_env(base: Mapping[str, str], settings: HealthSettings) -> Dict[str, str]:
    """The host's environment (the framework needs its PATH, library paths, ROCm/CUDA variables) made safe."""
    env = dict(base)
    env.update(settings.extra_env)
    env.update(SAFE_ENV)
    return env


def container_device_args(runtime: str, vendor: Optional[Vendor]) -> List[str]:
    """What gives a container the host's GPUs: /dev/kfd and /dev/dri on AMD, the NVIDIA toolkit's hook on NVIDIA."""
    if vendor == "amd":
        return ["--device=/dev/kfd", "--device=/dev/dri", "--group-add=video", "--ipc=host"]
    if vendor == "nvidia":
        return ["--device=nvidia.com/gpu=all" if runtime == "podman" else "--gpus=all", "--ipc=host"]
    return []


def build_probe_argv(settings: HealthSettings, probe_path: Path, vendor: Optional[Vendor],
                     container_name: str) -> List[str]:
    """The probe's argv: ``python probe.py ...``, or ``docker run ... IMAGE python /opt/gpuguard/probe.py ...``."""
    args = probe_args(settings)
    if settings.container_image is None:
        return [settings.python, str(probe_path), *args]
    env_args: List[str] = []
    for key, value in sorted({**settings.extra_env, **SAFE_ENV}.items()):
        env_args += ["-e", f"{key}={value}"]
    return [settings.container_runtime, "run", "--rm", "--name", container_name,
            *container_device_args(settings.container_runtime, vendor),
            "-v", f"{probe_path}:{CONTAINER_PROBE_PATH}:ro", *env_args, *settings.container_args,
            settings.container_image, settings.container_python, CONTAINER_PROBE_PATH, *args]


def snapshot_inventory(snapshot: Optional[Snapshot]) -> Tuple[Optional[Vendor], int]:
    """(vendor, GPU count) from the snapshot's amdgpu and nvidia sections."""
    if snapshot is None:
        return None, 0
    amd = len(snapshot.amdgpu.data.gpus) if snapshot.amdgpu.data else 0
    nv = len(snapshot.nvidia.data.gpus) if snapshot.nvidia.data else 0
    vendor: Optional[Vendor] = "amd" if amd and not nv else ("nvidia" if nv and not amd else None)
    return vendor, amd + nv


def run_health_check(host: Host, settings: HealthSettings, state_dir: str, snapshot: Optional[Snapshot] = None,
                     launcher: Launcher = launch_probe, probe_path: Path = PROBE_PATH) -> HealthResult:
    """One whole health check; every outcome of the probe is a HealthResult, never an exception."""
    started = time.monotonic()
    started_at = host.clock()
    background: Optional[_SnapshotThenSampler] = None
    if snapshot is None and settings.container_image is None:
        # The probe's argv does not depend on the snapshot here: start the probe first and take the snapshot (then
        # start the activity sampler) while it imports its framework, seconds that the snapshot would otherwise add.
        background = _SnapshotThenSampler(host, settings)
        background.start()
    elif snapshot is None:
        from agent.snapshot.take import take_snapshot

        snapshot = take_snapshot(host)
    vendor, snapshot_count = snapshot_inventory(snapshot) if snapshot is not None else (None, 0)
    container_name = f"gpuguard-probe-{uuid.uuid4().hex[:12]}"
    argv = build_probe_argv(settings, probe_path, vendor, container_name)

    def stop_container() -> None:
        if settings.container_image is None:
            return
        try:
            host.run([settings.container_runtime, "kill", container_name], timeout_seconds=15)
        except GpuguardError as exc:
            log.warning("health_container_kill_failed", container=container_name, error=str(exc))

    sampler: Optional[ActivitySampler] = None
    if background is None:
        sampler = ActivitySampler(host.load_module, vendor, settings.activity_interval_seconds)
        sampler.start()
    log.info("health_probe_started", argv=argv, timeout_seconds=settings.timeout_seconds)
    try:
        outcome = launcher(argv, probe_env(host.env, settings), settings.timeout_seconds, stop_container)
    finally:
        if background is not None:
            snapshot, sampler = background.join()  # re-raises what the snapshot raised
            vendor, snapshot_count = snapshot_inventory(snapshot)
        assert sampler is not None
        activity = sampler.stop()
    assert snapshot is not None  # given, taken before the probe, or taken beside it (joined above)
    log.info("health_probe_finished", returncode=outcome.returncode, timed_out=outcome.timed_out,
             wall_seconds=round(outcome.wall_seconds, 3))
    parsed = None if outcome.timed_out or outcome.start_error else parse_probe_output(outcome.stdout)
    probe = parsed if isinstance(parsed, ProbeResult) else None
    inventory = merge_inventory(vendor, snapshot_count, activity, settings.expected_gpu_count)
    judgeable = probe is not None and probe.skipped_reason is None and not (
        probe.framework is not None and probe.framework.import_error)
    fallback = detect_fallback(probe, inventory, activity, settings) if judgeable and probe else []
    fingerprint = fingerprint_of(pairing_of(snapshot), probe)

    regressions: List[MetricRegression] = []
    comparison: Optional[BaselineComparison] = None
    if probe is not None and classify(outcome, parsed, fallback, []).status == "pass":
        regressions, comparison = _judge_against_baselines(probe, fingerprint, settings, state_dir, started_at)
    verdict = classify(outcome, parsed, fallback, regressions)
    result = HealthResult(
        status=verdict.status, summary=verdict.summary, started_at=started_at,
        wall_seconds=round(time.monotonic() - started, 3), probe_wall_seconds=round(outcome.wall_seconds, 3),
        probe_argv=list(argv), probe_exit_code=outcome.returncode,
        probe_stderr_tail=outcome.stderr[-_STDERR_TAIL_CHARS:] or None, fingerprint=fingerprint,
        fingerprint_id=fingerprint.id, inventory_gpu_count=inventory.gpu_count, probe=probe, activity=activity,
        fallback_reasons=fallback, failures=verdict.failures, regressions=regressions, baseline=comparison)
    _save_last(state_dir, result)
    _log_result(result, inventory)
    return result


class _SnapshotThenSampler:
    """On a thread: take the snapshot, then start the activity sampler for the vendor it found."""

    def __init__(self, host: Host, settings: HealthSettings) -> None:
        self.host, self.settings = host, settings
        self.snapshot: Optional[Snapshot] = None
        self.sampler: Optional[ActivitySampler] = None
        self.error: Optional[BaseException] = None
        self._thread = threading.Thread(target=self._run, name="gpuguard-health-snapshot", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        from agent.snapshot.take import take_snapshot

        try:
            self.snapshot = take_snapshot(self.host)
            vendor, _ = snapshot_inventory(self.snapshot)
            self.sampler = ActivitySampler(self.host.load_module, vendor, self.settings.activity_interval_seconds)
            self.sampler.start()
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread by join()
            self.error = exc

    def join(self) -> Tuple[Snapshot, ActivitySampler]:
        self._thread.join()
        if self.error is not None:
            if self.sampler is not None:
                self.sampler.stop()
            raise self.error
        assert self.snapshot is not None and self.sampler is not None
        return self.snapshot, self.sampler


def _judge_against_baselines(probe: ProbeResult, fingerprint, settings: HealthSettings, state_dir: str,
                             now: dt.datetime) -> Tuple[List[MetricRegression], BaselineComparison]:
    metrics = metrics_of(probe)
    store = BaselineStore(health_dir(state_dir))
    try:
        with store.locked():
            data = store.load()
            reference = choose_reference(data, fingerprint.id)
            regressions: List[MetricRegression] = []
            bands: Dict[str, float] = {}
            if reference is not None:
                regressions, bands = compare(metrics, reference[0], reference[1], settings)
            regressions += peer_outliers(probe, settings)
            # A throttled run is a test of the alarm, never a sample of the stack's real speed.
            good = not regressions and probe.throttle_fraction == 0
            data, joined = record_run(data, fingerprint, metrics, good, now, settings.baseline_runs)
            store.save(data)
    except OSError as exc:
        raise InputFileError(str(store.path), exc.strerror or str(exc)) from None
    own = data.records[fingerprint.id]
    comparison = BaselineComparison(
        fingerprint_id=fingerprint.id, reference_fingerprint_id=reference[0] if reference else None,
        reference_runs=len(reference[1].runs) if reference else 0, own_runs=len(own.runs),
        runs_needed=settings.baseline_runs, established=own.established_at is not None, recorded=joined,
        noise_band_fraction=bands)
    return regressions, comparison


def _save_last(state_dir: str, result: HealthResult) -> None:
    path = health_dir(state_dir) / LAST_RESULT_FILE
    try:
        write_atomically(str(path), result.to_json())
    except OSError as exc:
        raise InputFileError(str(path), exc.strerror or str(exc)) from None


def _log_result(result: HealthResult, inventory: Inventory) -> None:
    log.info("health_check_done", status=result.status, summary=result.summary, wall_seconds=result.wall_seconds,
             fingerprint=result.fingerprint_id, inventory_gpus=inventory.gpu_count)
    for reason in result.fallback_reasons:
        log.warning("health_cpu_fallback", code=reason.code, gpu=reason.gpu, message=reason.message)
    for reg in result.regressions:
        log.warning("health_regression", metric=reg.metric, gpu=reg.gpu, against=reg.against,
                    drop_fraction=reg.drop_fraction, threshold_fraction=reg.threshold_fraction)


def load_last_result(state_dir: str) -> Optional[HealthResult]:
    """The last check's result from the state directory, or None when there is none yet."""
    path = health_dir(state_dir) / LAST_RESULT_FILE
    try:
        return HealthResult.model_validate(json.loads(path.read_text(encoding="utf-8")))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise InputFileError(str(path), f"unreadable health result: {exc}") from None


__all__ = ["run_health_check", "build_probe_argv", "probe_env", "load_last_result", "PROBE_PATH", "ProbeOutcome"]
