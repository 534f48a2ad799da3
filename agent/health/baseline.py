"""Baselines: the first corroborated runs on a fingerprint become its baseline; later runs are held against it.

A run is compared with its own fingerprint's baseline once that is established, else with the most recently
seen other fingerprint's (the stack before the change). A figure regresses when it drops by more than its noise
band: the configured fraction, but never tighter than ``spread_multiplier`` times the baseline's run-to-run spread
((max - min) / median of its runs). The store is one JSON file under the state directory, written atomically
under an exclusive lock so a scheduled and a manual check cannot interleave.

What may move a baseline (docs/health.md "What root believes"), in the order ``record_run`` applies it:

    a run that is not good (a regression, throttled), not corroborated, or has a figure above its SKU's
        physical limits (sku_limits.py) ........................ never joins; breaks a drift streak
    a record whose stored figures are beyond the limits ........ suspicious: never compared with, never moved
        (status says so; ``gpuguard health baseline reset`` clears it)
    a record still learning ..................................... the run joins; ``baseline_runs`` runs establish it
    a GPU reset by the operator (``reset --gpu N``) ............. its figures are learned again the same way
    an established record ....................................... moves only by the drift rule: ``DRIFT_RUNS``
        consecutive runs on the same fingerprint, each good, corroborated and above the baseline by more than its
        noise band in every figure; it then moves up, at most ``DRIFT_CAP_OF_BAND`` x the configured band above
        the figures it was established with. Never down: a GPU that slowed is what a baseline is there to catch.
    the operator (``gpuguard health baseline reset``) ........... clears it, audited
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import json
import os
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Collection, Dict, Iterator, List, Literal, Optional, Tuple

from pydantic import ValidationError

from agent.errors import GpuguardError, InputFileError
from agent.files import (
    FileMissing,
    decode_text,
    open_append_regular,
    read_bytes_bounded,
    read_json_file,
    write_atomically,
)
from agent.health.model import Fingerprint, MetricRegression, ProbeResult
from agent.health.settings import HealthSettings
from agent.health.sku_limits import VENDOR_IDS, SkuLimits, beyond, bound_for, lookup
from agent.host import Host
from agent.models import FrozenModel, first_validation_problem
from agent.snapshot.pairing import Pairing

# Figures compared with baselines: higher is better for each. Training-step times are dominated by first-call
# initialisation and are reported, not judged.
GPU_METRICS = ("gemm_bf16_tflops", "gemm_fp16_tflops", "copy_bandwidth_gbps")
COLLECTIVE_METRICS = ("bus_bandwidth_gbps",)
# The drift rule: this many consecutive faster runs move an established baseline up, by at most this share of the
# configured noise band above the figures it was established with (so an honest run after a drift forged to the
# full cap is still inside the band: 1 - 1/1.05 < 0.10).
DRIFT_RUNS = 10
DRIFT_CAP_OF_BAND = 0.5
# How many moves (establishments, resets, drifts) a record keeps for ``baseline show``; audit.log keeps them all.
MOVES_KEPT = 20
MoveRule = Literal["first_runs", "relearned", "drift", "reset"]


class BaselineRun(FrozenModel):
    """The figures of one good run."""

    at: dt.datetime
    metrics: Dict[str, float]


class BaselineMove(FrozenModel):
    """One change of a baseline: established from its first runs, a GPU learned again, a drift, a reset."""

    at: dt.datetime
    rule: MoveRule
    # The figures' scopes it touched ("gpu0", "collective"); empty: all of them.
    scopes: List[str] = []
    by: Optional[str] = None
    detail: Optional[str] = None


class FingerprintRecord(FrozenModel):
    """One fingerprint's baseline runs; moved after ``established_at`` only by the drift rule or a reset."""

    fingerprint: Fingerprint
    first_seen: dt.datetime
    last_seen: dt.datetime
    runs: List[BaselineRun] = []
    established_at: Optional[dt.datetime] = None
    # Scopes reset by ``baseline reset --gpu N``: learned again from the next runs, not compared with until then.
    relearning: List[str] = []
    # The medians it was established (or last learned) with: the drift rule's cap is measured from these.
    anchor: Dict[str, float] = {}
    # The current streak of runs above the baseline (the drift rule).
    drift_runs: List[BaselineRun] = []
    moves: List[BaselineMove] = []


class BaselineFile(FrozenModel):
    """Everything in baselines.json (version 1: written before issue 39, without moves, anchors or streaks)."""

    schema_version: Literal[1, 2] = 2
    records: Dict[str, FingerprintRecord] = {}
    # Whole-file resets by the operator (the newest MOVES_KEPT).
    resets: List[BaselineMove] = []


class SuspiciousFigure(FrozenModel):
    """A stored baseline figure that its SKU cannot reach: the baseline was captured (or written by hand)."""

    fingerprint_id: str
    key: str
    value: float
    reason: str

    def describe(self) -> str:
        return f"baseline {self.fingerprint_id} {self.reason}"


@dataclass(frozen=True)
class RunSample:
    """What the runner hands to the baseline update about one judged run.

    ``good``: no regression and not throttled. ``corroborated``: root believes the run (the seam in runner.py:
    today a pass whose figures are within the SKU limits; agent/health/corroborate.py's verdict once it lands).
    """

    fingerprint: Fingerprint
    metrics: Dict[str, float]
    good: bool
    corroborated: bool


@dataclass(frozen=True)
class Recorded:
    """What ``record_run`` did with a run: joined the baseline, refused it (why), moved the baseline (which rule)."""

    joined: bool = False
    refused: Tuple[str, ...] = ()
    moved: Optional[BaselineMove] = None


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


def scope_of(key: str) -> str:
    """The scope of a metric key: ``gpu0``, ``collective``."""
    return key.partition(".")[0]


def beyond_limits(metrics: Dict[str, float], limits: SkuLimits) -> List[str]:
    """Why each figure above the SKU's physical limits is impossible, ``gpu0.`` first; [] when none is."""
    out: List[str] = []
    for key, value in sorted(metrics.items()):
        why = beyond(split_metric(key)[1], value, limits)
        if why is not None:
            out.append(f"{scope_of(key)} {why}")
    return out


def suspicious_figures(fid: str, record: FingerprintRecord, limits: SkuLimits) -> List[SuspiciousFigure]:
    """The record's stored figures its SKU cannot reach (the highest of each key): a captured baseline."""
    highest: Dict[str, float] = {}
    for run in record.runs:
        for key, value in run.metrics.items():
            highest[key] = max(value, highest.get(key, value))
    found: List[SuspiciousFigure] = []
    for key, value in sorted(highest.items()):
        why = beyond(split_metric(key)[1], value, limits)
        if why is not None:
            found.append(SuspiciousFigure(fingerprint_id=fid, key=key, value=value, reason=f"{scope_of(key)} {why}"))
    return found


def suspicious_baselines(data: BaselineFile, limits: SkuLimits) -> List[SuspiciousFigure]:
    """Every record's figures beyond the SKU limits."""
    return [s for fid, record in sorted(data.records.items()) for s in suspicious_figures(fid, record, limits)]


def comparable(record: FingerprintRecord) -> FingerprintRecord:
    """The record without the scopes it is learning again (they are not compared with until learned)."""
    if not record.relearning:
        return record
    runs = [BaselineRun(at=r.at, metrics={k: v for k, v in r.metrics.items() if scope_of(k) not in record.relearning})
            for r in record.runs]
    return record.model_copy(update={"runs": runs})


def choose_reference(data: BaselineFile, fingerprint_id: str,
                     limits: Optional[SkuLimits] = None) -> Optional[Tuple[str, FingerprintRecord]]:
    """This fingerprint's own established baseline, else the most recently seen other established one; with
    ``limits``, never one with figures beyond them (suspicious). Scopes being learned again are left out."""
    usable = {rid: rec for rid, rec in data.records.items() if rec.established_at is not None
              and (limits is None or not suspicious_figures(rid, rec, limits))}
    own = usable.get(fingerprint_id)
    if own is not None:
        return fingerprint_id, comparable(own)
    others = [(rid, rec) for rid, rec in usable.items() if rid != fingerprint_id]
    if not others:
        return None
    rid, rec = max(others, key=lambda item: item[1].last_seen)
    return rid, comparable(rec)


def _medians(runs: List[BaselineRun]) -> Dict[str, float]:
    values: Dict[str, List[float]] = {}
    for run in runs:
        for key, value in run.metrics.items():
            values.setdefault(key, []).append(value)
    return {key: statistics.median(series) for key, series in values.items()}


def _moved(record: FingerprintRecord, move: BaselineMove, **update: object) -> FingerprintRecord:
    return record.model_copy(update={**update, "moves": [*record.moves, move][-MOVES_KEPT:]})


def _faster(metrics: Dict[str, float], record: FingerprintRecord, settings: HealthSettings) -> bool:
    """Every figure of the baseline present and above it by more than its noise band."""
    bases = baseline_metrics(record)
    return bool(bases) and all(key in metrics and metrics[key] > base.median * (1 + noise_band(base, settings))
                               for key, base in bases.items())


def _drift(record: FingerprintRecord, run: BaselineRun, settings: HealthSettings,
           now: dt.datetime) -> Tuple[FingerprintRecord, Optional[BaselineMove]]:
    """The drift rule on an established record for a usable run: extend or break the streak; move when full."""
    if not _faster(run.metrics, record, settings):
        return record.model_copy(update={"drift_runs": []}), None
    streak = [*record.drift_runs, run]
    if len(streak) < DRIFT_RUNS:
        return record.model_copy(update={"drift_runs": streak}), None
    current = _medians(record.runs)
    seen = _medians(streak)
    anchor = {**current, **record.anchor}
    cap = 1 + DRIFT_CAP_OF_BAND * settings.noise_band_fraction
    target = {key: max(current[key], min(seen.get(key, current[key]), anchor[key] * cap)) for key in current}
    factors = {key: target[key] / current[key] for key in current if current[key] > 0}
    if all(abs(f - 1) < 1e-9 for f in factors.values()):
        return record.model_copy(update={"drift_runs": []}), None  # already at the cap: only the operator moves it
    runs = [BaselineRun(at=r.at, metrics={k: v * factors.get(k, 1.0) for k, v in r.metrics.items()})
            for r in record.runs]
    detail = ", ".join(f"{key} {current[key]:g} -> {target[key]:g}" for key in sorted(factors)
                       if abs(factors[key] - 1) >= 1e-9)
    move = BaselineMove(at=now, rule="drift", detail=f"{DRIFT_RUNS} consecutive runs above the band: {detail}")
    return _moved(record, move, runs=runs, drift_runs=[]), move


def record_run(data: BaselineFile, sample: RunSample, now: dt.datetime, settings: HealthSettings,
               limits: SkuLimits) -> Tuple[BaselineFile, Recorded]:
    """The file with this run noted (``last_seen`` always), by the rules in this module's docstring."""
    fid = sample.fingerprint.id
    record = data.records.get(fid) or FingerprintRecord(fingerprint=sample.fingerprint, first_seen=now, last_seen=now)
    record = record.model_copy(update={"last_seen": now})
    refused = [*([] if sample.good else ["not a good run (a regression, or throttled)"]),
               *([] if sample.corroborated else ["not corroborated"]),
               *(f"beyond the SKU limits: {why}" for why in beyond_limits(sample.metrics, limits))]
    suspicious = suspicious_figures(fid, record, limits)
    if suspicious:
        refused.append(f"the stored baseline is suspicious ({suspicious[0].reason}): only a reset moves it")
    if not sample.metrics:
        refused.append("no figures")
    run = BaselineRun(at=now, metrics=sample.metrics)
    needed = settings.baseline_runs
    joined = False
    move: Optional[BaselineMove] = None
    if refused:
        record = record.model_copy(update={"drift_runs": []})
    elif record.established_at is None:
        joined = True
        runs = [*record.runs, run]
        record = record.model_copy(update={"runs": runs})
        if len(runs) >= needed:
            move = BaselineMove(at=now, rule="first_runs", detail=f"{len(runs)} corroborated runs")
            record = _moved(record, move, established_at=now, anchor=_medians(runs))
    elif record.relearning:
        part = {k: v for k, v in sample.metrics.items() if scope_of(k) in record.relearning}
        joined = bool(part)
        runs = [*record.runs, BaselineRun(at=now, metrics=part)] if part else list(record.runs)
        learned = [s for s in record.relearning
                   if sum(1 for r in runs if any(scope_of(k) == s for k in r.metrics)) >= needed]
        record = record.model_copy(update={"runs": runs, "drift_runs": []})
        if learned:
            medians = _medians(runs)
            anchor = {**record.anchor, **{k: v for k, v in medians.items() if scope_of(k) in learned}}
            move = BaselineMove(at=now, rule="relearned", scopes=learned, detail=f"{needed} corroborated runs")
            record = _moved(record, move, anchor=anchor,
                            relearning=[s for s in record.relearning if s not in learned])
    else:
        record, move = _drift(record, run, settings, now)
    updated = data.model_copy(update={"records": {**data.records, fid: record}})
    return updated, Recorded(joined=joined, refused=tuple(refused), moved=move)


def reset(data: BaselineFile, now: dt.datetime, by: str, gpu: Optional[int] = None) -> BaselineFile:
    """The operator's reset: every baseline cleared, or only GPU ``gpu``'s figures (learned again from the next
    corroborated runs)."""
    move = BaselineMove(at=now, rule="reset", scopes=[] if gpu is None else [f"gpu{gpu}"], by=by)
    if gpu is None:
        return BaselineFile(resets=[*data.resets, move][-MOVES_KEPT:])
    scope = f"gpu{gpu}"
    records: Dict[str, FingerprintRecord] = {}
    for fid, record in data.records.items():
        def keep(metrics: Dict[str, float]) -> Dict[str, float]:
            return {k: v for k, v in metrics.items() if scope_of(k) != scope}

        runs = [BaselineRun(at=r.at, metrics=keep(r.metrics)) for r in record.runs]
        relearning = record.relearning
        if record.established_at is not None and scope not in relearning:
            relearning = [*relearning, scope]
        records[fid] = _moved(record, move, runs=[r for r in runs if r.metrics], anchor=keep(record.anchor),
                              drift_runs=[], relearning=relearning)
    return data.model_copy(update={"records": records})


class ScopeView(FrozenModel):
    """One GPU's (or the collective's) baseline as ``baseline show`` prints it."""

    fingerprint_id: str
    scope: str
    figures: Dict[str, float]
    runs: int
    established: bool
    since: Optional[dt.datetime] = None
    rule: Optional[str] = None
    by: Optional[str] = None
    drift_streak: int = 0


def scope_views(data: BaselineFile) -> List[ScopeView]:
    """Per fingerprint and scope: the figures (medians), how many runs, since when and by which rule."""
    views: List[ScopeView] = []
    for fid, record in sorted(data.records.items(), key=lambda item: item[1].last_seen, reverse=True):
        medians = _medians(record.runs)
        for scope in sorted({scope_of(k) for k in medians}):
            keys = {k: round(v, 6) for k, v in medians.items() if scope_of(k) == scope}
            runs = sum(1 for r in record.runs if any(scope_of(k) == scope for k in r.metrics))
            established = record.established_at is not None and scope not in record.relearning
            moves = [m for m in record.moves if not m.scopes or scope in m.scopes]
            last = moves[-1] if moves else None
            since = last.at if last is not None else record.established_at
            rule = last.rule if last is not None else ("first_runs" if record.established_at else None)
            views.append(ScopeView(fingerprint_id=fid, scope=scope, figures=keys, runs=runs, established=established,
                                   since=since, rule=rule, by=last.by if last is not None else None,
                                   drift_streak=len(record.drift_runs)))
    return views


@dataclass(frozen=True)
class GpuIdentity:
    """A GPU as root sees it (the snapshot: NVML/amdsmi/sysfs), enough to look its SKU up."""

    vendor: Literal["nvidia", "amd"]
    bdf: Optional[str]
    model: Optional[str]
    pci_device_id: Optional[str]


def gpu_identities(snapshot: object) -> List[GpuIdentity]:
    """The GPUs of a snapshot (its JSON form: the runner's, or last-snapshot.json for status)."""
    found: List[GpuIdentity] = []
    if not isinstance(snapshot, dict):
        return found
    for vendor, name_key in (("nvidia", "name"), ("amd", "market_name")):
        section = snapshot.get("nvidia" if vendor == "nvidia" else "amdgpu")
        data = section.get("data") if isinstance(section, dict) else None
        gpus = data.get("gpus") if isinstance(data, dict) else None
        for gpu in gpus if isinstance(gpus, list) else []:
            if not isinstance(gpu, dict):
                continue
            text = {k: v for k, v in gpu.items() if isinstance(v, str)}
            found.append(GpuIdentity(vendor="nvidia" if vendor == "nvidia" else "amd", bdf=text.get("bdf"),
                                     model=text.get(name_key), pci_device_id=text.get("device_id")))
    return found


def host_limits(identities: List[GpuIdentity], read_text: Callable[[str], Optional[str]]) -> SkuLimits:
    """The SKU limits for the host's GPUs; a GPU's PCI device id from sysfs (through ``read_text``, the host root's
    reader) where the snapshot has none. The fastest known part when a GPU is unknown (sku_limits.bound_for)."""
    skus = []
    for gpu in identities:
        device = gpu.pci_device_id
        if device is None and gpu.bdf:
            device = (read_text(f"/sys/bus/pci/devices/{gpu.bdf}/device") or "").strip() or None
        skus.append(lookup(gpu.model, device, VENDOR_IDS[gpu.vendor]))
    return bound_for(skus)


def last_snapshot_limits(host: Host, snapshot_path: str) -> SkuLimits:
    """The host's SKU limits from the daemon's last snapshot file (root's view of its GPUs, for ``status`` and
    ``baseline show``; a state-directory path, read as it is, as status reads every state file); the fastest
    known part without one."""
    try:
        snapshot = read_json_file(snapshot_path)
    except GpuguardError:
        snapshot = None

    def read(path: str) -> Optional[str]:
        try:
            return host.read_text(path, max_chars=64)
        except GpuguardError:
            return None

    return host_limits(gpu_identities(snapshot), read)


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


