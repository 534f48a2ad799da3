"""Baselines: fingerprints, establishment, the noise band, the reference choice, peer outliers, the store."""

from __future__ import annotations

import datetime as dt
import json
import threading
from pathlib import Path
from typing import Optional

import pytest

from agent.errors import InputFileError
from agent.health.baseline import (
    DRIFT_RUNS,
    BaselineFile,
    BaselineRun,
    BaselineStore,
    baseline_metrics,
    choose_reference,
    compare,
    fingerprint_of,
    metrics_of,
    peer_outliers,
    reset,
    scope_views,
    suspicious_baselines,
)
from agent.health.model import Fingerprint, WorkloadStack
from agent.health.settings import HealthSettings
from agent.snapshot.pairing import Pairing
from tests.health.baseline_helpers import H200, note, poisoned_file
from tests.health.probe_results import gpu_row, probe

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
FP_OLD = Fingerprint(gpu_models="NVIDIA H200", driver="nvidia 570.86.15", gpu_stack="CUDA 12.8", kernel="6.8.0",
                     framework="torch 2.10.0", framework_build="cuda 12.8")
FP_NEW = FP_OLD.model_copy(update={"driver": "nvidia 580.159.04"})
SETTINGS = HealthSettings(baseline_runs=3)


def established(fp: Fingerprint, values, at: dt.datetime = T0, data: Optional[BaselineFile] = None) -> BaselineFile:
    data = data if data is not None else BaselineFile()
    for i, value in enumerate(values):
        data, _ = note(data, fp, {"gpu0.gemm_bf16_tflops": value}, True, at + dt.timedelta(minutes=i), 3)
    return data


def test_fingerprint_changes_with_driver_and_is_stable() -> None:
    """The id is a stable hash: equal fingerprints share it, a driver change makes a new one."""
    assert FP_OLD.id == Fingerprint(**FP_OLD.model_dump()).id
    assert FP_OLD.id != FP_NEW.id and len(FP_OLD.id) == 16


def test_baseline_ids_are_the_ones_stored_baselines_are_keyed_by() -> None:
    """A fingerprint's and a workload stack's id stay the sha256 of their canonical JSON (16 hex digits): the keys
    of baselines already on hosts."""
    stack = {"gpu_models": "AMD Instinct MI300X", "driver": "6.8.5", "gpu_stack": "ROCm 6.2.2",
             "framework": "torch 2.4.1+rocm6.1"}
    assert Fingerprint(**stack, kernel="5.15.0-119-generic").id == "df12ef48a0ea4226"
    assert WorkloadStack(**stack, image="rocm/pytorch:6.2").id == "3e073f9e1002aa9a"


def test_fingerprint_of_pairing_and_probe() -> None:
    """GPU model, driver, CUDA, kernel from the pairing; framework and its build from the probe."""
    pairing = Pairing(kernel_running="6.18.44", nvidia_loaded="580.159.04", cuda_driver_api="13.0", gpu_count=1,
                      gpu_models="NVIDIA H200")
    fp = fingerprint_of(pairing, probe())
    assert fp == Fingerprint(gpu_models="NVIDIA H200", driver="nvidia 580.159.04", gpu_stack="CUDA 13.0",
                             kernel="6.18.44", framework="torch 2.11.0", framework_build="cuda 13.0")
    assert fingerprint_of(Pairing(), probe()).gpu_models == "NVIDIA H200"  # from the framework's device names


def test_metrics_of_keys_per_gpu_and_collective() -> None:
    """Compared figures are keyed by GPU index; the collective's bus bandwidth by itself."""
    result = probe([gpu_row(0), gpu_row(1, gemm=None)],
                   collective={"world_size": 2, "bytes": 1, "bus_bandwidth_gbps": 300.0, "sum_correct": True})
    assert metrics_of(result) == {"gpu0.gemm_bf16_tflops": 750.0, "gpu0.copy_bandwidth_gbps": 4200.0,
                                  "gpu1.copy_bandwidth_gbps": 4200.0, "collective.bus_bandwidth_gbps": 300.0}


def test_baseline_established_after_n_good_runs_then_frozen() -> None:
    """The first N good runs become the baseline; later good runs do not change it."""
    data = established(FP_OLD, [750.0, 740.0])
    assert data.records[FP_OLD.id].established_at is None
    data = established(FP_OLD, [760.0], data=data)
    assert data.records[FP_OLD.id].established_at is not None
    data, recorded = note(data, FP_OLD, {"gpu0.gemm_bf16_tflops": 100.0}, True, T0, 3)
    assert not recorded.joined and len(data.records[FP_OLD.id].runs) == 3


def test_bad_run_never_joins() -> None:
    """A run that is not good only updates last_seen."""
    data, recorded = note(BaselineFile(), FP_OLD, {"gpu0.gemm_bf16_tflops": 1.0}, False, T0, 3)
    assert not recorded.joined and data.records[FP_OLD.id].runs == []


@pytest.mark.parametrize("current, regressed", [(750.0, False), (690.0, False), (670.0, True), (600.0, True)])
def test_compare_with_configured_band(current: float, regressed: bool) -> None:
    """With a tight baseline (spread 2.7%, x3 = 8%) the configured 10% band applies."""
    data = established(FP_OLD, [740.0, 750.0, 760.0])
    regressions, bands = compare({"gpu0.gemm_bf16_tflops": current}, FP_OLD.id, data.records[FP_OLD.id], SETTINGS)
    assert bool(regressions) is regressed
    assert bands == {"gpu0.gemm_bf16_tflops": pytest.approx(0.10)}


def test_band_never_tighter_than_three_times_the_spread() -> None:
    """A noisy baseline (spread 10%) widens the band to 30%: a 20% drop is then within the noise."""
    data = established(FP_OLD, [700.0, 750.0, 775.0])
    base = baseline_metrics(data.records[FP_OLD.id])["gpu0.gemm_bf16_tflops"]
    assert base.spread_fraction == pytest.approx(0.10)
    regressions, bands = compare({"gpu0.gemm_bf16_tflops": 600.0}, FP_OLD.id, data.records[FP_OLD.id], SETTINGS)
    assert regressions == [] and bands["gpu0.gemm_bf16_tflops"] == pytest.approx(0.30)
    regressions, _ = compare({"gpu0.gemm_bf16_tflops": 500.0}, FP_OLD.id, data.records[FP_OLD.id], SETTINGS)
    assert regressions[0].gpu == 0 and regressions[0].metric == "gemm_bf16_tflops"


def test_reference_is_own_baseline_else_previous_fingerprint() -> None:
    """A new stack is compared with the previous stack's baseline until it has one of its own."""
    data = established(FP_OLD, [750.0, 750.0, 750.0])
    assert choose_reference(data, FP_NEW.id)[0] == FP_OLD.id
    data = established(FP_NEW, [700.0, 700.0, 700.0], at=T0 + dt.timedelta(days=1), data=data)
    assert choose_reference(data, FP_NEW.id)[0] == FP_NEW.id
    third = FP_NEW.model_copy(update={"kernel": "6.9.0"})
    assert choose_reference(data, third.id)[0] == FP_NEW.id  # the most recently seen other stack
    assert choose_reference(BaselineFile(), FP_OLD.id) is None


def test_peer_outlier_names_the_slow_gpu() -> None:
    """One GPU 30% slower than its three peers is named; the others are not."""
    result = probe([gpu_row(0), gpu_row(1), gpu_row(2, gemm=520.0), gpu_row(3)])
    outliers = peer_outliers(result, HealthSettings())
    assert [(r.gpu, r.metric, r.against) for r in outliers] == [(2, "gemm_bf16_tflops", "peers")]


def test_store_round_trip_and_corrupt_file(tmp_path: Path) -> None:
    """The store writes JSON atomically, reads it back, and names a corrupt file in its error."""
    store = BaselineStore(tmp_path / "health" / "baselines.json")
    assert store.load() == BaselineFile()
    data = established(FP_OLD, [750.0, 751.0, 752.0])
    with store.locked():
        store.save(data)
    assert store.load() == data
    assert not [p for p in store.directory.iterdir() if p.name.startswith(".baselines.json.")]
    store.path.write_text("{broken")
    with pytest.raises(InputFileError, match="baselines.json: not valid JSON"):
        store.load()
    store.path.write_text(json.dumps({"schema_version": 1, "records": {"x": {"nope": 1}}}))
    with pytest.raises(InputFileError, match="not a baselines file"):
        store.load()


@pytest.mark.timeout(20)
def test_store_lock_serialises_writers(tmp_path: Path) -> None:
    """Two writers under the lock never lose each other's runs."""
    store = BaselineStore(tmp_path / "baselines.json")

    def add(fp: Fingerprint) -> None:
        for i in range(10):
            with store.locked():
                data, _ = note(store.load(), fp, {"gpu0.gemm_bf16_tflops": 700.0 + i}, True, T0, 100)
                store.save(data)

    threads = [threading.Thread(target=add, args=(fp,)) for fp in (FP_OLD, FP_NEW)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    final = store.load()
    assert len(final.records[FP_OLD.id].runs) == 10 and len(final.records[FP_NEW.id].runs) == 10


# --- issue 39: a baseline that cannot be captured -------------------------------------------------------------------

FIG = "gpu0.gemm_bf16_tflops"


def established_at(value: float, runs: int = 3) -> BaselineFile:
    data = BaselineFile()
    for i in range(runs):
        data, _ = note(data, FP_OLD, {FIG: value}, True, T0 + dt.timedelta(minutes=i), runs)
    return data


def test_runs_beyond_the_sku_limits_or_not_corroborated_never_join() -> None:
    """A forged figure (inside the parser's 1e7 cap) and an uncorroborated run never join a learning baseline."""
    data, recorded = note(BaselineFile(), FP_OLD, {FIG: 9.99e6}, True, T0, 3)
    assert not recorded.joined and recorded.refused[0].startswith("beyond the SKU limits: gpu0 gemm_bf16_tflops")
    data, recorded = note(data, FP_OLD, {FIG: 750.0}, True, T0, 3, corroborated=False)
    assert recorded.refused == ("not corroborated",) and data.records[FP_OLD.id].runs == []


def test_a_suspicious_record_is_never_a_reference_and_never_moved() -> None:
    """A record with figures beyond the limits is skipped as a reference and takes no more runs."""
    poisoned = BaselineFile(records={FP_OLD.id: established_at(750.0).records[FP_OLD.id].model_copy(
        update={"runs": [BaselineRun(at=T0, metrics={FIG: 9.99e6})] * 3})})
    assert choose_reference(poisoned, FP_NEW.id, H200) is None
    assert choose_reference(poisoned, FP_NEW.id) is not None  # without limits (before 39) it was used
    assert [s.key for s in suspicious_baselines(poisoned, H200)] == [FIG]
    _, recorded = note(poisoned, FP_OLD, {FIG: 750.0}, True, T0, 3)
    assert not recorded.joined and "suspicious" in recorded.refused[-1]


def faster_runs(data: BaselineFile, value: float, count: int, start: int = 0) -> BaselineFile:
    for i in range(count):
        data, _ = note(data, FP_OLD, {FIG: value}, True, T0 + dt.timedelta(hours=start + i), 3)
    return data


def test_drift_moves_up_after_ten_consecutive_faster_runs_capped_at_half_the_band() -> None:
    """Ten runs each beyond the band above the baseline move it up, to at most anchor x (1 + band / 2)."""
    data = faster_runs(established_at(700.0), 840.0, DRIFT_RUNS - 1)
    assert baseline_metrics(data.records[FP_OLD.id])[FIG].median == 700.0
    data, recorded = note(data, FP_OLD, {FIG: 840.0}, True, T0 + dt.timedelta(days=2), 3)
    assert recorded.moved is not None and recorded.moved.rule == "drift"
    assert baseline_metrics(data.records[FP_OLD.id])[FIG].median == pytest.approx(735.0)  # 700 x 1.05
    assert data.records[FP_OLD.id].drift_runs == []
    data = faster_runs(data, 900.0, DRIFT_RUNS, start=100)  # the cap holds across moves: measured from the anchor
    assert baseline_metrics(data.records[FP_OLD.id])[FIG].median == pytest.approx(735.0)


@pytest.mark.parametrize("interrupt", [
    {"metrics": {FIG: 700.0}, "good": True},                      # an honest run at the baseline
    {"metrics": {FIG: 840.0}, "good": True, "corroborated": False},  # a run root did not corroborate
    {"metrics": {FIG: 500.0}, "good": False},                     # a regression
    {"metrics": {FIG: 9.99e6}, "good": True},                     # a forged figure beyond the limits
])
def test_drift_needs_an_unbroken_streak(interrupt: dict) -> None:
    """Any run that is not a corroborated faster one breaks the streak: nine, one other, nine more do not move it."""
    data = faster_runs(established_at(700.0), 840.0, DRIFT_RUNS - 1)
    data, _ = note(data, FP_OLD, at=T0 + dt.timedelta(days=1), runs_needed=3, **interrupt)
    data = faster_runs(data, 840.0, DRIFT_RUNS - 1, start=50)
    assert baseline_metrics(data.records[FP_OLD.id])[FIG].median == 700.0


def test_drift_never_moves_down_and_one_forged_run_moves_nothing() -> None:
    """Slower runs (within the band or regressions) never move the baseline; a single faster run neither."""
    data = faster_runs(established_at(700.0), 650.0, 3 * DRIFT_RUNS)
    data = faster_runs(data, 1100.0, 1, start=200)
    record = data.records[FP_OLD.id]
    assert baseline_metrics(record)[FIG].median == 700.0 and [m.rule for m in record.moves] == ["first_runs"]


def test_reset_one_gpu_relearns_it_and_leaves_the_others() -> None:
    """reset --gpu 1 drops GPU 1's figures (not compared until learned again); GPU 0 stays established."""
    data = BaselineFile()
    for i in range(3):
        data, _ = note(data, FP_OLD, {FIG: 700.0, "gpu1.gemm_bf16_tflops": 690.0}, True,
                       T0 + dt.timedelta(minutes=i), 3)
    data = reset(data, T0, "root", gpu=1)
    record = data.records[FP_OLD.id]
    assert record.relearning == ["gpu1"] and FIG in baseline_metrics(record)
    assert set(baseline_metrics(choose_reference(data, FP_OLD.id)[1])) == {FIG}
    for i in range(3):
        data, recorded = note(data, FP_OLD, {FIG: 700.0, "gpu1.gemm_bf16_tflops": 600.0}, True,
                              T0 + dt.timedelta(hours=i), 3)
    assert recorded.moved is not None and recorded.moved.rule == "relearned" and recorded.moved.scopes == ["gpu1"]
    medians = baseline_metrics(data.records[FP_OLD.id])
    assert medians["gpu1.gemm_bf16_tflops"].median == 600.0 and medians[FIG].median == 700.0
    assert reset(data, T0, "root").records == {}


def test_a_file_from_before_39_still_loads(tmp_path: Path) -> None:
    """A schema_version 1 file (no moves, anchors or streaks) loads; its records are established as they were."""
    path = tmp_path / "baselines.json"
    poisoned_file(path, FP_OLD.id, FP_OLD, gemm=750.0)
    data = BaselineStore(path).load()
    assert data.schema_version == 1 and data.records[FP_OLD.id].established_at is not None
    view = scope_views(data)[0]
    assert (view.scope, view.runs, view.established, view.rule) == ("gpu0", 5, True, "first_runs")
