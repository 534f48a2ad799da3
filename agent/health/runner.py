"""Run one health check: spawn the probe where the host's ML jobs run, watch the GPUs, judge, compare, record.

    SMI before the probe ─> other jobs? ─> plan: run (budget?, judge speed?) or defer ──────────────────────┐
    snapshot ─────────────> inventory, pairing ──┐                                                            │
    SMI sampler thread ───> activity, tenants ────┼──> fallback rules ──┐                                     │
    probe (sandbox) ──────> ProbeResult ──────────┴─────────────────────┴──> classify ──> busy? ──> baseline ──> result
                                 └──> corroborate (against root's own inventory, clock, datasheet peaks) ──┘

A host without GPUs is ``skipped`` before anything else (presence.py); the rest runs under the health-check lock
(checklock.py), so that the daemon's check and ``gpuguard health run`` never share the GPUs.

The probe is an argv list (an interpreter, or a container runtime), never a shell line. It runs as the sandbox's
user (sandbox.py) with a clean environment plus NCCL_NVLS_ENABLE=0 and the other NVLink-multicast switches, always.
A GPU that another job uses is never judged on speed (tenants.py): the result is ``busy`` when the functional checks
pass there, ``deferred`` when nothing could run safely, and such a run never touches the baseline.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import threading
import time
import uuid
from pathlib import Path
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from agent.errors import GpuguardError, HostReadError, InputFileError, LibraryUnavailable, StateWriteError
from agent.files import write_atomically
from agent.health.activity import (
    ActivitySampler,
    SmiDevice,
    SmiOccupancy,
    open_reader,
    with_memory_looked_before,
)
from agent.health.baseline import (
    BaselineStore,
    RunSample,
    beyond_limits,
    choose_reference,
    compare,
    fingerprint_of,
    gpu_identities,
    host_limits,
    metrics_of,
    peer_outliers,
    record_run,
    suspicious_baselines,
)
from agent.health.checklock import CheckHolder, CheckLock, acquire_check_lock, read_holder, state_file_error
from agent.health.classify import Verdict, classify
from agent.health.corroborate import corroborate, root_view
from agent.health.fallback import GpuInventory, Vendor, detect_fallback, merge_inventory
from agent.health.launch import Launcher, ProbeOutcome, launch_probe
from agent.health.model import (
    BaselineComparison,
    Fingerprint,
    GpuTenant,
    HealthMode,
    HealthResult,
    MetricRegression,
    OccupancyReport,
    ProbeResult,
    WorkloadResult,
)
from agent.health.parse import parse_probe_output
from agent.health.presence import no_gpu_reason
from agent.health.sandbox import (
    Sandbox,
    docker_ulimits,
    remove_temporary_home,
    resolve_sandbox,
    sandbox_env,
    with_limits,
)
from agent.health.settings import HealthSettings
from agent.health.sku_limits import SkuLimits
from agent.health.tenants import (
    NO_OWN_PROBES,
    OwnProbes,
    Plan,
    decide,
    describe_tenant,
    merge_during,
    occupancy_of,
    process_session,
    tenants_of,
)
from agent.health.workloads import WorkloadContext, gating_failure, run_workloads
from agent.host import Host
from agent.log import get_logger
from agent.snapshot.model import Snapshot
from agent.snapshot.pairing import pairing_of
from agent.statepaths import StatePaths
from agent.wire import FAILED_HEALTH_STATUSES, PASSED_HEALTH_STATUSES

log = get_logger("health")

PROBE_PATH = Path(__file__).with_name("probe.py")
CONTAINER_PROBE_PATH = "/opt/gpuguard/probe.py"
SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1",
            "PYTHONUNBUFFERED": "1"}
_STDERR_TAIL_CHARS = 2000


def probe_args(settings: HealthSettings, device_memory_budget_bytes: Optional[int] = None) -> List[str]:
    """The probe's own options: throttle, a rank deadline that leaves it time to name hung ranks, a memory budget."""
    rank_timeout = max(5.0, settings.timeout_seconds * 0.75)
    budget = ([] if device_memory_budget_bytes is None
              else ["--device-memory-budget-bytes", str(device_memory_budget_bytes)])
    return ["--throttle-fraction", repr(settings.throttle_fraction), "--rank-timeout-seconds", f"{rank_timeout:g}",
            *budget, *settings.probe_args]


def probe_env(base: Mapping[str, str], settings: HealthSettings, sandbox: Optional[Sandbox] = None) -> Dict[str, str]:
    """What the framework needs of the host's environment (PATH, library paths, ROCm/CUDA variables), made safe.

    With a sandbox only those variables pass, with the probe user's own HOME and TMPDIR (sandbox.sandbox_env).
    """
    env = dict(base) if sandbox is None else sandbox_env(base, sandbox)
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
                     container_name: str, device_memory_budget_bytes: Optional[int] = None,
                     sandbox: Optional[Sandbox] = None) -> List[str]:
    """The probe's argv: ``python probe.py ...``, or ``docker run ... IMAGE python /opt/gpuguard/probe.py ...``.

    In a container the sandbox's user becomes ``--user UID:GID`` with its groups (the runtime itself is the agent).
    """
    args = probe_args(settings, device_memory_budget_bytes)
    rlimits = sandbox.rlimits if sandbox is not None else {}
    if settings.container_image is None:
        # Isolated (-I: no user site, no PYTHON* variables, no script directory on sys.path): nothing the probe's
        # user could have left behind runs first. [health] python_path is what PYTHONPATH was, given explicitly.
        return [settings.python, "-I", "-u", str(probe_path), *args,
                *(f"--python-path={path}" for path in settings.python_path)]
    env_args: List[str] = []
    for key, value in sorted({**settings.extra_env, **SAFE_ENV}.items()):
        env_args += ["-e", f"{key}={value}"]
    user_args: List[str] = []
    if sandbox is not None and sandbox.dropped:
        user_args = [f"--user={sandbox.uid}:{sandbox.gid}", *(f"--group-add={g}" for g in sandbox.groups)]
    return [settings.container_runtime, "run", "--rm", "--name", container_name,
            *container_device_args(settings.container_runtime, vendor), *user_args, *docker_ulimits(rlimits),
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
                     launcher: Launcher = launch_probe, probe_path: Path = PROBE_PATH,
                     mode: Optional[HealthMode] = None, lock_wait_seconds: Optional[float] = None,
                     on_lock_wait: Optional[Callable[[str], None]] = None) -> HealthResult:
    """One whole health check; every outcome of the probe is a HealthResult, never an exception.

    ``mode`` overrides ``settings.mode`` for this run (the daemon passes "functional" right after a package change).
    The check holds the health-check lock (checklock.py) while it looks at the GPUs and runs the probe: another
    check running is waited for up to ``lock_wait_seconds`` (default ``[health] check_lock_wait_seconds``),
    ``on_lock_wait`` told once; still running then, the result is ``deferred`` (not recorded as the last result).
    """
    started = time.monotonic()
    started_at = host.clock()
    mode = mode or settings.mode
    # First of all: a host without GPUs has nothing to check (no probe user looked up, no framework imported).
    # require_accelerator = false asks for a CPU run judged like a GPU run (a development box, the tests).
    nothing_to_check = no_gpu_reason(host, snapshot) if settings.require_accelerator else None
    if nothing_to_check is not None:
        log.info("health_skipped_no_gpu", reason=nothing_to_check)
        return _without_probe(host, settings, state_dir, started, started_at, "skipped",
                              f"skipped: {nothing_to_check}", None)
    # A missing probe user is a set-up step (SetupError, the command's own exit code), never a health verdict.
    sandbox = resolve_sandbox(settings, state_dir)
    wait = settings.check_lock_wait_seconds if lock_wait_seconds is None else lock_wait_seconds
    try:
        lock = acquire_check_lock(state_dir, wait, on_lock_wait)
        if lock is None:
            holder = read_holder(state_dir)
            why = (f"another health check is still running ({holder.describe() if holder else 'holder unknown'}) "
                   f"after waiting {wait:g} s")
            log.info("health_deferred", reason=why)
            return _without_probe(host, settings, state_dir, started, started_at, "deferred", f"deferred: {why}",
                                  None, save=False)
        with lock:
            return _run_locked(host, settings, state_dir, snapshot, launcher, probe_path, mode, started, started_at,
                               sandbox, lock)
    finally:
        remove_temporary_home(sandbox)


def _run_locked(host: Host, settings: HealthSettings, state_dir: str, snapshot: Optional[Snapshot],
                launcher: Launcher, probe_path: Path, mode: HealthMode, started: float, started_at: dt.datetime,
                sandbox: Sandbox, lock: CheckLock) -> HealthResult:
    """The check itself, under the health-check lock: look at the GPUs, run the probe, judge, record."""
    own = own_probes(sandbox, lock.previous)
    before, plan = look_before(host, settings, mode, own=own)
    if not plan.run:
        log.info("health_deferred", reason=plan.reason)
        return _without_probe(host, settings, state_dir, started, started_at, "deferred",
                              f"deferred: {plan.reason}", before)
    background: Optional[_SnapshotThenSampler] = None
    watch = _TenantWatch(host, enabled=settings.container_image is None, own=own)
    if snapshot is None and settings.container_image is None:
        # The probe's argv does not depend on the snapshot here: start the probe first and take the snapshot (then
        # start the activity sampler) while it imports its framework, seconds that the snapshot would otherwise add.
        background = _SnapshotThenSampler(host, settings, watch)
        background.start()
    elif snapshot is None:
        from agent.snapshot.take import take_snapshot

        snapshot = take_snapshot(host)
    vendor, snapshot_count = snapshot_inventory(snapshot) if snapshot is not None else (None, 0)
    container_name = f"gpuguard-probe-{uuid.uuid4().hex[:12]}"
    argv = build_probe_argv(settings, probe_path, vendor, container_name, plan.device_memory_budget_bytes, sandbox)

    def stop_container() -> None:
        if settings.container_image is None:
            return
        try:
            host.run([settings.container_runtime, "kill", container_name], timeout_seconds=15)
        except GpuguardError as exc:
            log.warning("health_container_kill_failed", container=container_name, error=str(exc))

    sampler: Optional[ActivitySampler] = None
    if background is None:
        sampler = ActivitySampler(host.load_module, vendor, settings.activity_interval_seconds,
                                  on_occupancy=watch.seen)
        sampler.start()
    log.info("health_probe_started", argv=argv, timeout_seconds=settings.timeout_seconds, user=sandbox.user,
             device_memory_budget_bytes=plan.device_memory_budget_bytes)
    # In a container the probe's pids are the runtime's children, not in the agent's session: a tenant that starts
    # mid-run cannot be told apart from the probe there, so only the look before the run counts.
    sandboxed = sandbox if settings.container_image is None else None
    try:
        # Outside a container the probe's interpreter sets the limits on itself before it becomes the probe.
        exec_argv = argv if sandboxed is None else with_limits(settings.python, argv, sandboxed.rlimits)
        def probe_started(pid: int) -> None:
            watch.probe_started(pid)
            lock.record_probe(pid, sandbox.uid if sandboxed is not None else None)

        # A container's processes are the runtime's (its own PID namespace, stopped by name): not supervised.
        outcome = launcher(exec_argv, probe_env(host.env, settings, sandboxed), settings.timeout_seconds,
                           stop_container, sandbox=sandboxed, on_start=probe_started,
                           supervise=settings.container_image is None)
    finally:
        if background is not None:
            snapshot, sampler = background.join()  # re-raises what the snapshot raised
            vendor, snapshot_count = snapshot_inventory(snapshot)
        assert sampler is not None
        activity = with_memory_looked_before(sampler.stop(), before)
        # The probe's tree has ended: what it wrote goes before any state is written. Without a PID namespace its
        # home is a watched directory on a shared filesystem, which it may have filled for a moment before the
        # watchdog killed it; the state writes below must not meet that full disk.
        remove_temporary_home(sandbox)
    assert snapshot is not None  # given, taken before the probe, or taken beside it (joined above)
    log.info("health_probe_finished", returncode=outcome.returncode, timed_out=outcome.timed_out,
             wall_seconds=round(outcome.wall_seconds, 3))
    parsed = None if outcome.timed_out or outcome.start_error else parse_probe_output(outcome.stdout)
    probe = parsed if isinstance(parsed, ProbeResult) else None
    inventory = merge_inventory(vendor, snapshot_count, activity, settings.expected_gpu_count)
    judgeable = probe is not None and probe.skipped_reason is None and not (
        probe.framework is not None and probe.framework.import_error)
    fallback = detect_fallback(probe, inventory, activity, settings) if judgeable and probe else []
    # Root's own evidence against the probe's claims: a result that disagrees is failed and never reaches a baseline.
    corroboration = corroborate(probe, root_view(snapshot, activity, inventory, outcome.wall_seconds)) \
        if judgeable and probe else None
    disagreements = corroboration.disagreements if corroboration is not None else []
    fingerprint = fingerprint_of(pairing_of(snapshot), probe)
    occupancy = merge_during(before, watch.tenants())
    busy = occupancy.busy_gpus
    judge = plan.judge_performance and not busy
    if busy:
        occupancy = occupancy.model_copy(update={"performance_not_judged": "busy: " + "; ".join(
            f"GPU {g.smi_index}: {', '.join(g.reasons)}" for g in busy)})

    regressions: List[MetricRegression] = []
    comparison: Optional[BaselineComparison] = None
    if judge and probe is not None and classify(outcome, parsed, fallback, [], disagreements).status == "pass":
        regressions, comparison = _judge_against_baselines(probe, fingerprint, settings, state_dir, started_at,
                                                           sku_limits_of(host, snapshot))
    verdict = classify(outcome, parsed, fallback, regressions, disagreements)
    if comparison is not None and comparison.suspicious and verdict.status == "pass":
        verdict = Verdict("pass", f"{verdict.summary}; baseline suspicious, not used: {comparison.suspicious[0]} "
                          "(gpuguard health baseline show|reset)", verdict.failures)
    if verdict.status == "pass" and not judge:
        verdict = _unjudged(verdict, occupancy)
    result = HealthResult(
        status=verdict.status, summary=verdict.summary, started_at=started_at,
        wall_seconds=round(time.monotonic() - started, 3), probe_wall_seconds=round(outcome.wall_seconds, 3),
        probe_argv=list(argv), probe_exit_code=outcome.returncode,
        probe_stderr_tail=outcome.stderr[-_STDERR_TAIL_CHARS:] or None, fingerprint=fingerprint,
        fingerprint_id=fingerprint.id, inventory_gpu_count=inventory.gpu_count, probe=probe, activity=activity,
        fallback_reasons=fallback, corroboration=corroboration, failures=verdict.failures,
        regressions=regressions, baseline=comparison, occupancy=occupancy,
        sandbox=sandbox.report(outcome.memory_limit, outcome.killed_for_memory, outcome.containment,
                               outcome.home_limit, outcome.killed_for_limit))
    if settings.workloads:
        context = WorkloadContext(
            host=host, settings=settings, state_dir=state_dir,
            baselines_path=StatePaths(state_dir).health_workload_baselines, vendor=vendor, fingerprint=fingerprint,
            launcher=launcher, occupancy=occupancy, plan=plan,
            env_for=lambda sb: probe_env(host.env, settings, sb),
            container_device_args=container_device_args(settings.container_runtime, vendor), now=host.clock)
        # After a package change (mode functional) the gating workloads run; on the schedule, every one.
        result = with_workloads(result, run_workloads(context, only_gating=mode == "functional"))
    _save_last(state_dir, result)
    _log_result(result, inventory)
    return result


def with_workloads(result: HealthResult, workloads: List[WorkloadResult]) -> HealthResult:
    """The check's result with its workloads: a gating workload that failed fails a check the probe passed."""
    update: Dict[str, object] = {"workloads": workloads}
    failed = gating_failure(workloads, FAILED_HEALTH_STATUSES)
    if failed is not None and result.status in PASSED_HEALTH_STATUSES:
        update.update(status=failed.status, summary=f"{failed.summary} (the built-in probe: {result.summary})",
                      failures=[*result.failures, *(f"{failed.name}: {f}" for f in failed.failures)])
    return result.model_copy(update=update)


def own_probes(sandbox: Sandbox, previous: Optional[CheckHolder]) -> OwnProbes:
    """gpuguard's own probes for the busy-GPU detection: the dedicated probe user's processes (a sandbox that
    dropped to a user other than root and the agent's), and the probe the lock's previous holder recorded."""
    uid = sandbox.uid if sandbox.dropped and sandbox.uid not in (0, os.geteuid()) else None
    sessions = (((previous.probe_session, previous.probe_uid),)
                if previous is not None and previous.probe_session is not None else ())
    return OwnProbes(uid=uid, sessions=sessions)


def look_before(host: Host, settings: HealthSettings, mode: HealthMode,
                sleep: Callable[[float], None] = time.sleep,
                own: OwnProbes = NO_OWN_PROBES) -> Tuple[OccupancyReport, Plan]:
    """Read every GPU's processes, utilization and free memory before the probe, and decide what may run.

    A GPU busy by its utilization alone is read again ``busy_utilization_confirm_seconds`` later and stays busy only
    when that reading agrees. Without an SMI library nothing is known about other jobs: the check runs as on an idle
    host (and says so).
    """
    try:
        reader = open_reader(host.load_module, None)
    except LibraryUnavailable as exc:
        plan = decide([], settings, mode)
        return OccupancyReport(unavailable_reason=str(exc), mode=mode,
                               performance_not_judged=plan.reason), plan
    try:
        first = reader.occupancy()
        gpus = occupancy_of(host, reader.devices, first, settings, own=own)
        if any(g.busy and not g.tenants and all(r.startswith("utilization ") for r in g.reasons) for g in gpus) \
                and settings.busy_utilization_confirm_seconds > 0:
            sleep(settings.busy_utilization_confirm_seconds)
            gpus = occupancy_of(host, reader.devices, first, settings, confirmed=reader.occupancy(), own=own)
    finally:
        reader.close()
    plan = decide(gpus, settings, mode)
    report = OccupancyReport(library=reader.library, mode=mode, gpus=gpus,
                             device_memory_budget_bytes=plan.device_memory_budget_bytes,
                             performance_not_judged=None if plan.judge_performance else plan.reason)
    return report, plan


def _unjudged(verdict: Verdict, occupancy: OccupancyReport) -> Verdict:
    """A passing run whose speed was not judged: ``busy`` when another job used a GPU, else a pass that says so."""
    busy = occupancy.busy_gpus
    if not busy:
        return Verdict("pass", f"{verdict.summary} (functional only: {occupancy.performance_not_judged})",
                       verdict.failures)
    tenants = [describe_tenant(t) for g in busy for t in g.tenants]
    who = ", ".join(dict.fromkeys(tenants)) or "; ".join(r for g in busy for r in g.reasons)
    gpus = ", ".join(str(g.smi_index) for g in busy)
    return Verdict("busy", f"busy: functional checks passed; GPU {gpus} in use by {who}; performance not judged",
                   verdict.failures)


def _without_probe(host: Host, settings: HealthSettings, state_dir: str, started: float, started_at: dt.datetime,
                   status: str, summary: str, occupancy: Optional[OccupancyReport], save: bool = True) -> HealthResult:
    """A result for a check that launched no probe (deferred, or no GPU to check); ``save``: as the last result."""
    result = HealthResult(status=status, summary=summary, started_at=started_at,
                          wall_seconds=round(time.monotonic() - started, 3),
                          failures=[summary] if status == "failed" else [], occupancy=occupancy)
    if save:
        _save_last(state_dir, result)
    log.info("health_check_done", status=result.status, summary=result.summary, wall_seconds=result.wall_seconds)
    return result


class _TenantWatch:
    """Collects, while the probe runs, the GPUs' processes that are not the probe's (its session is its pid)."""

    def __init__(self, host: Host, enabled: bool, own: OwnProbes = NO_OWN_PROBES) -> None:
        self.host = host
        self.enabled = enabled
        self.own = own
        self._probe_pid: Optional[int] = None
        self._lock = threading.Lock()
        self._seen: Dict[int, Dict[int, GpuTenant]] = {}

    def probe_started(self, pid: int) -> None:
        self._probe_pid = pid

    def _is_own(self, pid: int) -> bool:
        return (self._probe_pid is not None and (pid == self._probe_pid
                                                 or process_session(self.host, pid) == self._probe_pid)
                ) or self.own.is_own(self.host, pid)

    def seen(self, devices: Sequence[SmiDevice], readings: List[SmiOccupancy]) -> None:
        if not self.enabled or self._probe_pid is None:
            return
        for dev, reading in zip(devices, readings):
            for tenant in tenants_of(self.host, reading, "during", self._is_own):
                with self._lock:
                    self._seen.setdefault(dev.smi_index, {}).setdefault(tenant.pid, tenant)

    def tenants(self) -> Dict[int, List[GpuTenant]]:
        with self._lock:
            return {index: list(by_pid.values()) for index, by_pid in self._seen.items()}


class _SnapshotThenSampler:
    """On a thread: take the snapshot, then start the activity sampler for the vendor it found."""

    def __init__(self, host: Host, settings: HealthSettings, watch: Optional[_TenantWatch] = None) -> None:
        self.host, self.settings, self.watch = host, settings, watch
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
            self.sampler = ActivitySampler(self.host.load_module, vendor, self.settings.activity_interval_seconds,
                                           on_occupancy=self.watch.seen if self.watch is not None else None)
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


def sku_limits_of(host: Host, snapshot: Optional[Snapshot]) -> SkuLimits:
    """The physical limits of the host's GPUs as root sees them (the snapshot, sysfs): never the probe's word."""
    def read(path: str) -> Optional[str]:
        try:
            return host.read_text(path, max_chars=64)
        except HostReadError:
            return None

    data = json.loads(snapshot.to_json(indent=None)) if snapshot is not None else None
    return host_limits(gpu_identities(data), read)


def corroborated(probe: ProbeResult, limits: SkuLimits) -> bool:
    """The corroboration seam: whether root believes a passing run enough to let it feed the baseline.

    Until agent/health/corroborate.py lands, what exists: the run passed (the caller only asks then) and every
    compared figure is within the SKU's physical limits. Corroboration's verdict replaces this body.
    """
    return not beyond_limits(metrics_of(probe), limits)


def _judge_against_baselines(probe: ProbeResult, fingerprint: Fingerprint, settings: HealthSettings, state_dir: str,
                             now: dt.datetime, limits: SkuLimits) -> Tuple[List[MetricRegression], BaselineComparison]:
    metrics = metrics_of(probe)
    store = BaselineStore(Path(StatePaths(state_dir).health_baselines))
    try:
        with store.locked():
            data = store.load()
            # A baseline beyond what the SKU can do was captured: it is never used to call a regression.
            suspicious = [s.describe() for s in suspicious_baselines(data, limits)]
            reference = choose_reference(data, fingerprint.id, limits)
            regressions: List[MetricRegression] = []
            bands: Dict[str, float] = {}
            if reference is not None:
                regressions, bands = compare(metrics, reference[0], reference[1], settings)
            regressions += peer_outliers(probe, settings)
            # A throttled run is a test of the alarm, never a sample of the stack's real speed.
            good = not regressions and probe.throttle_fraction == 0
            sample = RunSample(fingerprint=fingerprint, metrics=metrics, good=good,
                               corroborated=corroborated(probe, limits))
            data, recorded = record_run(data, sample, now, settings, limits)
            store.save(data)
    except StateWriteError:
        raise  # a full disk: exit 16, the old file kept
    except OSError as exc:
        raise InputFileError(str(store.path), exc.strerror or str(exc)) from None
    if recorded.refused and good:
        log.warning("health_baseline_refused", fingerprint=fingerprint.id, reasons=list(recorded.refused))
    if recorded.moved is not None:
        log.warning("health_baseline_moved", fingerprint=fingerprint.id, rule=recorded.moved.rule,
                    scopes=recorded.moved.scopes, detail=recorded.moved.detail)
    if suspicious:
        log.warning("health_baseline_suspicious", figures=suspicious[:5], limits=limits.name)
    own = data.records[fingerprint.id]
    comparison = BaselineComparison(
        fingerprint_id=fingerprint.id, reference_fingerprint_id=reference[0] if reference else None,
        reference_runs=len(reference[1].runs) if reference else 0, own_runs=len(own.runs),
        runs_needed=settings.baseline_runs, established=own.established_at is not None, recorded=recorded.joined,
        noise_band_fraction=bands, corroborated=sample.corroborated, refused=list(recorded.refused),
        moved=recorded.moved.rule if recorded.moved is not None else None, sku_limits=limits.name,
        suspicious=suspicious)
    return regressions, comparison


def _save_last(state_dir: str, result: HealthResult) -> None:
    path = StatePaths(state_dir).health_last_result
    try:
        write_atomically(str(path), result.to_json())
    except StateWriteError:
        raise
    except OSError as exc:
        raise state_file_error(str(path), exc) from None


def _log_result(result: HealthResult, inventory: GpuInventory) -> None:
    log.info("health_check_done", status=result.status, summary=result.summary, wall_seconds=result.wall_seconds,
             fingerprint=result.fingerprint_id, inventory_gpus=inventory.gpu_count)
    for reason in result.fallback_reasons:
        log.warning("health_cpu_fallback", code=reason.code, gpu=reason.gpu, message=reason.message)
    for reg in result.regressions:
        log.warning("health_regression", metric=reg.metric, gpu=reg.gpu, against=reg.against,
                    drop_fraction=reg.drop_fraction, threshold_fraction=reg.threshold_fraction)


__all__ = ["run_health_check", "build_probe_argv", "probe_env", "PROBE_PATH", "ProbeOutcome"]
