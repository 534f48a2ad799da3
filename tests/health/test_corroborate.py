"""The corroboration rules (pure): a probe's claims held against root's own inventory, clock and datasheet peaks."""

from __future__ import annotations

from typing import Any, Dict, List, Optional

import pytest

from agent.health.corroborate import RootGpu, RootView, corroborate, root_view
from agent.health.fallback import GpuInventory
from agent.health.model import ActivityReport, GpuActivity, ProbeResult
from agent.health.parse import ParseFailure, parse_probe_output
from agent.health.sku_limits import MARGIN, SKUS, lookup
from tests.health.helpers import make_snapshot
from tests.health.probe_results import gpu_row, probe


def view(count: int = 1, model: Optional[str] = "NVIDIA H200", wall: Optional[float] = 10.0,
         device_id: Optional[str] = None) -> RootView:
    """Root's view of ``count`` GPUs of ``model`` at the PCI addresses and UUIDs probe_results.py names."""
    gpus = tuple(RootGpu(f"0000:00:{6 + i:02x}.0", f"5a1b2c3d-0000-0000-0000-00000000000{i}", model, device_id,
                         150754820096) for i in range(count))
    return RootView(GpuInventory(vendor="nvidia", gpu_count=count, sources=["snapshot"]), gpus,
                    uuids_comparable=True, probe_wall_seconds=wall)


def kinds(result: ProbeResult, root: RootView) -> List[str]:
    return [d.kind for d in corroborate(result, root).disagreements]


def test_real_h200_figures_are_corroborated_with_nothing_unverified() -> None:
    """docs/hardware.md's H200 figures (792 TFLOP/s bf16, 4269 GB/s copy) on root's H200: no disagreement."""
    found = corroborate(probe([gpu_row(0, gemm=792.0, copy=4269.0, copy_bytes=4 << 30, seconds=2.0)]), view())
    assert found.disagreements == [] and found.unverified == []
    assert "GPU 0: figures within the H200 SXM's datasheet peaks x 1.15 (root's inventory)" in found.checked


@pytest.mark.parametrize("gpus,device_count,count,expected", [
    # The GPUs beyond root's are also at PCI addresses root never enumerated.
    ([gpu_row(i) for i in range(3)], None, 2, ["more_gpus_than_host", "unknown_device"]),
    ([gpu_row(i) for i in range(8)], None, 1, ["more_gpus_than_host", "unknown_device"]),
    ([gpu_row(0), gpu_row(1)], 1, 2, ["unlisted_index"]),
    ([gpu_row(0), gpu_row(0)], 1, 1, ["duplicate_gpu"]),
    ([gpu_row(0, seconds=-1.0)], None, 1, ["impossible_time"]),
    ([gpu_row(0, seconds=0.0)], None, 1, ["impossible_time"]),
    ([gpu_row(0, seconds=60.0)], None, 1, ["impossible_time"]),
    ([gpu_row(0, gemm=5000.0)], None, 1, ["above_peak"]),
    ([gpu_row(0, copy=9000.0, copy_bytes=4 << 30)], None, 1, ["above_peak"]),
    ([gpu_row(0, device_memory_peak_bytes=1 << 50)], None, 1, ["impossible_figure"]),
    ([gpu_row(0, copy_bytes=-1)], None, 1, ["impossible_figure"]),
])
def test_each_rule_names_its_disagreement(gpus: List[Dict[str, Any]], device_count: Optional[int], count: int,
                                          expected: List[str]) -> None:
    """Each impossible claim is named by its own kind (an unlisted index on a host that has it: only that)."""
    assert sorted(set(kinds(probe(gpus, device_count=device_count), view(count)))) == expected


def test_the_same_uuid_or_pci_address_twice_is_one_gpu_counted_twice() -> None:
    """Two devices with one UUID, or one PCI address, are a duplicate."""
    twice = probe([gpu_row(0), gpu_row(1)])
    first_uuid = twice.devices[0].uuid
    same_uuid = twice.model_copy(update={"devices": [d.model_copy(update={"uuid": first_uuid}) for d in twice.devices]})
    assert "duplicate_gpu" in kinds(same_uuid, view(2))
    same_bdf = twice.model_copy(update={"devices": [d.model_copy(update={"pci_bus_id": "0000:00:06.0"})
                                                    for d in twice.devices]})
    assert "duplicate_gpu" in kinds(same_bdf, view(2))


def test_a_pci_address_or_uuid_root_does_not_have_is_an_unknown_device() -> None:
    """A device at an address (or with a UUID) root never enumerated is unknown_device."""
    result = probe()
    moved = result.model_copy(update={"devices": [result.devices[0].model_copy(update={"pci_bus_id": "0000:99:00.0"})]})
    assert kinds(moved, view()) == ["unknown_device"]
    renamed = result.model_copy(update={"devices": [result.devices[0].model_copy(update={"uuid": "ffff"})]})
    assert kinds(renamed, view()) == ["unknown_device"]


def test_a_model_name_of_another_sku_than_roots_is_an_unknown_device() -> None:
    """The framework naming an H200 where root's inventory has an H100 is a disagreement."""
    assert "unknown_device" in kinds(probe(), view(model="NVIDIA H100 80GB HBM3"))


@pytest.mark.parametrize("name,device_id,sku", [
    ("NVIDIA H100 80GB HBM3", None, "H100 SXM"), ("NVIDIA H100 PCIe", None, "H100 PCIe"),
    ("NVIDIA H100 NVL", None, "H100 NVL"), ("NVIDIA H200", None, "H200 SXM"), ("NVIDIA H200 NVL", None, "H200 NVL"),
    ("NVIDIA GH200 480GB", None, "GH200"), ("NVIDIA A100-SXM4-80GB", None, "A100 SXM 80GB"),
    ("AMD Instinct MI300X", None, "MI300X"), ("AMD Instinct MI250X / MI250", None, "MI250X"),
    ("AMD Instinct MI210", None, "MI210"), (None, "0x74a1", "MI300X"), (None, "0x740F", "MI210"),
    ("NVIDIA GeForce RTX 4090", None, None), (None, None, None),
])
def test_lookup_maps_the_names_smi_libraries_give(name: Optional[str], device_id: Optional[str],
                                                   sku: Optional[str]) -> None:
    """NVML names, amdgpu market names and device ids map to their datasheet row; anything else to none."""
    peak = lookup(name, device_id)
    assert (peak.name if peak else None) == sku


def test_every_datasheet_row_lets_its_own_peak_pass_and_refuses_above_the_margin() -> None:
    """For every SKU: the datasheet peak itself passes, 1% beyond the margin is above_peak."""
    for key, peak in SKUS.items():
        root = view(model=key)
        at_peak = probe([gpu_row(0, name=key, gemm=peak.bf16_tflops, copy=peak.hbm_gbps, copy_bytes=4 << 30)])
        assert kinds(at_peak.model_copy(update={"devices": [at_peak.devices[0].model_copy(update={"name": key})]}),
                     root) == [], key
        beyond = probe([gpu_row(0, gemm=peak.bf16_tflops * MARGIN * 1.01)])
        assert "above_peak" in kinds(beyond.model_copy(update={"devices": [
            beyond.devices[0].model_copy(update={"name": key})]}), root), key


def test_a_small_copy_may_come_from_a_cache_but_not_beyond_it() -> None:
    """A copy under 1 GiB is bounded by 4x the HBM peak (an on-die cache), not by the HBM peak."""
    mi300x = view(model="AMD Instinct MI300X")
    small = probe([gpu_row(0, copy=12000.0, copy_bytes=64 << 20)])
    named = small.model_copy(update={"devices": [small.devices[0].model_copy(update={"name": "AMD Instinct MI300X"})]})
    assert kinds(named, mi300x) == []
    huge = named.model_copy(update={"gpus": [named.gpus[0].model_copy(update={"copy_bandwidth_gbps": 30000.0})]})
    assert kinds(huge, mi300x) == ["above_peak"]


def test_an_unknown_sku_keeps_the_generic_bounds_and_says_so() -> None:
    """A model without a datasheet row: nothing refused for speed, and ``unverified`` says only generic bounds hold."""
    result = probe([gpu_row(0, name="Some GPU", gemm=5000.0)])
    result = result.model_copy(update={"devices": [result.devices[0].model_copy(update={"name": "Some GPU"})]})
    found = corroborate(result, view(model=None))
    assert found.disagreements == []
    assert any("no datasheet peak" in line for line in found.unverified)


def test_with_no_inventory_root_says_the_count_was_not_checked() -> None:
    """When root enumerated no GPU, the count is unverified, never refused and never silently believed."""
    found = corroborate(probe(), RootView(GpuInventory(), ()))
    assert found.disagreements == [] and found.inventory_gpu_count is None
    assert any(line.startswith("GPU count: root enumerated no GPUs") for line in found.unverified)


def test_root_view_merges_the_snapshot_and_the_smi_library_by_pci_address() -> None:
    """The snapshot's model and the SMI sampler's UUID of one GPU end up in one RootGpu."""
    activity = ActivityReport(library="pynvml", gpus=[GpuActivity(smi_index=0, bdf="00000000:00:06.0",
                                                                  uuid="GPU-5A1B2C3D-0000-0000-0000-000000000000")])
    root = root_view(make_snapshot(1), activity, GpuInventory(vendor="nvidia", gpu_count=1))
    assert root.gpus == (RootGpu("0000:00:06.0", "5a1b2c3d-0000-0000-0000-000000000000", "NVIDIA H200"),)
    assert root.uuids_comparable


def test_a_cpu_run_is_left_to_the_fallback_rules() -> None:
    """A CPU-only run (a row for the CPU, no device) raises no identity or peak disagreement."""
    cpu = probe([gpu_row(0, device="cpu", name="cpu", gemm=0.3, copy=15.0)], device_count=0, ran_on="cpu",
                build="cpu")
    assert kinds(cpu, view()) == []


@pytest.mark.parametrize("line,reason", [
    ('{"probe_schema_version": 1, "python": "3", "python": "4"}', "duplicate key 'python'"),
    ('{"probe_schema_version": 1, "python": "3\udcff"}', "not UTF-8 (byte 0xff at character 40)"),
    ('{"probe_schema_version": 1, "python": "\\udcff"}', "not UTF-8 (a lone surrogate escape"),
])
def test_the_result_line_is_strict_json(line: str, reason: str) -> None:
    """A key named twice, an invalid byte (kept by launch.py as a lone surrogate) or a surrogate escape is refused."""
    parsed = parse_probe_output("GPUGUARD_PROBE_RESULT " + line)
    assert isinstance(parsed, ParseFailure) and reason in parsed.reason, parsed


def recorded_real_results() -> List[Any]:
    """Every passing result the real probe gave on the H100 and H200 (docs/hardware/), as recorded there."""
    import json
    from pathlib import Path

    found = []
    for path in sorted((Path(__file__).resolve().parents[2] / "docs" / "hardware").rglob("*.json*")):
        lines = path.read_text().splitlines() if path.suffix == ".jsonl" else [path.read_text()]
        for number, line in enumerate(lines):
            try:
                record = json.loads(line)
            except ValueError:
                continue
            result = record.get("result", record) if isinstance(record, dict) else None
            if isinstance(result, dict) and result.get("status") == "pass" and result.get("probe"):
                found.append(pytest.param(result, id=f"{path.name}:{number}"))
    return found


@pytest.mark.parametrize("recorded", recorded_real_results())
def test_every_recorded_real_result_is_corroborated(recorded: Dict[str, Any]) -> None:
    """The real probe's passing results on the H100 and H200 agree with root's own view of those runs."""
    from agent.health.model import HealthResult

    result = HealthResult.model_validate(recorded)
    assert result.probe is not None
    models = result.fingerprint.gpu_models if result.fingerprint else ""
    inventory = GpuInventory(vendor="nvidia", gpu_count=result.inventory_gpu_count, sources=["recorded"])
    root = root_view(None, result.activity, inventory, result.probe_wall_seconds)
    # The model as the snapshot gave it (the fingerprint's), for each GPU the SMI library listed.
    root = RootView(root.inventory, tuple(RootGpu(g.bdf, g.uuid, models.split(",")[0].strip() or None)
                                          for g in root.gpus), root.uuids_comparable, root.probe_wall_seconds)
    found = corroborate(result.probe, root)
    assert found.disagreements == [], found.disagreements


# --- device memory root's SMI library saw during the run (issue #39) ---

GIB = 1 << 30


def smi_memory(before: Optional[int], low: Optional[int], peak: Optional[int], samples: int,
               gap: Optional[float] = 0.02, library: Optional[str] = "pynvml") -> ActivityReport:
    """The sampler's report of GPU 0 (at the PCI address and UUID probe_results.py names) with these memory readings."""
    gpu = GpuActivity(smi_index=0, bdf="00000000:00:06.0", uuid="GPU-5a1b2c3d-0000-0000-0000-000000000000",
                      idle_percent=0.0, max_percent=97.0, samples=samples, memory_before_bytes=before,
                      memory_low_bytes=low, memory_peak_bytes=peak, memory_samples=samples)
    return ActivityReport(library=library, interval_seconds=0.02, max_gap_seconds=gap, gpus=[gpu] if library else [],
                          unavailable_reason=None if library else "pynvml: not installed")


def memory_view(activity: Optional[ActivityReport]) -> RootView:
    """``view()`` with the sampler's report."""
    base = view()
    return RootView(base.inventory, base.gpus, base.uuids_comparable, base.probe_wall_seconds, activity)


def claim(peak: Optional[int] = 9697240064) -> ProbeResult:
    """One H200's honest figures claiming a device-memory peak of ``peak`` bytes."""
    return probe([gpu_row(0, gemm=792.0, copy=4269.0, copy_bytes=4 << 30, seconds=2.0,
                          device_memory_peak_bytes=peak)])


def test_memory_that_rose_with_the_claim_is_corroborated() -> None:
    """The real probe's 9.7 GB peak with root's NVML seeing memory in use rise by 9.5 GiB: checked, no disagreement."""
    found = corroborate(claim(), memory_view(smi_memory(GIB // 2, GIB // 2, 10 * GIB, 40)))
    assert found.disagreements == [] and found.unverified == []
    assert any(line.startswith("GPU 0: device memory rose by 9728 MiB") for line in found.checked), found.checked


@pytest.mark.parametrize("low,peak", [(GIB // 2, GIB // 2), (GIB // 2, GIB // 2 + GIB)])
def test_a_claim_whose_memory_never_rose_is_memory_unseen(low: int, peak: int) -> None:
    """9.7 GB claimed on a GPU whose memory in use stayed flat (or rose by 1 GiB, under a quarter) is memory_unseen."""
    found = corroborate(claim(), memory_view(smi_memory(low, low, peak, 40)))
    assert [d.kind for d in found.disagreements] == ["memory_unseen"]
    assert "claims a device-memory peak of 9248 MiB" in found.disagreements[0].message


def test_a_rise_seen_is_evidence_even_with_readings_far_apart() -> None:
    """On the real H100 some NVML readings came 0.106-0.124 s apart: a 9.5 GiB rise seen all the same is checked,
    not left unverified (only a rise missed needs readings close together to be a disagreement)."""
    found = corroborate(claim(), memory_view(smi_memory(GIB // 2, GIB // 2, 10 * GIB, 40, gap=0.124)))
    assert found.disagreements == [] and found.unverified == []
    assert any(line.startswith("GPU 0: device memory rose by 9728 MiB") for line in found.checked), found.checked


def test_the_lowest_reading_not_the_first_is_the_level_before() -> None:
    """A sampler that started after the probe allocated (first reading high) still sees the rise from the low."""
    found = corroborate(claim(), memory_view(smi_memory(10 * GIB, GIB // 2, 10 * GIB, 40)))
    assert found.disagreements == []


@pytest.mark.parametrize("activity,why", [
    pytest.param(None, "no readings", id="no-report"),
    pytest.param(smi_memory(None, None, None, 0, library=None), "pynvml: not installed", id="no-library"),
    pytest.param(smi_memory(GIB, GIB, GIB, 1), "1 pynvml reading(s) during the run, 2 needed", id="one-sample"),
    pytest.param(smi_memory(GIB, GIB, GIB, 0, gap=None), "0 pynvml reading(s)", id="no-sample"),
    pytest.param(smi_memory(GIB, GIB, GIB, 40, gap=0.5), "up to 0.5 s apart", id="sparse-readings"),
])
def test_without_enough_readings_the_memory_claim_is_unverified_not_failed(activity: Optional[ActivityReport],
                                                                           why: str) -> None:
    """No SMI library, fewer than two readings, or readings too far apart: the claim is unverified, never failed."""
    found = corroborate(claim(), memory_view(activity))
    assert found.disagreements == []
    assert any(why in line for line in found.unverified), found.unverified


def test_small_or_absent_memory_claims_are_not_held_against_the_readings() -> None:
    """A peak under 256 MiB (the small workload) or none at all is not checked: flat memory fails nothing."""
    flat = memory_view(smi_memory(GIB, GIB, GIB, 40))
    for peak in (None, 200 << 20):
        found = corroborate(claim(peak), flat)
        assert found.disagreements == [] and not any("device memory" in line for line in found.unverified)


def test_a_gpu_the_smi_library_does_not_list_is_unverified() -> None:
    """A device at a PCI address and UUID the sampler has no reading for: the memory claim is unverified."""
    report = smi_memory(GIB, GIB, GIB, 40)
    report = report.model_copy(update={"gpus": [report.gpus[0].model_copy(update={"bdf": "00000000:99:00.0",
                                                                                   "uuid": "GPU-other"})]})
    found = corroborate(claim(), memory_view(report))
    assert "memory_unseen" not in [d.kind for d in found.disagreements]
    assert any("lists no GPU with its UUID or PCI address" in line for line in found.unverified)
