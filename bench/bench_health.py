"""The health check on a real GPU host: wall time, figures against the device's peaks, spread, alarm and fallback.

Runs the whole ``gpuguard health run --json`` command (agent start, snapshot, SMI sampling, probe, baseline)
repeatedly with a fresh state directory:

    baseline   --baseline-runs good runs that establish the baseline
    unchanged  --unchanged-runs more runs of the same stack: none may be flagged as a regression
    hidden     one run with CUDA_VISIBLE_DEVICES= (the GPU hidden): must be cpu_fallback
    throttled  --throttled-runs runs with --throttle-fraction 0.15: every one must be flagged

With ``--naive-runs N`` it also runs, interleaved with the good runs, the check a user might run instead
(``import torch``, one 8192x8192 bf16 matmul, ``.item()``), and prints a phase table: the whole command from
outside, the agent's own share (the check's wall time less the probe's), the probe's torch import and workload,
and each workload step (GEMM, fp32 reference, copy, training steps, checkpoint round trip), as medians.

Goals (issue #5): whole check within 15 s wall including framework import; at least 90% of the measured peaks
(bf16 GEMM ~790 TFLOP/s, device copy ~4300 GB/s read+write on the H200); run-to-run spread under 3%.
Goals (issue #17, on the H200): the whole command within 7 s warm including the torch import, the workload phase
under 1.5 s, figures within 5% of before.
Run: python3 bench/bench_health.py --python python3 --out DIR [--gpuguard gpuguard] [--naive-runs 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional

REPO = Path(__file__).resolve().parent.parent


NAIVE_CHECK = ("import torch; a = torch.randn(8192, 8192, device='cuda', dtype=torch.bfloat16); "
               "print((a @ a).float().abs().sum().item())")
STEPS = ("gemm", "reference", "copy", "train", "checkpoint")
COMMAND: List[str] = [sys.executable, "-m", "agent"]


def run_naive(python: str, env: Dict[str, str], timeout_seconds: float) -> dict:
    """The naive check's wall time: import torch, one 8192^2 bf16 matmul, .item()."""
    started = time.monotonic()
    proc = subprocess.run([python, "-c", NAIVE_CHECK], env=env, capture_output=True, text=True,
                          timeout=timeout_seconds)
    return {"kind": "naive", "exit_code": proc.returncode, "outside_wall_seconds": round(time.monotonic() - started, 3),
            "stderr_tail": proc.stderr[-500:]}


def phases_of(run: dict) -> Dict[str, Optional[float]]:
    """The phase table's row for one run (seconds)."""
    result = run["result"] or {}
    probe = result.get("probe") or {}
    gpu = (probe.get("gpus") or [{}])[0]
    phases = probe.get("phase_seconds") or {}
    steps = gpu.get("step_seconds") or {}
    check, probe_wall = result.get("wall_seconds"), result.get("probe_wall_seconds")
    row: Dict[str, Optional[float]] = {
        "outside": run["outside_wall_seconds"], "check": check,
        "agent": round(check - probe_wall, 3) if check is not None and probe_wall is not None else None,
        "probe": probe_wall, "import": phases.get("import"), "workload": phases.get("workload")}
    for step in STEPS:
        row[step] = steps.get(step)
    return row


def print_phase_table(runs: List[dict], naive: List[dict]) -> Dict[str, Optional[float]]:
    rows = [phases_of(r) for r in runs if r["kind"] in ("baseline", "unchanged")]
    if not rows:
        return {}
    columns = list(rows[0])
    print("phase table (seconds; agent = the check's wall time less the probe's):")
    print("run " + " ".join(f"{c:>10s}" for c in columns))
    for i, row in enumerate(rows):
        print(f"{i:3d} " + " ".join(f"{row[c]:10.3f}" if row[c] is not None else f"{'-':>10s}" for c in columns))
    medians: Dict[str, Optional[float]] = {}
    for c in columns:
        values = [row[c] for row in rows if row[c] is not None]
        medians[c] = round(statistics.median(values), 3) if values else None
    print("med " + " ".join(f"{medians[c]:10.3f}" if medians[c] is not None else f"{'-':>10s}" for c in columns))
    if naive:
        walls = [n["outside_wall_seconds"] for n in naive if n["exit_code"] == 0]
        if walls and medians.get("outside"):
            naive_median = statistics.median(walls)
            medians["naive"] = round(naive_median, 3)
            print(f"naive check (import torch, one 8192^2 bf16 matmul, .item()): median {naive_median:.3f} s "
                  f"(min {min(walls):.3f}, max {max(walls):.3f}, n={len(walls)}); gpuguard health run / naive = "
                  f"{medians['outside'] / naive_median:.2f}x")
    return medians


def run_check(python: str, state_dir: str, extra_args: List[str], env: Dict[str, str],
              timeout_seconds: float) -> dict:
    """One whole ``gpuguard health run --json``; its parsed result plus the wall time seen from outside."""
    argv = [*COMMAND, "health", "run", "--json", "--python", python, "--state-dir", state_dir, *extra_args]
    started = time.monotonic()
    proc = subprocess.run(argv, cwd=str(REPO), env=env, capture_output=True, text=True, timeout=timeout_seconds)
    wall = time.monotonic() - started
    try:
        result = json.loads(proc.stdout)
    except json.JSONDecodeError:
        result = {"status": "unparsed", "stdout": proc.stdout[-2000:], "stderr": proc.stderr[-2000:]}
    return {"exit_code": proc.returncode, "outside_wall_seconds": round(wall, 3), "result": result}


def figures(run: dict) -> Dict[str, Optional[float]]:
    probe = (run["result"] or {}).get("probe") or {}
    gpus = probe.get("gpus") or [{}]
    gpu = gpus[0]
    phases = probe.get("phase_seconds") or {}
    return {"gemm": gpu.get("gemm_bf16_tflops"), "copy": gpu.get("copy_bandwidth_gbps"),
            "import": phases.get("import"), "probe_total": phases.get("total"),
            "check_wall": run["result"].get("wall_seconds"), "outside_wall": run["outside_wall_seconds"]}


def spread(values: List[float]) -> Dict[str, float]:
    mid = statistics.median(values)
    return {"n": len(values), "median": round(mid, 2), "min": round(min(values), 2), "max": round(max(values), 2),
            "range_fraction": round((max(values) - min(values)) / mid, 4),
            "stdev_fraction": round(statistics.stdev(values) / statistics.mean(values), 4) if len(values) > 1
            else 0.0}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", default="python3", help="interpreter with the ML framework")
    parser.add_argument("--out", default=".", help="directory for runs.jsonl and summary.json")
    parser.add_argument("--baseline-runs", type=int, default=5)
    parser.add_argument("--unchanged-runs", type=int, default=10)
    parser.add_argument("--throttled-runs", type=int, default=5)
    parser.add_argument("--throttle-fraction", type=float, default=0.15)
    parser.add_argument("--gemm-peak-tflops", type=float, default=790.0)
    parser.add_argument("--copy-peak-gbps", type=float, default=4300.0)
    parser.add_argument("--budget-seconds", type=float, default=500.0, help="start no run after this long")
    parser.add_argument("--state-dir", default=None, help="baseline state directory (default: a fresh temporary one)")
    parser.add_argument("--gpuguard", default=None, help="command prefix, e.g. gpuguard for the installed package "
                                                         "(default: python3 -m agent of this checkout)")
    parser.add_argument("--naive-runs", type=int, default=0, help="naive checks, interleaved with the good runs")
    args = parser.parse_args()
    if args.gpuguard:
        COMMAND[:] = args.gpuguard.split()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    state_dir = args.state_dir or tempfile.mkdtemp(prefix="gpuguard-bench-state-")
    base_env = dict(os.environ)
    plan = ([("baseline", [], base_env)] * args.baseline_runs + [("unchanged", [], base_env)] * args.unchanged_runs
            + [("hidden", [], {**base_env, "CUDA_VISIBLE_DEVICES": ""})]
            + [("throttled", ["--throttle-fraction", str(args.throttle_fraction)], base_env)] * args.throttled_runs)
    started = time.monotonic()
    runs: List[dict] = []
    naive: List[dict] = []
    with open(out / "runs.jsonl", "w") as log:
        for i, (kind, extra, env) in enumerate(plan):
            if time.monotonic() - started > args.budget_seconds:
                print(f"budget spent: stopped before run {i} ({kind})", flush=True)
                break
            run = run_check(args.python, state_dir, extra, env, timeout_seconds=300)
            run["kind"] = kind
            run["i"] = i
            runs.append(run)
            log.write(json.dumps(run, sort_keys=True) + "\n")
            log.flush()
            f = figures(run)
            print(f"{i:2d} {kind:9s} status={run['result'].get('status'):12s} exit={run['exit_code']:2d} "
                  f"gemm={f['gemm']} copy={f['copy']} import={f['import']} probe={f['probe_total']} "
                  f"check={f['check_wall']} outside={f['outside_wall']}", flush=True)
            if kind in ("baseline", "unchanged") and len(naive) < args.naive_runs:
                n = run_naive(args.python, env, timeout_seconds=300)
                naive.append(n)
                log.write(json.dumps(n, sort_keys=True) + "\n")
                print(f"   naive     exit={n['exit_code']:2d} outside={n['outside_wall_seconds']}", flush=True)

    good = [r for r in runs if r["kind"] in ("baseline", "unchanged")]
    summary: Dict[str, object] = {"runs": len(runs)}
    gemm = [figures(r)["gemm"] for r in good if figures(r)["gemm"]]
    copy = [figures(r)["copy"] for r in good if figures(r)["copy"]]
    walls = [figures(r)["outside_wall"] for r in good]
    if gemm and copy:
        summary["gemm_bf16_tflops"] = spread(gemm)
        summary["copy_bandwidth_gbps"] = spread(copy)
        summary["gemm_fraction_of_peak_median"] = round(statistics.median(gemm) / args.gemm_peak_tflops, 4)
        summary["copy_fraction_of_peak_median"] = round(statistics.median(copy) / args.copy_peak_gbps, 4)
        summary["gemm_fraction_of_peak_min"] = round(min(gemm) / args.gemm_peak_tflops, 4)
        summary["copy_fraction_of_peak_min"] = round(min(copy) / args.copy_peak_gbps, 4)
    if walls:
        summary["whole_check_wall_seconds"] = spread(walls)
        summary["first_run_wall_seconds"] = walls[0]
    statuses: Dict[str, Dict[str, int]] = {}
    for r in runs:
        by_kind = statuses.setdefault(r["kind"], {})
        status = r["result"].get("status", "unparsed")
        by_kind[status] = by_kind.get(status, 0) + 1
    summary["statuses"] = statuses
    hidden = [r for r in runs if r["kind"] == "hidden"]
    if hidden:
        summary["hidden_summary"] = hidden[0]["result"].get("summary")
        summary["hidden_reasons"] = [x.get("code") for x in hidden[0]["result"].get("fallback_reasons", [])]
    throttled = [r for r in runs if r["kind"] == "throttled"]
    summary["phase_medians"] = print_phase_table(runs, naive)
    summary["throttled_drops"] = [[(g.get("metric"), g.get("drop_fraction"), g.get("threshold_fraction"))
                                   for g in r["result"].get("regressions", [])] for r in throttled]
    (out / "summary.json").write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")
    print(json.dumps(summary, indent=1, sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
