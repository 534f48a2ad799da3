"""Run the team's registered workloads (``[[health.workloads]]``) after the built-in probe, under the same lock.

Each workload runs through gpuguard's shim (workload_shim.py) as the probe does: as the sandbox's user with a fresh
home, its limits, the reaper's watch over its whole tree, bounded output, a clean environment; in a container with
the shim mounted read-only when it names an image. Root samples the GPUs' SMI activity while it runs (the evidence
the workload's own report cannot outvote), and what the workload reports is judged by workload_judge.py and held
against its own baseline per stack (workload_baseline.py).

The runner (runner.py) hands over what the probe's run already knows (the GPUs' vendor, the look before the run,
how the environment is built) in a ``WorkloadContext``, so this module needs nothing of runner.py.
"""

from __future__ import annotations

import datetime as dt
import secrets
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from agent.errors import GpuguardError
from agent.health import workload_baseline
from agent.health.activity import ActivitySampler
from agent.health.fallback import Vendor
from agent.health.launch import Launcher, ProbeOutcome
from agent.health.model import (
    WORKLOAD_NONCE_ENV,
    ActivityReport,
    Fingerprint,
    OccupancyReport,
    ShimReport,
    WorkloadResult,
    WorkloadStack,
)
from agent.health.parse import ParseFailure
from agent.health.sandbox import Sandbox, docker_ulimits, remove_temporary_home, resolve_sandbox, with_limits
from agent.health.settings import HealthSettings
from agent.health.tenants import Plan
from agent.health.workload_judge import judge
from agent.health.workload_parse import WorkloadOutput, parse_workload_output
from agent.health.workload_settings import WorkloadSettings
from agent.host import Host
from agent.log import get_logger

log = get_logger(__name__)

SHIM_PATH = Path(__file__).with_name("workload_shim.py")
CONTAINER_SHIM_PATH = "/opt/gpuguard/workload_shim.py"
_STDERR_TAIL_CHARS = 2000


@dataclass(frozen=True)
class WorkloadContext:
    """What the health check's run hands to the workloads (runner.py builds it)."""

    host: Host
    settings: HealthSettings
    state_dir: str
    baselines_path: str
    vendor: Optional[Vendor]
    fingerprint: Fingerprint
    launcher: Launcher
    # The check's look at the GPUs before the probe (other jobs, a budget): the workloads run in the same check,
    # under the same lock, right after the probe (a GPU just used by the probe would read busy for a moment).
    occupancy: OccupancyReport
    plan: Plan
    # The environment for a run outside a container (the probe's: the sandbox's variables, SAFE_ENV).
    env_for: Callable[[Optional[Sandbox]], Dict[str, str]]
    # The runtime's flags that give a container the host's GPUs.
    container_device_args: Sequence[str]
    now: Callable[[], dt.datetime]
    shim_path: Path = SHIM_PATH


def shim_args(workload: WorkloadSettings, python_path: Sequence[str], in_container: bool) -> List[str]:
    """The shim's own options, then ``--`` and the workload's arguments."""
    what = ["--module", workload.module] if workload.module is not None else ["--script", str(workload.script)]
    paths = [] if in_container else [f"--python-path={p}" for p in python_path]
    return [*what, "--instrument", "ops" if workload.instrument_ops else "none",
            "--accelerator", workload.accelerator_device, "--host-device", workload.host_device, *paths,
            "--", *workload.args]


def build_argv(ctx: WorkloadContext, workload: WorkloadSettings, container_name: str,
               sandbox: Optional[Sandbox]) -> List[str]:
    """``python -I -u workload_shim.py ...``, or ``docker run ... IMAGE python /opt/gpuguard/workload_shim.py ...``.

    In a container the nonce travels as ``-e NAME`` with no value: the runtime takes it from its own environment,
    so it never shows in a process listing.
    """
    settings = ctx.settings
    if workload.container_image is None:
        return [settings.python, "-I", "-u", str(ctx.shim_path), *shim_args(workload, settings.python_path, False)]
    env_args: List[str] = ["-e", WORKLOAD_NONCE_ENV]
    for key, value in sorted(settings.extra_env.items()):
        env_args += ["-e", f"{key}={value}"]
    user_args: List[str] = []
    if sandbox is not None and sandbox.dropped:
        user_args = [f"--user={sandbox.uid}:{sandbox.gid}", *(f"--group-add={g}" for g in sandbox.groups)]
    return [settings.container_runtime, "run", "--rm", "--name", container_name, *ctx.container_device_args,
            *user_args, *docker_ulimits(sandbox.rlimits if sandbox is not None else {}),
            "-v", f"{ctx.shim_path}:{CONTAINER_SHIM_PATH}:ro", *env_args, *settings.container_args,
            workload.container_image, settings.container_python, CONTAINER_SHIM_PATH,
            *shim_args(workload, [], True)]


def stack_of(fingerprint: Fingerprint, report: Optional[ShimReport], workload: WorkloadSettings) -> WorkloadStack:
    """The stack a workload's figures belong to: the host's driver and ROCm/CUDA, its framework, its image."""
    framework = None
    if report is not None and report.torch is not None and report.torch.version:
        build = (f" (ROCm {report.torch.hip})" if report.torch.hip
                 else f" (CUDA {report.torch.cuda})" if report.torch.cuda else "")
        framework = f"torch {report.torch.version}{build}"
    return WorkloadStack(gpu_models=fingerprint.gpu_models, driver=fingerprint.driver,
                         gpu_stack=fingerprint.gpu_stack, framework=framework, image=workload.container_image)


def run_workloads(ctx: WorkloadContext, only_gating: bool) -> List[WorkloadResult]:
    """Every registered workload (the gating ones only after a change), one after the other; never raises for what
    a workload does."""
    chosen = [w for w in ctx.settings.workloads if w.gates or not only_gating]
    return [run_one(ctx, workload) for workload in chosen]


def run_one(ctx: WorkloadContext, workload: WorkloadSettings) -> WorkloadResult:
    """One workload: look at the GPUs, run it in a fresh sandbox while root samples the GPUs, judge, compare."""
    started = time.monotonic()
    occupancy, plan = ctx.occupancy, ctx.plan
    if not plan.run:
        return WorkloadResult(name=workload.name, status="deferred", gates=workload.gates,
                              summary=f"deferred: {workload.name}: {plan.reason}", wall_seconds=0.0)
    busy = bool(occupancy.busy_gpus)
    free = min((g.memory_free_bytes for g in occupancy.gpus if g.busy and g.memory_free_bytes is not None),
               default=None)
    if busy and workload.device_memory_budget_bytes is not None and free is not None \
            and free < workload.device_memory_budget_bytes:
        why = (f"a GPU is busy with {free} bytes free, under the workload's budget of "
               f"{workload.device_memory_budget_bytes} bytes")
        return WorkloadResult(name=workload.name, status="deferred", gates=workload.gates,
                              summary=f"deferred: {workload.name}: {why}", wall_seconds=0.0)
    sandbox = resolve_sandbox(ctx.settings, ctx.state_dir)
    nonce = secrets.token_hex(16)
    try:
        outcome, activity = _launch(ctx, workload, sandbox, nonce)
    finally:
        # What the workload wrote goes before any state is written (runner.py says why).
        remove_temporary_home(sandbox)
    return _judged(ctx, workload, outcome, activity, nonce, busy, started)


def _launch(ctx: WorkloadContext, workload: WorkloadSettings, sandbox: Sandbox, nonce: str
            ) -> Tuple[ProbeOutcome, Optional[ActivityReport]]:
    settings = ctx.settings
    in_container = workload.container_image is not None
    sandboxed = None if in_container else sandbox
    container_name = f"gpuguard-workload-{uuid.uuid4().hex[:12]}"
    argv = build_argv(ctx, workload, container_name, sandbox)
    env = ctx.env_for(sandboxed)
    env[WORKLOAD_NONCE_ENV] = nonce

    def stop_container() -> None:
        if not in_container:
            return
        try:
            ctx.host.run([settings.container_runtime, "kill", container_name], timeout_seconds=15)
        except GpuguardError as exc:
            log.warning("health_container_kill_failed", container=container_name, error=str(exc))

    sampler = ActivitySampler(ctx.host.load_module, ctx.vendor, settings.activity_interval_seconds)
    sampler.start()
    log.info("health_workload_started", workload=workload.name, argv=argv, user=sandbox.user,
             timeout_seconds=workload.timeout_seconds)
    try:
        exec_argv = argv if sandboxed is None else with_limits(settings.python, argv, sandboxed.rlimits)
        outcome = ctx.launcher(exec_argv, env, workload.timeout_seconds, stop_container, sandbox=sandboxed,
                               supervise=not in_container)
    finally:
        activity = sampler.stop()
    return outcome, activity


def _judged(ctx: WorkloadContext, workload: WorkloadSettings, outcome: ProbeOutcome,
            activity: Optional[ActivityReport], nonce: str, busy: bool, started: float) -> WorkloadResult:
    settings = ctx.settings
    parsed: Optional[object] = None
    if not (outcome.timed_out or outcome.start_error):
        parsed = parse_workload_output(outcome.stdout, nonce)
    output = parsed if isinstance(parsed, WorkloadOutput) else None
    report = output.report if output is not None else None
    stack = stack_of(ctx.fingerprint, report, workload)
    first = judge(outcome, parsed if isinstance(parsed, (WorkloadOutput, ParseFailure)) else None, activity,
                  workload, settings.activity_min_percent, settings.require_accelerator, [])
    regressions = []
    runs = 0
    if first.status == "pass" and output is not None and not busy:
        data = workload_baseline.load(ctx.baselines_path)
        ref = workload_baseline.reference(data, workload.name, stack.id)
        regressions = workload_baseline.compare(output.metrics, workload, ref) if ref is not None else []
        if not regressions:
            data = workload_baseline.record(data, workload.name, stack, output.metrics, ctx.now(),
                                            settings.baseline_runs)
            workload_baseline.save(ctx.baselines_path, data)
        runs = workload_baseline.runs_on(data, workload.name, stack.id)
    verdict = first if not regressions else judge(outcome, output, activity, workload,
                                                  settings.activity_min_percent, settings.require_accelerator,
                                                  regressions)
    if verdict.status == "pass" and busy:
        verdict = type(verdict)("busy", f"busy: {verdict.summary[len('pass: '):]} (a GPU is in use by another job: "
                                "its figures were not compared)", [])
    result = WorkloadResult(
        name=workload.name, status=verdict.status, summary=verdict.summary, gates=workload.gates,
        wall_seconds=round(time.monotonic() - started, 3), exit_code=outcome.returncode,
        metrics=output.metrics if output is not None else {}, stack=stack, stack_id=stack.id,
        fallback_ops=list(report.fallback_ops) if report is not None else [],
        unsupported_ops=list(report.unsupported_ops) if report is not None else [],
        accelerator_calls=report.calls_on(workload.accelerator_device) if report is not None else 0,
        host_calls=report.calls_on(workload.host_device) if report is not None else 0,
        instrumented=report.instrumented if report is not None else False, failures=verdict.failures,
        regressions=regressions, baseline_runs=runs,
        stderr_tail=outcome.stderr[-_STDERR_TAIL_CHARS:] or None)
    log.info("health_workload_finished", workload=workload.name, status=result.status, summary=result.summary,
             wall_seconds=result.wall_seconds)
    return result


def gating_failure(results: Sequence[WorkloadResult], failed_statuses: Sequence[str]) -> Optional[WorkloadResult]:
    """The first gating workload whose status fails the check."""
    return next((r for r in results if r.gates and r.status in failed_statuses), None)

