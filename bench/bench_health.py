"""The health check on a real GPU host: wall time, figures against the device's peaks, spread, alarm and fallback.

Runs the whole ``gpuguard health run --json`` command (agent start, snapshot, SMI sampling, probe, baseline)
repeatedly with a fresh state directory:

    baseline   --baseline-runs good runs that establish the baseline
    unchanged  --unchanged-runs more runs of the same stack: none may be flagged as a regression
    hidden     one run with CUDA_VISIBLE_DEVICES= (the GPU hidden): must be cpu_fallback
    throttled  --throttled-runs runs with --throttle-fraction 0.15: every one must be flagged

Goals (issue #5): whole check within 15 s wall including framework import; at least 90% of the measured peaks
(bf16 GEMM ~790 TFLOP/s, device copy ~4300 GB/s read+write on the H200); run-to-run spread under 3%.
Run: python3 bench/bench_health.py --python python3 --out DIR
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


def run_check(python: str, state_dir: str, extra_args: List[str], env: Dict[str, str],
              timeout_seconds: float) -> dict:
    """One whole ``gpuguard health run --json``; its parsed result plus the wall time seen from outside."""
    argv = [sys.executable, "-m", "agent", "health", "run", "--json", "--python", python, "--state-dir", state_dir,
            *extra_args]
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
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    state_dir = args.state_dir or tempfile.mkdtemp(prefix="gpuguard-bench-state-")
    base_env = dict(os.environ)
    plan = ([("baseline", [], base_env)] * args.baseline_runs + [("unchanged", [], base_env)] * args.unchanged_runs
            + [("hidden", [], {**base_env, "CUDA_VISIBLE_DEVICES": ""})]
            + [("throttled", ["--throttle-fraction", str(args.throttle_fraction)], base_env)] * args.throttled_runs)
    started = time.monotonic()
    runs = []
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
    summary["throttled_drops"] = [[(g.get("metric"), g.get("drop_fraction"), g.get("threshold_fraction"))
                                   for g in r["result"].get("regressions", [])] for r in throttled]
    (out / "summary.json").write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")
    print(json.dumps(summary, indent=1, sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
