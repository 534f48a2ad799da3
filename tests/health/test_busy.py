"""Busy GPUs (issue #20): another job's GPU is never judged on speed; the check runs in its free memory or waits."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Dict, Optional

import pytest

from agent.health.activity import NvmlReader, open_reader
from agent.health.baseline import peer_outliers
from agent.health.launch import ProbeOutcome
from agent.health.model import STATUS_EXIT_CODES, GpuOccupancy, HealthResult
from agent.health.runner import run_health_check
from agent.health.settings import GIB, MIB, HealthSettings
from agent.health.tenants import OwnProbes, budget_for, decide, occupancy_of
from tests.health.helpers import (
    FAKE_PROBE,
    H200_BYTES,
    fake_probe_settings,
    make_fake_amdsmi,
    make_fake_nvml,
    make_host,
    make_snapshot,
)
from tests.health.probe_results import gpu_row, probe

pytestmark = pytest.mark.timeout(60)

IDLE_THEN_WORKING = [[0.0], [97.0]]
TENANT = (4242, 70 * GIB)


def fake_root(tmp_path: Path, names: Dict[int, str]) -> Path:
    """A host root whose /proc knows the given pids' names (what /proc/<pid>/comm says)."""
    root = tmp_path / "root"
    for pid, name in names.items():
        (root / "proc" / str(pid)).mkdir(parents=True)
        (root / "proc" / str(pid) / "comm").write_text(name + "\n")
    root.mkdir(exist_ok=True)
    return root


def check(tmp_path: Path, settings: HealthSettings, modules: Dict[str, Any], root: Optional[Path] = None,
          **kwargs: Any) -> HealthResult:
    return run_health_check(make_host(modules, root=root), settings, str(tmp_path / "state"),
                            snapshot=make_snapshot(), probe_path=FAKE_PROBE, **kwargs)


def baselines(tmp_path: Path) -> Optional[str]:
    path = tmp_path / "state" / "health" / "baselines.json"
    return path.read_text() if path.exists() else None


def establish(tmp_path: Path) -> str:
    """Three idle passing runs: an established baseline; returns the baselines file's text."""
    for _ in range(3):
        assert check(tmp_path, fake_probe_settings(), {"pynvml": make_fake_nvml(IDLE_THEN_WORKING)}).status == "pass"
    text = baselines(tmp_path)
    assert text is not None
    return text


def test_foreign_process_makes_the_gpu_busy_and_names_it(tmp_path: Path) -> None:
    """A GPU another process holds: functional checks in a budget of its free memory, status busy, tenant named."""
    before = establish(tmp_path)
    nvml = make_fake_nvml(IDLE_THEN_WORKING, processes=[[[TENANT]]], free_bytes=[H200_BYTES - TENANT[1]])
    # Throttled by half: were speed judged, this would be a regression.
    result = check(tmp_path, fake_probe_settings(throttle_fraction=0.5), {"pynvml": nvml},
                   root=fake_root(tmp_path, {4242: "python3"}))
    assert result.status == "busy", result.summary
    assert result.exit_code == STATUS_EXIT_CODES["busy"] == 25
    assert "pid 4242 (python3, 70.0 GiB)" in result.summary and result.regressions == []
    budget = int((H200_BYTES - TENANT[1]) * 0.5) - GIB
    assert result.occupancy is not None and result.occupancy.device_memory_budget_bytes == budget
    assert result.probe_argv[result.probe_argv.index("--device-memory-budget-bytes") + 1] == str(budget)
    assert result.probe is not None and result.probe.device_memory_budget_bytes == budget
    assert result.baseline is None and baselines(tmp_path) == before  # a busy run never touches the baseline
    tenant = result.occupancy.gpus[0].tenants[0]
    assert (tenant.pid, tenant.name, tenant.seen, tenant.used_memory_bytes) == (4242, "python3", "before", 70 * GIB)


def test_utilization_alone_makes_the_gpu_busy(tmp_path: Path) -> None:
    """60% utilization before the probe, with no process listed (another PID namespace), is busy too."""
    result = check(tmp_path, fake_probe_settings(), {"pynvml": make_fake_nvml([[60.0], [100.0]])})
    assert result.status == "busy", result.summary
    assert "utilization 60% before the probe started" in result.summary


def test_utilization_of_a_job_that_just_ended_is_not_busy(tmp_path: Path) -> None:
    """NVML averages utilization over its last sample period: a job that ended a moment ago still reads 100% once.
    The second reading (``busy_utilization_confirm_seconds`` later) says idle, so the check runs and is judged (seen
    on the H200: the check right after a tenant's exit read 100% and came out busy)."""
    nvml = make_fake_nvml([[100.0], [0.0], [0.0], [97.0]])
    result = check(tmp_path, fake_probe_settings(), {"pynvml": nvml})
    assert result.status == "pass", result.summary
    assert result.occupancy is not None and not result.occupancy.busy_gpus


def test_utilization_confirmed_by_the_second_reading_is_busy(tmp_path: Path) -> None:
    """GPU utilization seen in two readings before the probe makes the check busy, quoting the lower reading."""
    nvml = make_fake_nvml([[100.0], [80.0], [100.0]])
    result = check(tmp_path, fake_probe_settings(), {"pynvml": nvml})
    assert result.status == "busy", result.summary
    assert "utilization 80% before the probe started" in result.summary  # the lower of the two readings


def test_memory_held_by_the_tenant_defers_without_starting_the_probe(tmp_path: Path) -> None:
    """1 GiB free: even the smallest check does not fit beside the job, so nothing runs (deferred, exit 26)."""
    nvml = make_fake_nvml([[0.0]], processes=[[[(4242, H200_BYTES - GIB)]]], free_bytes=[GIB])

    def no_launch(*args: Any, **kwargs: Any) -> ProbeOutcome:
        raise AssertionError("the probe must not start beside a job holding the GPU's memory")

    result = check(tmp_path, fake_probe_settings(), {"pynvml": nvml}, launcher=no_launch)
    assert result.status == "deferred" and result.exit_code == 26
    assert "too little free device memory" in result.summary and "pid 4242" in result.summary
    saved = json.loads((tmp_path / "state" / "health" / "last.json").read_text())
    assert saved["status"] == "deferred" and saved["occupancy"]["gpus"][0]["busy"] is True


def test_tenant_that_starts_mid_run_makes_the_figures_unjudgeable(tmp_path: Path) -> None:
    """Idle before the probe, a process appears while it runs: busy (its figures would be a false regression)."""
    before = establish(tmp_path)
    nvml = make_fake_nvml(IDLE_THEN_WORKING, processes=[[[]], [[(4343, 8 * GIB)]]])
    result = check(tmp_path, fake_probe_settings(throttle_fraction=0.5), {"pynvml": nvml})
    assert result.status == "busy", result.summary
    gpu = result.occupancy.gpus[0] if result.occupancy else None
    assert gpu is not None and [(t.pid, t.seen) for t in gpu.tenants] == [(4343, "during")]
    assert gpu.tenants[0].name_unresolved is not None  # not in this (fake) /proc: said so
    assert "--device-memory-budget-bytes" not in result.probe_argv  # it was idle when the probe started
    assert baselines(tmp_path) == before


def test_busy_gpu_with_cpu_fallback_is_still_cpu_fallback(tmp_path: Path) -> None:
    """A busy GPU does not hide a CPU fallback, nor a wrong result."""
    nvml = make_fake_nvml([[60.0]], processes=[[[TENANT]]])
    result = check(tmp_path, fake_probe_settings("--mode", "cpu"), {"pynvml": nvml})
    assert result.status == "cpu_fallback", result.summary
    nvml = make_fake_nvml([[60.0], [100.0]], processes=[[[TENANT]]])
    assert check(tmp_path, fake_probe_settings("--mode", "badcheck"), {"pynvml": nvml}).status == "failed"


def test_modes_wait_or_run_functional_only(tmp_path: Path) -> None:
    """mode full and busy_action defer wait on a busy GPU; mode functional on an idle one passes, unjudged."""
    def busy() -> Dict[str, Any]:
        return {"pynvml": make_fake_nvml([[0.0], [97.0]], processes=[[[TENANT]]])}

    assert check(tmp_path, fake_probe_settings(mode="full"), busy()).status == "deferred"
    waited = check(tmp_path, fake_probe_settings(busy_action="defer"), busy())
    assert waited.status == "deferred" and "waiting for idle GPUs" in waited.summary
    assert check(tmp_path, fake_probe_settings(), busy(), mode="full").status == "deferred"
    functional = check(tmp_path, fake_probe_settings(throttle_fraction=0.5),
                       {"pynvml": make_fake_nvml(IDLE_THEN_WORKING)}, mode="functional")
    assert functional.status == "pass" and "functional only" in functional.summary
    assert functional.baseline is None and baselines(tmp_path) is None


def test_amdsmi_process_list_and_vram(tmp_path: Path) -> None:
    """amdsmi: the process list's pid, name and VRAM, and the VRAM usage in MB, give the tenant and the budget."""
    amdsmi = make_fake_amdsmi([0.0], processes=[[{"name": "pt_main_thread", "pid": 777, "mem": 1,
                                                  "memory_usage": {"gtt_mem": 0, "cpu_mem": 0,
                                                                   "vram_mem": 150 * GIB}}]],
                              vram_used_mb=[150 * 1024])
    result = run_health_check(make_host({"amdsmi": amdsmi}), fake_probe_settings(), str(tmp_path / "state"),
                              snapshot=make_snapshot(nvidia_gpus=0), probe_path=FAKE_PROBE)
    occ = result.occupancy
    assert occ is not None and occ.library == "amdsmi"
    tenant = occ.gpus[0].tenants[0]
    assert (tenant.pid, tenant.name, tenant.used_memory_bytes) == (777, "pt_main_thread", 150 * GIB)
    assert occ.gpus[0].memory_free_bytes == (196592 - 150 * 1024) * MIB
    assert occ.device_memory_budget_bytes == int((196592 - 150 * 1024) * MIB * 0.5) - GIB


def test_nvml_reader_skips_the_not_available_memory_marker() -> None:
    """NVML's usedGpuMemory None (not available, e.g. without privileges) is an unknown amount, not an error."""
    reader = NvmlReader(make_fake_nvml([[0.0]], processes=[[[(9, None)]]]))
    (occ,) = reader.occupancy()
    assert occ.processes is not None and occ.processes[0].pid == 9 and occ.processes[0].used_memory_bytes is None
    assert occ.memory_total_bytes == H200_BYTES


@pytest.mark.parametrize("free,expected", [(None, 256 * MIB), (100 * GIB, 49 * GIB), (GIB, 0)])
def test_budget_is_a_fraction_of_the_least_free_memory(free: Optional[int], expected: int) -> None:
    """Half the free memory less a 1 GiB reserve; unknown free memory gets the minimum (smallest sizes)."""
    gpus = [GpuOccupancy(smi_index=0, memory_free_bytes=free, busy=True),
            GpuOccupancy(smi_index=1, memory_free_bytes=None if free is None else 2 * free, busy=True)]
    assert budget_for(gpus, HealthSettings()) == expected


def test_decide_without_tenants_judges_speed() -> None:
    """Idle GPUs: run the full workload and judge it."""
    plan = decide([GpuOccupancy(smi_index=0)], HealthSettings(), "auto")
    assert plan.run and plan.judge_performance and plan.device_memory_budget_bytes is None


def test_peer_outlier_against_the_mean_of_the_others_skips_busy_gpus() -> None:
    """A GPU 15% under the mean of its peers is named; with a 20% tolerance it is not; a busy GPU is no one's peer."""
    run = probe([gpu_row(0), gpu_row(1), gpu_row(2, gemm=637.5), gpu_row(3, gemm=300.0)])
    named = peer_outliers(run, HealthSettings(), skip={3})
    assert [(r.gpu, r.metric, r.against, r.baseline_value) for r in named] == [
        (2, "gemm_bf16_tflops", "peers", 750.0)]
    assert peer_outliers(run, HealthSettings(peer_tolerance_fraction=0.2), skip={3}) == []


def test_memory_in_use_with_no_process_listed_is_busy(tmp_path: Path) -> None:
    """60 GiB used and no process listed (a library that cannot see them): busy, said so, budget from what is free."""
    nvml = make_fake_nvml(IDLE_THEN_WORKING, free_bytes=[H200_BYTES - 60 * GIB])
    result = check(tmp_path, fake_probe_settings(), {"pynvml": nvml})
    assert result.status == "busy", result.summary
    assert "60.0 GiB of device memory in use by processes not listed" in result.summary
    assert result.occupancy is not None
    assert result.occupancy.device_memory_budget_bytes == int((H200_BYTES - 60 * GIB) * 0.5) - GIB


def proc_entry(root: Path, pid: int, name: str, uid: int, session: int) -> None:
    """/proc/<pid>/{comm,status,stat} under a fake root: the process's name, real uid and session id."""
    base = root / "proc" / str(pid)
    base.mkdir(parents=True)
    (base / "comm").write_text(name + "\n")
    (base / "status").write_text(f"Name:\t{name}\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\n")
    (base / "stat").write_text(f"{pid} ({name}) S 1 {session} {session} 0 -1\n")


def test_own_probe_is_never_a_tenant_and_a_foreign_job_still_is(tmp_path: Path) -> None:
    """gpuguard's probe (the probe user's uid, or a probe session the check lock recorded) is no tenant; a job of
    another user is, though all are called python3 and one sits in a reused pid of a recorded session."""
    root = tmp_path / "root"
    proc_entry(root, 5001, "python3", uid=998, session=5001)   # the probe user's: another check's probe
    proc_entry(root, 7001, "python3", uid=997, session=7000)   # a rank of the probe a killed check left behind
    proc_entry(root, 7002, "python3", uid=1000, session=7000)  # not of that probe: another user in that session id
    proc_entry(root, 4242, "python3", uid=1000, session=4242)  # a training job
    nvml = make_fake_nvml([[0.0]], processes=[[[(5001, GIB), (7001, GIB), (7002, GIB), (4242, 70 * GIB)]]])
    reader = open_reader(make_host({"pynvml": nvml}, root=root).load_module, "nvidia")
    own = OwnProbes(uid=998, sessions=((7000, 997),))
    (gpu,) = occupancy_of(make_host(root=root), reader.devices, reader.occupancy(), fake_probe_settings(), own=own)
    assert sorted(t.pid for t in gpu.tenants) == [4242, 7002]
    (unaware,) = occupancy_of(make_host(root=root), reader.devices, reader.occupancy(), fake_probe_settings())
    assert sorted(t.pid for t in unaware.tenants) == [4242, 5001, 7001, 7002]  # what the old detection said


def test_check_lock_record_of_a_left_probe_keeps_it_out_of_the_tenants(tmp_path: Path) -> None:
    """A probe a killed check left on the GPU (named in the check lock's record) does not make the next check busy."""
    root = tmp_path / "root"
    proc_entry(root, 7001, "python3", uid=os.geteuid(), session=7000)
    lock = tmp_path / "state" / "health" / "check.lock"
    lock.parent.mkdir(parents=True)
    lock.write_text(json.dumps({"pid": 6999, "started_at": "2026-01-01T00:00:00+00:00", "probe_session": 7000,
                                "probe_uid": os.geteuid()}))
    nvml = make_fake_nvml(IDLE_THEN_WORKING, processes=[[[(7001, GIB)]]])
    result = check(tmp_path, fake_probe_settings(), {"pynvml": nvml}, root=root)
    assert result.status == "pass", result.summary
    assert result.occupancy is not None and result.occupancy.gpus[0].tenants == []
