"""Classification (pure): one status for a health check, in a fixed order of precedence.

    timeout       the probe ran past its timeout and was killed
    failed        the probe could not start, crashed, printed more than the agent reads (launch.OUTPUT_CAP_BYTES),
                  printed no usable result, or its framework cannot import
    skipped       no ML framework is installed where the probe ran ("skipped: no framework", never a pass)
    failed        the result disagrees with what root saw itself (corroborate.py: more GPUs than the host has, a
                  GPU twice, an impossible time or figure, a figure above the SKU's peak): nothing else in it is
                  believed, so this comes before the fallback rules that read it
    cpu_fallback  evidence that the work did not run on the host's GPUs (see fallback.py); beats failed checks,
                  because a CPU that computes wrongly is still first of all not the GPU
    failed        a check went wrong: numerics, copy, training, checkpoint, collective sum, a rank
    regression    a figure dropped beyond its noise band (against the baseline, or against the other GPUs)
    pass          none of the above

Two statuses are the runner's, never this function's (runner.py, tenants.py): ``deferred`` when no probe ran
because another job holds a GPU, and ``busy`` in place of a pass when another job used a GPU, so that the speed was
not judged. Everything above ``regression`` keeps its status on a busy GPU.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional, Sequence, Union

from agent.health.corroborate import disagreement_lines
from agent.health.launch import ProbeOutcome
from agent.health.model import FallbackReason, HealthStatus, MetricRegression, ProbeDisagreement, ProbeResult
from agent.health.parse import ParseFailure


@dataclass(frozen=True)
class Verdict:
    """The status, a one-line summary, and the evidence behind it."""

    status: HealthStatus
    summary: str
    failures: List[str] = field(default_factory=list)


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1][:300] if lines else "no output"


def check_failures(probe: ProbeResult) -> List[str]:
    """Every check the probe reports as failed, each named by GPU index or rank."""
    failures: List[str] = [f"probe: {e.splitlines()[0]}" for e in probe.errors if e.strip()][:3]
    for gpu in probe.gpus:
        where = f"GPU {gpu.index}" if gpu.device != "cpu" else f"{gpu.device} {gpu.index}"
        failures.extend(f"{where}: {err}" for err in gpu.errors)
        if gpu.gemm_reference_ok is False:
            failures.append(f"{where}: {gpu.gemm_dtype} GEMM differs from the fp32 reference "
                            f"(relative error {gpu.gemm_reference_rel_error})")
        if gpu.copy_verified is False:
            failures.append(f"{where}: device copy produced different data")
        if gpu.train_ok is False:
            failures.append(f"{where}: training steps did not lower a finite loss "
                            f"({gpu.train_loss_first} -> {gpu.train_loss_last})")
        if gpu.checkpoint_ok is False:
            failures.append(f"{where}: checkpoint save/load round trip changed the weights or optimizer state")
    if probe.collective is not None:
        missing = set(range(probe.collective.world_size)) - {g.index for g in probe.gpus}
        failures.extend(f"rank {r}: reported no figures" for r in sorted(missing))
        for rank in probe.collective.ranks:
            if rank.status != "ok":
                failures.append(f"rank {rank.rank}: all-reduce {rank.status}: {rank.error or 'no detail'}")
        if probe.collective.sum_correct is False:
            failures.append(f"all-reduce over {probe.collective.world_size} ranks gave a wrong sum")
    return failures


def classify(outcome: ProbeOutcome, parsed: Optional[Union[ProbeResult, ParseFailure]],
             fallback: Sequence[FallbackReason], regressions: Sequence[MetricRegression],
             disagreements: Sequence[ProbeDisagreement] = ()) -> Verdict:
    """The status of one check from how the probe ended, what it said, and the rules' findings."""
    if outcome.timed_out:
        return Verdict("timeout", f"the probe ran past its timeout ({outcome.wall_seconds:.0f} s) and was killed")
    if outcome.start_error is not None:
        return Verdict("failed", f"the probe could not start: {outcome.start_error}", [outcome.start_error])
    if outcome.killed_for_memory is not None:
        detail = f"the probe was killed for its host memory: {outcome.killed_for_memory}"
        return Verdict("failed", detail, [detail])
    if outcome.killed_for_limit is not None:
        detail = f"the probe was killed for a limit: {outcome.killed_for_limit}"
        return Verdict("failed", detail, [detail])
    if outcome.output_too_large is not None:
        detail = f"the probe's output was too large: {outcome.output_too_large}"
        return Verdict("failed", detail, [detail])
    if parsed is None or isinstance(parsed, ParseFailure):
        why = parsed.reason if isinstance(parsed, ParseFailure) else "no output"
        if outcome.returncode not in (0, None):
            detail = f"the probe crashed (exit {outcome.returncode}): {_last_line(outcome.stderr)}"
        else:
            detail = f"the probe printed no usable result: {why}"
        return Verdict("failed", detail, [detail])
    probe = parsed
    if probe.skipped_reason is not None:
        return Verdict("skipped", f"skipped: {probe.skipped_reason}")
    if probe.framework is not None and probe.framework.import_error:
        detail = f"the framework is installed but cannot be imported: {probe.framework.import_error}"
        return Verdict("failed", detail, [detail])
    if disagreements:
        lines = disagreement_lines(disagreements)
        return Verdict("failed", f"failed: {lines[0]}" + (f" (+{len(lines) - 1} more)" if len(lines) > 1 else ""),
                       lines)
    failures = check_failures(probe)
    if outcome.returncode not in (0, None):
        failures.append(f"the probe exited {outcome.returncode}: {_last_line(outcome.stderr)}")
    if fallback:
        return Verdict("cpu_fallback", f"cpu_fallback: {fallback[0].message}"
                       + (f" (+{len(fallback) - 1} more)" if len(fallback) > 1 else ""), failures)
    if failures:
        return Verdict("failed", f"failed: {failures[0]}" + (f" (+{len(failures) - 1} more)"
                                                              if len(failures) > 1 else ""), failures)
    if regressions:
        first = regressions[0]
        where = f"GPU {first.gpu} " if first.gpu is not None else ""
        return Verdict("regression", f"regression: {where}{first.metric} dropped {first.drop_fraction:.1%} "
                       f"(band {first.threshold_fraction:.1%}, against {first.against})"
                       + (f" (+{len(regressions) - 1} more)" if len(regressions) > 1 else ""))
    return Verdict("pass", f"pass: {len(probe.gpus)} {'GPU' if probe.ran_on == 'gpu' else 'CPU device'}"
                   f"{'s' if len(probe.gpus) != 1 else ''} checked")
