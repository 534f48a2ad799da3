"""The verdict on one workload run: pure, from how the process ended, what it printed and what root's SMI saw.

In order: the run's own end (timeout, a limit, no report, a forged report, a crash), then CPU fallback (operators
the shim saw compute on the host from the accelerator's data, operators the accelerator lacked, no operator on the
accelerator at all, and root's SMI sampling that saw no GPU's activity rise: the workload's own report cannot
outvote that), then the figures (the metric missing, a regression against the workload's baseline).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Union

from agent.health.fallback import activity_rose
from agent.health.launch import ProbeOutcome
from agent.health.model import ActivityReport, MetricRegression, WorkloadStatus
from agent.health.parse import ParseFailure
from agent.health.workload_parse import WorkloadOutput
from agent.health.workload_settings import WorkloadSettings

# How many fallback operators a summary names before "and N more".
_NAMED = 3


@dataclass(frozen=True)
class WorkloadVerdict:
    status: WorkloadStatus
    summary: str
    failures: List[str]


def _ended(outcome: ProbeOutcome, settings: WorkloadSettings) -> Optional[WorkloadVerdict]:
    if outcome.timed_out:
        why = f"did not finish within {settings.timeout_seconds:g} s (its process tree was killed)"
        return WorkloadVerdict("timeout", f"timeout: {settings.name} {why}", [why])
    for limit in (outcome.start_error, outcome.killed_for_memory, outcome.killed_for_limit, outcome.output_too_large):
        if limit:
            return WorkloadVerdict("failed", f"failed: {settings.name}: {limit}", [limit])
    return None


def fallback_failures(output: WorkloadOutput, activity: Optional[ActivityReport], settings: WorkloadSettings,
                      activity_min_percent: float, require_accelerator: bool) -> List[str]:
    """Every piece of evidence that the workload's work did not run on the accelerator, most specific first."""
    report = output.report
    found: List[str] = []
    if report.fallback_ops:
        rows = sorted(report.fallback_ops, key=lambda r: (-r.calls, r.op))
        named = ", ".join(f"{r.op} ran on the {settings.host_device.upper()} {r.calls} times" for r in rows[:_NAMED])
        more = f" and {len(rows) - _NAMED} more operators" if len(rows) > _NAMED else ""
        found.append(f"{named}{more} (its input came from {settings.accelerator_device})")
    for row in report.unsupported_ops[:_NAMED]:
        found.append(f"{row.op} is not supported on {settings.accelerator_device}: {row.error}")
    if not require_accelerator:
        return found
    if report.instrumented and report.calls_on(settings.accelerator_device) == 0:
        found.append(f"no operator ran on {settings.accelerator_device} "
                     f"({report.calls_on(settings.host_device)} on {settings.host_device})")
    if activity is not None and activity.library is not None and activity.gpus:
        judged = [activity_rose(g, activity_min_percent) for g in activity.gpus]
        if all(j is False for j in judged):
            peak = max((g.max_percent or 0.0) for g in activity.gpus)
            found.append(f"{activity.library} saw no GPU's activity rise while the workload ran (peak {peak:g}%)")
    return found


def judge(outcome: ProbeOutcome, parsed: Optional[Union[WorkloadOutput, ParseFailure]],
          activity: Optional[ActivityReport], settings: WorkloadSettings, activity_min_percent: float,
          require_accelerator: bool, regressions: List[MetricRegression]) -> WorkloadVerdict:
    """The workload's status and a one-line summary naming the workload."""
    name = settings.name
    ended = _ended(outcome, settings)
    if ended is not None:
        return ended
    if parsed is None or isinstance(parsed, ParseFailure):
        why = parsed.reason if isinstance(parsed, ParseFailure) else "no output"
        return WorkloadVerdict("failed", f"failed: {name}: {why}", [why])
    report = parsed.report
    if report.ended.kind != "returned" and report.ended.code != 0:
        why = f"the workload ended with {report.ended.error or f'exit code {report.ended.code}'}"
        return WorkloadVerdict("failed", f"failed: {name}: {why}", [why])
    if outcome.returncode not in (0, None):
        why = f"the workload's process exited {outcome.returncode}"
        return WorkloadVerdict("failed", f"failed: {name}: {why}", [why])
    fallback = fallback_failures(parsed, activity, settings, activity_min_percent, require_accelerator)
    if fallback:
        return WorkloadVerdict("cpu_fallback", f"cpu_fallback: {name}: {fallback[0]}", fallback)
    if settings.metric is not None and settings.metric not in parsed.metrics:
        why = f"the workload did not report its metric {settings.metric} (a gpuguard_result line)"
        return WorkloadVerdict("failed", f"failed: {name}: {why}", [why])
    if regressions:
        r = regressions[0]
        why = (f"{r.metric} {r.current_value:.4g} against {r.baseline_value:.4g} "
               f"({r.drop_fraction:.0%} worse, band {r.threshold_fraction:.0%}) on the stack it moved from: "
               f"{r.baseline_fingerprint}")
        return WorkloadVerdict("regression", f"regression: {name}: {why}", [why])
    figure = (f"{settings.metric} {parsed.metrics[settings.metric]:.4g}" if settings.metric is not None
              else f"{len(parsed.metrics)} figures")
    calls = report.calls_on(settings.accelerator_device)
    where = f", {calls} operator calls on {settings.accelerator_device}" if report.instrumented else ""
    return WorkloadVerdict("pass", f"pass: {name}: {figure}{where}", [])
