"""Baselines: the first good runs on a fingerprint become its baseline; later runs are held against it.

A run is compared with its own fingerprint's baseline once that is established, else with the most recently
seen other fingerprint's (the stack before the change). A figure regresses when it drops by more than its noise
band: the configured fraction, but never tighter than ``spread_multiplier`` times the baseline's run-to-run spread
((max - min) / median of its runs). The store is one JSON file under the state directory, written atomically
under an exclusive lock so a scheduled and a manual check cannot interleave.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import json
import os
import statistics
from pathlib import Path
from typing import Collection, Dict, Iterator, List, Literal, Optional, Tuple

from pydantic import ValidationError

from agent.errors import InputFileError
from agent.files import FileMissing, decode_text, open_append_regular, read_bytes_bounded, write_atomically
from agent.health.model import Fingerprint, MetricRegression, ProbeResult
from agent.health.settings import HealthSettings
from agent.models import FrozenModel, first_validation_problem
from agent.snapshot.pairing import Pairing

# Figures compared with baselines: higher is better for each. Training-step times are dominated by first-call
# initialisation and are reported, not judged.
GPU_METRICS = ("gemm_bf16_tflops", "gemm_fp16_tflops", "copy_bandwidth_gbps")
COLLECTIVE_METRICS = ("bus_bandwidth_gbps",)


class BaselineRun(FrozenModel):
    """The figures of one good run."""

    at: dt.datetime
    metrics: Dict[str, float]


class FingerprintRecord(FrozenModel):
    """One fingerprint's baseline runs; frozen once ``established_at`` is set."""

    fingerprint: Fingerprint
    first_seen: dt.datetime
    last_seen: dt.datetime
    runs: List[BaselineRun] = []
    established_at: Optional[dt.datetime] = None


class BaselineFile(FrozenModel):
    """Everything in baselines.json."""

    schema_version: Literal[1] = 1
    records: Dict[str, FingerprintRecord] = {}


class MetricBaseline(FrozenModel):
    """A metric's baseline value (median of the runs) and its run-to-run spread."""

    median: float
    spread_fraction: float
    runs: int


# --- pure: fingerprints, metrics, comparison -----------------------------------------------------------------------

def fingerprint_of(pairing: Optional[Pairing], probe: Optional[ProbeResult]) -> Fingerprint:
    """The fingerprint from the snapshot's pairing and the probe's framework (GPU names from the probe if needed)."""
    p = pairing or Pairing()
    models = p.gpu_models
    if not models and probe is not None and probe.devices:
        models = ", ".join(sorted({d.name or "?" for d in probe.devices}))
    driver = " ".join(v for v in (f"amdgpu {p.amdgpu_loaded}" if p.amdgpu_loaded else None,
                                  f"nvidia {p.nvidia_loaded}" if p.nvidia_loaded else None) if v) or None
    stack = " ".join(v for v in (f"ROCm {p.rocm}" if p.rocm else None,
                                 f"CUDA {p.cuda_driver_api}" if p.cuda_driver_api else None) if v) or None
    framework = build = None
    fw = probe.framework if probe is not None else None
    if fw is not None:
        framework = f"{fw.name} {fw.version}" if fw.version else fw.name
        build = {"cuda": f"cuda {fw.cuda}", "rocm": f"rocm {fw.hip}", "cpu": "cpu"}.get(fw.build or "", None)
    return Fingerprint(gpu_models=models, driver=driver, gpu_stack=stack, kernel=p.kernel_running,
                       framework=framework, framework_build=build)


def metrics_of(probe: ProbeResult) -> Dict[str, float]:
    """The compared figures, keyed ``gpu<index>.<metric>`` and ``collective.<metric>``."""
    out: Dict[str, float] = {}
    for gpu in probe.gpus:
        for name in GPU_METRICS:
            value = getattr(gpu, name)
            if value is not None and value > 0:
                out[f"gpu{gpu.index}.{name}"] = float(value)
    if probe.collective is not None:
        for name in COLLECTIVE_METRICS:
            value = getattr(probe.collective, name)
            if value is not None and value > 0:
                out[f"collective.{name}"] = float(value)
    return out


def split_metric(key: str) -> Tuple[Optional[int], str]:
    """(GPU index or None, metric name) of a metric key."""
    scope, _, name = key.partition(".")
    if scope.startswith("gpu") and scope[3:].isdigit():
        return int(scope[3:]), name
    return None, name


def baseline_metrics(record: FingerprintRecord) -> Dict[str, MetricBaseline]:
    """Median and run-to-run spread of every metric over the record's runs."""
    values: Dict[str, List[float]] = {}
    for run in record.runs:
        for key, value in run.metrics.items():
            values.setdefault(key, []).append(value)
    out: Dict[str, MetricBaseline] = {}
    for key, series in values.items():
        mid = statistics.median(series)
        if mid <= 0:
            continue
        spread = (max(series) - min(series)) / mid if len(series) > 1 else 0.0
        out[key] = MetricBaseline(median=mid, spread_fraction=spread, runs=len(series))
    return out


def noise_band(baseline: MetricBaseline, settings: HealthSettings) -> float:
    """The configured band, widened to ``spread_multiplier`` x the measured spread when that is larger."""
    return max(settings.noise_band_fraction, settings.spread_multiplier * baseline.spread_fraction)


def compare(current: Dict[str, float], reference_id: str, reference: FingerprintRecord,
            settings: HealthSettings) -> Tuple[List[MetricRegression], Dict[str, float]]:
    """Regressions of ``current`` against a record's baseline, and the band used for each compared metric."""
    regressions: List[MetricRegression] = []
    bands: Dict[str, float] = {}
    for key, base in sorted(baseline_metrics(reference).items()):
        if key not in current:
            continue
        band = noise_band(base, settings)
        bands[key] = round(band, 6)
        drop = (base.median - current[key]) / base.median
        if drop > band:
            gpu, name = split_metric(key)
            regressions.append(MetricRegression(metric=name, gpu=gpu, against="baseline",
                                                baseline_value=round(base.median, 6),
                                                current_value=round(current[key], 6),
                                                drop_fraction=round(drop, 6), threshold_fraction=round(band, 6),
                                                baseline_fingerprint=reference_id))
    return regressions, bands


def peer_outliers(probe: ProbeResult, settings: HealthSettings,
                  skip: Collection[int] = ()) -> List[MetricRegression]:
    """GPUs of one model slower than the mean of their peers in the same run by more than the peer tolerance.

    As DCGM 4.5 judges a GPU against the system mean (``gflops_tolerance_pcnt``), with one difference: the mean is
    of the *other* GPUs of the model, so a slow GPU does not pull its own reference down and the tolerance means the
    same on 2 GPUs as on 8. GPUs in ``skip`` (busy with another job) are neither judged nor anyone's peer.
    """
    regressions: List[MetricRegression] = []
    by_model: Dict[str, list] = {}
    for gpu in probe.gpus:
        if gpu.index not in skip:
            by_model.setdefault(gpu.name or "?", []).append(gpu)
    tolerance = settings.peer_tolerance_fraction
    for gpus in by_model.values():
        if len(gpus) < 2:
            continue
        for name in GPU_METRICS:
            for gpu in gpus:
                value = getattr(gpu, name)
                peers = [getattr(g, name) for g in gpus if g is not gpu and getattr(g, name) is not None]
                if value is None or not peers:
                    continue
                mean = statistics.fmean(peers)
                if mean <= 0:
                    continue
                drop = (mean - value) / mean
                if drop > tolerance:
                    regressions.append(MetricRegression(metric=name, gpu=gpu.index, against="peers",
                                                        baseline_value=round(mean, 6), current_value=round(value, 6),
                                                        drop_fraction=round(drop, 6), threshold_fraction=tolerance))
    return regressions


def choose_reference(data: BaselineFile, fingerprint_id: str) -> Optional[Tuple[str, FingerprintRecord]]:
    """This fingerprint's own established baseline, else the most recently seen other established one."""
    own = data.records.get(fingerprint_id)
    if own is not None and own.established_at is not None:
        return fingerprint_id, own
    others = [(rid, rec) for rid, rec in data.records.items()
              if rid != fingerprint_id and rec.established_at is not None]
    if not others:
        return None
    return max(others, key=lambda item: item[1].last_seen)


def record_run(data: BaselineFile, fingerprint: Fingerprint, metrics: Dict[str, float], good: bool,
               now: dt.datetime, runs_needed: int) -> Tuple[BaselineFile, bool]:
    """The file with this run noted: a good run joins its fingerprint's baseline until that is established.

    Returns (new file, whether the run joined the baseline). An established baseline never changes, so a slow
    drift cannot walk it down; a bad run only updates ``last_seen``.
    """
    fid = fingerprint.id
    record = data.records.get(fid) or FingerprintRecord(fingerprint=fingerprint, first_seen=now, last_seen=now)
    joined = good and record.established_at is None and bool(metrics)
    runs = [*record.runs, BaselineRun(at=now, metrics=metrics)] if joined else list(record.runs)
    established = record.established_at
    if established is None and len(runs) >= runs_needed:
        established = now
    updated = record.model_copy(update={"last_seen": now, "runs": runs, "established_at": established})
    return data.model_copy(update={"records": {**data.records, fid: updated}}), joined


# --- I/O: the store ------------------------------------------------------------------------------------------------

class BaselineStore:
    """The baselines file (``StatePaths.health_baselines``), read and written under an exclusive lock."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.directory = self.path.parent

    @contextlib.contextmanager
    def locked(self) -> Iterator["BaselineStore"]:
        self.directory.mkdir(parents=True, exist_ok=True)
        with os.fdopen(open_append_regular(str(self.directory / ".baselines.lock"), 0o644), "ab") as handle:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
            try:
                yield self
            finally:
                fcntl.flock(handle.fileno(), fcntl.LOCK_UN)

    def load(self) -> BaselineFile:
        """The stored baselines; an empty file when none exist yet; InputFileError when the file is corrupt."""
        try:
            text = decode_text(str(self.path), read_bytes_bounded(str(self.path)))  # a FIFO there is refused at once
        except FileMissing:
            return BaselineFile()
        try:
            return BaselineFile.model_validate(json.loads(text))
        except json.JSONDecodeError as exc:
            raise InputFileError(str(self.path), f"not valid JSON (line {exc.lineno}: {exc.msg})") from None
        except ValidationError as exc:
            raise InputFileError(str(self.path), f"not a baselines file: {first_validation_problem(exc)}") from None

    def save(self, data: BaselineFile) -> None:
        write_atomically(str(self.path), json.dumps(data.model_dump(mode="json"), sort_keys=True, indent=1) + "\n",
                         mode=0o644)


