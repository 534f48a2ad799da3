"""A readable table of one health result for operators at a terminal."""

from __future__ import annotations

from typing import TYPE_CHECKING, Dict, List, Optional, Sequence

from agent.health.fallback import match_activity
from agent.health.model import GpuActivity, GpuFigures, HealthResult, MetricRegression
from agent.printable import printable

if TYPE_CHECKING:
    from agent.health.baseline import BaselineMove, ScopeView, SuspiciousFigure


def _num(value: Optional[float], digits: int = 1) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def _delta(regs: Dict[str, MetricRegression], key: str) -> str:
    reg = regs.get(key)
    return f" (-{reg.drop_fraction:.1%}!)" if reg is not None else ""


def _checks(gpu: GpuFigures) -> str:
    marks = [("ref", gpu.gemm_reference_ok), ("copy", gpu.copy_verified), ("train", gpu.train_ok),
             ("ckpt", gpu.checkpoint_ok)]
    bad = [name for name, ok in marks if ok is False] + [name for name, ok in marks if ok is None]
    return "ok" if not bad and not gpu.errors else "FAIL " + ",".join(bad) + (" +errors" if gpu.errors else "")


def _table(rows: Sequence[Sequence[str]]) -> List[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]


def _activity_for(matched: Dict[int, GpuActivity], gpu: GpuFigures) -> str:
    act = matched.get(gpu.index)
    if act is None:
        return "-"
    return f"{_num(act.idle_percent, 0)}->{_num(act.max_percent, 0)}%"


def render_result(result: HealthResult) -> str:
    """Status first, then the fingerprint and baseline, one row per GPU, the collective, and the evidence."""
    lines: List[str] = [f"health   {result.status.upper()}  {result.summary}",
                        f"time     {result.wall_seconds:.1f} s in all, probe {_num(result.probe_wall_seconds)} s"
                        f"  (started {result.started_at.isoformat()})"]
    if result.fingerprint is not None:
        lines.append(f"stack    {result.fingerprint_id}  {result.fingerprint.describe()}")
    b = result.baseline
    if b is not None:
        own = "established" if b.established else f"building {b.own_runs}/{b.runs_needed} runs"
        ref = "none yet" if b.reference_fingerprint_id is None else (
            "its own" if b.reference_fingerprint_id == b.fingerprint_id else
            f"previous stack {b.reference_fingerprint_id}")
        bands = sorted(set(b.noise_band_fraction.values()))
        band = f", noise band {bands[0]:.1%}" + (f"-{bands[-1]:.1%}" if len(bands) > 1 else "") if bands else ""
        lines.append(f"baseline {own}; compared with {ref}{band}")
        if b.refused:
            lines.append(f"baseline not fed by this run: {'; '.join(b.refused[:3])}")
        if b.moved is not None:
            lines.append(f"baseline moved by this run: {b.moved}")
        for suspicious in b.suspicious[:3]:
            lines.append(f"baseline SUSPICIOUS, not used: {suspicious}")
    probe = result.probe
    if probe is not None and probe.framework is not None:
        fw = probe.framework
        lines.append(f"framework {fw.name} {fw.version or '?'} ({fw.build or '?'} build), sees {probe.device_count} "
                     f"GPU(s), host has {result.inventory_gpu_count}; ran on {probe.ran_on or '-'}")
    if probe is not None and probe.gpus:
        regs = {f"{r.gpu}.{r.metric}": r for r in result.regressions if r.gpu is not None}
        matched = match_activity(probe, result.activity)
        rows = [["dev", "name", "GEMM TFLOP/s", "copy GB/s", "ref err", "train ms/step", "checks", "activity"]]
        for gpu in probe.gpus:
            gemm_key = f"{gpu.index}.gemm_{gpu.gemm_dtype}_tflops"
            rows.append([f"{'gpu' if gpu.device != 'cpu' else 'cpu'}{gpu.index}", (gpu.name or "?")[:28],
                         f"{_num(gpu.gemm_tflops)} {gpu.gemm_dtype}{_delta(regs, gemm_key)}",
                         _num(gpu.copy_bandwidth_gbps, 0) + _delta(regs, f"{gpu.index}.copy_bandwidth_gbps"),
                         "-" if gpu.gemm_reference_rel_error is None else f"{gpu.gemm_reference_rel_error:.1e}",
                         _num(None if gpu.train_step_seconds is None else gpu.train_step_seconds * 1e3, 2),
                         _checks(gpu), _activity_for(matched, gpu)])
        lines.extend("  " + row for row in _table(rows))
    if probe is not None and probe.collective is not None:
        c = probe.collective
        sum_text = {True: "sum ok", False: "WRONG SUM", None: "no sum"}[c.sum_correct]
        bad = [f"rank {r.rank} {r.status}" for r in c.ranks if r.status != "ok"]
        lines.append(f"collective {c.backend or '?'} all-reduce x{c.world_size}: {_num(c.bus_bandwidth_gbps)} GB/s "
                     f"bus bandwidth, {sum_text}" + (f"; {', '.join(bad)}" if bad else ""))
    occ = result.occupancy
    if occ is not None:
        for g in occ.busy_gpus:
            free = "" if g.memory_free_bytes is None else f", {g.memory_free_bytes / (1 << 30):.1f} GiB free"
            lines.append(f"busy     GPU {g.smi_index}{free}: {'; '.join(g.reasons)}")
        if occ.device_memory_budget_bytes is not None:
            lines.append(f"budget   {occ.device_memory_budget_bytes / (1 << 20):,.0f} MiB of device memory per GPU")
        if occ.performance_not_judged is not None and not occ.busy_gpus:
            lines.append(f"speed    not judged: {occ.performance_not_judged}")
        if occ.library is None and occ.unavailable_reason:
            lines.append(f"tenants  not read: {occ.unavailable_reason[:150]}")
    if result.sandbox is not None:
        sb = result.sandbox
        probe_uid = f", probe reported uid {probe.uid}" if probe is not None and probe.uid is not None else ""
        lines.append(f"sandbox  user {sb.user} (uid {sb.uid}{', dropped' if sb.dropped else ''}{probe_uid}); "
                     f"memory: {sb.memory_limit}")
        if sb.killed_for_memory:
            lines.append(f"killed   {sb.killed_for_memory}")
    if result.activity is not None and result.activity.library is None:
        lines.append(f"activity not sampled: {(result.activity.unavailable_reason or '')[:150]}")
    for reason in result.fallback_reasons:
        lines.append(f"fallback [{reason.code}] {reason.message}")
    for failure in result.failures:
        lines.append(f"failure  {failure}")
    for reg in result.regressions:
        where = f"GPU {reg.gpu} " if reg.gpu is not None else ""
        lines.append(f"regression {where}{reg.metric}: {reg.current_value:,.1f} vs {reg.baseline_value:,.1f} "
                     f"({reg.against}), -{reg.drop_fraction:.1%} > band {reg.threshold_fraction:.1%}")
    for run in result.workloads:
        figures = ", ".join(f"{k} {v:,.4g}" for k, v in sorted(run.metrics.items())) or "no figures"
        gate = "gates" if run.gates else "informs"
        lines.append(f"workload {run.name} {run.status.upper()} ({gate}, {run.wall_seconds:.1f} s): {figures}; "
                     f"{run.accelerator_calls} operator calls on the accelerator, {run.host_calls} on the host")
        for op in run.fallback_ops[:5]:
            lines.append(f"  fallback {op.op} x{op.calls}")
        if run.status != "pass":
            lines.append(f"  {run.summary}")
    # The probe's strings are escaped where they are parsed; a result read back from an older file is escaped here.
    return "\n".join(printable(line) for line in lines) + "\n"


def render_baselines(views: Sequence[ScopeView], suspicious: Sequence[SuspiciousFigure],
                     resets: Sequence[BaselineMove], limits_name: str) -> str:
    """``gpuguard health baseline show``: one row per fingerprint and GPU, then what is suspicious."""
    lines: List[str] = []
    if views:
        rows = [["fingerprint", "gpu", "figures", "runs", "state", "since", "rule"]]
        for v in views:
            figures = ", ".join(f"{k.partition('.')[2]} {value:,.1f}" for k, value in sorted(v.figures.items()))
            state = "established" if v.established else "learning"
            rule = (v.rule or "-") + (f" by {v.by}" if v.by else "") + (
                f" (drift streak {v.drift_streak})" if v.drift_streak else "")
            rows.append([v.fingerprint_id, v.scope, figures or "-", str(v.runs), state,
                         v.since.isoformat(timespec="seconds") if v.since else "-", rule])
        lines += _table(rows)
    else:
        lines.append("no baselines recorded")
    if resets:
        last = resets[-1]
        lines.append(f"last reset of every baseline: {last.at.isoformat(timespec='seconds')} by {last.by or '?'}")
    lines.append(f"limits: {limits_name}")
    for figure in suspicious:
        lines.append(f"SUSPICIOUS (never compared with; gpuguard health baseline reset): {figure.describe()}")
    return "\n".join(printable(line) for line in lines) + "\n"
