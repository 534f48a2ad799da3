"""Health-gated rollback under real apt and dpkg: an allowed driver + ROCm upgrade whose post-change check falls back
to the CPU is rolled back to the exact previous versions, reported with reason health, and checked again."""

from __future__ import annotations

import contextlib
import types
from pathlib import Path
from typing import Any, Iterator, List, Optional

import pytest

from agent.config import Settings
from agent.daemon_jobs.health import HealthJob
from agent.daemon_jobs.hooks import Hooks
from agent.daemon_jobs.resident_settings import SettingsInForce
from agent.daemon_jobs.runtime import EventEmitter, Runtime
from agent.host import Host
from agent.report.outbox import Outbox
from tests.guard.apt.chroot.conftest import gpuguard
from tests.guard.apt.chroot.harness import AMDGPU_63, BASELINE, ROCM_63, Chroot
from tests.guard.wiring import check, cpu_fallback_payloads, health_job, health_rollback

pytestmark = pytest.mark.timeout(600)

STACK = ("amdgpu-dkms", "rocm-core", "rocm-hip-runtime")
HEALTH_POLICY = '[health]\nafter_change = "rollback"\n'


class ProbeOfThisRoot:
    """Stands in for run_health_check: ROCm 6.3 in the chroot "falls back to the CPU", anything else passes."""

    def __init__(self, chroot: Chroot) -> None:
        self.chroot = chroot
        self.seen: List[tuple] = []

    def __call__(self, host: Host, settings: Any, state_dir: str, snapshot: Any = None,
                 mode: Optional[str] = None) -> Any:
        rocm = self.chroot.installed().get("rocm-core")
        status = "cpu_fallback" if rocm == ROCM_63 else "pass"
        self.seen.append((mode, rocm, status))
        return types.SimpleNamespace(status=status, occupancy=None)




@contextlib.contextmanager
def _health_policy(chroot: Chroot) -> Iterator[Host]:
    """The chroot's host with HEALTH_POLICY compiled; afterwards the policy file and both reboot markers gone."""
    policy_file = chroot.root / "etc/gpuguard/policy.d/20-health.toml"
    policy_file.write_text(HEALTH_POLICY)
    try:
        code, out = gpuguard(chroot, "policy", "compile")
        assert code == 0, out
        yield Host.for_root(str(chroot.root))
    finally:
        policy_file.unlink(missing_ok=True)
        (chroot.root / "var/run/reboot-required").unlink(missing_ok=True)
        (chroot.root / "var/run/reboot-required.pkgs").unlink(missing_ok=True)


def test_cpu_fallback_after_an_allowed_upgrade_restores_the_exact_previous_versions(chroot: Chroot,
                                                                                    tmp_path: Path) -> None:
    """Real apt: a CPU fallback after an allowed upgrade restores the exact previous versions once, with both reboot
    markers."""
    with _health_policy(chroot) as host:
        settings = Settings()
        # The change the policy allows (the rocm-6.3 pairing), through apt and the hook; the guard records it.
        result = chroot.apt("install", f"amdgpu-dkms={AMDGPU_63}", f"rocm-core={ROCM_63}",
                            f"rocm-hip-runtime={ROCM_63}")
        assert result.returncode == 0, result.stdout + result.stderr
        checked = check(host, settings, snapshot=lambda h: None)
        assert checked.status == "recorded", checked.summary()
        assert (chroot.state_dir / "known-good.before-change.json").exists()

        outbox = Outbox(str(tmp_path / "outbox.sqlite3"))
        emitter = EventEmitter(outbox, "test-host", "chroot", host.clock)
        rt = Runtime(host=host, in_force=SettingsInForce.of(settings), state_dir=str(tmp_path), outbox=outbox,
                     emitter=emitter)
        probe = ProbeOfThisRoot(chroot)

        def rollback(*args: Any, **kwargs: Any) -> Any:
            return health_rollback(*args, snapshot=lambda h: None, **kwargs)

        job = HealthJob(rt, Hooks(health_run=probe, health_payloads=cpu_fallback_payloads, health_rollback=rollback))
        summary = job.check("stack_changed:dpkg,amdgpu,rocm", "functional", after_change=True)

        installed = chroot.installed()
        assert {n: installed.get(n) for n in STACK} == {n: BASELINE[n] for n in STACK}
        assert chroot.run("apt-get", "check").returncode == 0
        assert (summary.rollback, summary.recheck_status, summary.status) == ("rolled_back", "pass", "pass")
        assert probe.seen == [("functional", ROCM_63, "cpu_fallback"), ("functional", BASELINE["rocm-core"], "pass")]
        events = [(e.kind, e.severity) for e in outbox.pending(10)]
        assert events == [("cpu_fallback", "critical"), ("rollback", "warning")]
        rolled = outbox.pending(10)[1].payload
        assert (rolled.reason, rolled.health_status, rolled.succeeded, rolled.reboot_required) == (
            "health", "cpu_fallback", True, True)
        assert rolled.to_versions == {n: BASELINE[n] for n in STACK}
        # amdgpu-dkms is a kernel module package: gpuguard's marker and Debian's.
        assert "amdgpu-dkms" in (chroot.state_dir / "reboot-required.pkgs").read_text()
        assert (chroot.root / "var/run/reboot-required").read_text() == "*** System restart required ***\n"
        assert "amdgpu-dkms" in (chroot.root / "var/run/reboot-required.pkgs").read_text().split()
        assert not (chroot.state_dir / "known-good.before-change.json").exists()

        # The guard records the restored set; the set it replaced is the one health removed: never restored again.
        assert check(host, settings, snapshot=lambda h: None).status == "recorded"
        again = health_rollback(host, settings, "cpu_fallback", sink=lambda event: None)
        assert again.status == "refused", again.detail
        assert {n: chroot.installed().get(n) for n in STACK} == {n: BASELINE[n] for n in STACK}
        outbox.close()


def test_the_gate_restores_the_last_set_that_passed_when_the_check_comes_before_the_guards(chroot: Chroot,
                                                                                         tmp_path: Path) -> None:
    """Real apt: with the health gate wired, a pass records the baseline; an allowed upgrade checked by health before
    the guard has seen it (no set kept before it) falls back to the CPU and is rolled back to that baseline."""
    with _health_policy(chroot) as host:
        settings = Settings()
        assert check(host, settings, snapshot=lambda h: None).status in ("recorded", "compliant")
        probe = ProbeOfThisRoot(chroot)
        job = health_job(host, settings, tmp_path, probe, cpu_fallback_payloads)
        assert job.check("interval", None).status == "pass"  # the baseline: the last set that passed
        result = chroot.apt("install", f"amdgpu-dkms={AMDGPU_63}", f"rocm-core={ROCM_63}",
                            f"rocm-hip-runtime={ROCM_63}")
        assert result.returncode == 0, result.stdout + result.stderr
        assert not (chroot.state_dir / "known-good.before-change.json").exists()  # the guard has not checked yet
        summary = job.check("stack_changed:dpkg,amdgpu,rocm", "functional", after_change=True)
        assert (summary.rollback, summary.recheck_status, summary.status) == ("rolled_back", "pass", "pass")
        installed = chroot.installed()
        assert {n: installed.get(n) for n in STACK} == {n: BASELINE[n] for n in STACK}
        assert chroot.run("apt-get", "check").returncode == 0
        rolled = [e.payload for e in job.runtime.outbox.pending(10) if e.kind == "rollback"]
        assert [r.succeeded for r in rolled] == [True] and "1 package change(s)" in (rolled[0].detail or "")
        job.runtime.outbox.close()


# A registered workload whose throughput halves under ROCm 6.3 in the chroot (it reads the chroot's dpkg status).
SLOWER_ON_63 = '''
import json, os, torch
status = open(os.environ["CHROOT_DPKG_STATUS"]).read()
rocm = status.split("Package: rocm-core\\n", 1)[1].split("Version: ", 1)[1].split("\\n", 1)[0]
x = torch.randn(8, 8)
(x @ x).sum()
print(json.dumps({"gpuguard_result": {"samples_per_second": 50.0 if rocm == os.environ["SLOW_ROCM"] else 100.0}}))
'''


def test_a_workload_regression_after_an_allowed_upgrade_is_rolled_back(chroot: Chroot, tmp_path: Path) -> None:
    """Real apt and a real registered workload: its baseline is learned on the old stack, the allowed ROCm 6.3
    upgrade halves its figure, the post-change check is a regression naming it, and the change is rolled back."""
    import importlib.util

    from agent.health.runner import run_health_check
    from agent.health.workload_settings import WorkloadSettings
    from tests import needs
    from tests.health.helpers import FAKE_PROBE, fake_probe_settings, make_fake_nvml, make_host, make_snapshot

    if importlib.util.find_spec("torch") is None:
        needs.unavailable("workload tests with PyTorch", "torch is not installed (pip install -e '.[probe]')")
    script = tmp_path / "workload.py"
    script.write_text(SLOWER_ON_63)
    health = fake_probe_settings(baseline_runs=2, extra_env={
        "CHROOT_DPKG_STATUS": str(chroot.root / "var/lib/dpkg/status"), "SLOW_ROCM": ROCM_63},
        workloads=[WorkloadSettings(name="team-model", script=str(script), metric="samples_per_second",
                                    accelerator_device="cpu", host_device="meta")])
    statuses: List[tuple] = []

    def run_check(host: Host, settings: Any, state_dir: str, snapshot: Any = None, mode: Optional[str] = None) -> Any:
        rocm = chroot.installed().get("rocm-core")
        # The stack the workload's baseline is keyed by follows the chroot's ROCm.
        fake = make_snapshot(driver="580.159.04" if rocm != ROCM_63 else "590.44.01")
        result = run_health_check(make_host({"pynvml": make_fake_nvml([[0.0], [97.0]])}), health,
                                  str(tmp_path / "health-state"), snapshot=fake, probe_path=FAKE_PROBE, mode=mode)
        statuses.append((rocm, result.status))
        return result

    def payloads(result: Any) -> List[Any]:
        return []

    with _health_policy(chroot) as host:
        settings = Settings()
        assert check(host, settings, snapshot=lambda h: None).status in ("recorded", "compliant")
        job = health_job(host, settings, tmp_path, run_check, payloads)
        assert [job.check("interval", None).status for _ in range(2)] == ["pass", "pass"]  # the baseline
        result = chroot.apt("install", f"amdgpu-dkms={AMDGPU_63}", f"rocm-core={ROCM_63}",
                            f"rocm-hip-runtime={ROCM_63}")
        assert result.returncode == 0, result.stdout + result.stderr
        summary = job.check("stack_changed:dpkg,amdgpu,rocm", "functional", after_change=True)
        assert (summary.rollback, summary.recheck_status, summary.status) == ("rolled_back", "pass", "pass")
        assert statuses[2] == (ROCM_63, "regression")
        installed = chroot.installed()
        assert {n: installed.get(n) for n in STACK} == {n: BASELINE[n] for n in STACK}
        assert chroot.run("apt-get", "check").returncode == 0
        job.runtime.outbox.close()
