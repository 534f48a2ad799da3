r"""The whole ``gpuguard snapshot`` process against the operator's own reads of the same facts, side by side.

The operator's reads: ``dpkg-query -W`` of the watched patterns, ``uname -r`` and ``cat /etc/os-release``, each a
process. The two are run as interleaved pairs (snapshot, reads, snapshot, reads, ...) so drift in the machine's load
hits both; each side's CPU time (user + system, the process and everything it waited for) comes from
``resource.getrusage(RUSAGE_CHILDREN)`` before and after. Also printed for scale: a bare ``python3 -I -S -c pass``.

Goal (issue #17): the snapshot's CPU within 3x of the reads'; under 0.2 s on the H200.

Run:  .venv/bin/python bench/bench_snapshot.py [--pairs 15] [--gpuguard "gpuguard"] [--json FILE]
      (default command: this checkout's ``python3 -m agent snapshot``; ``--gpuguard gpuguard`` for the installed one)
An older build in the same rounds (its tree from ``git archive COMMIT agent | tar -x -C /tmp/old``):
      --compare "sh -c 'cd /tmp && PYTHONPATH=/tmp/old exec $PWD/.venv/bin/python -m agent \"\$@\"' old"
Figures and the last command used: docs/reporting.md, "What one gpuguard snapshot costs".
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shlex
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from agent.collectors.packages import DEFAULT_WATCHED_PATTERNS  # noqa: E402 - a tuple of strings, no I/O


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_measured(commands: Sequence[Sequence[str]], env: Optional[Dict[str, str]] = None) -> tuple:
    """(CPU seconds, wall seconds) of running the commands one after another; output discarded."""
    cpu0, wall0 = _children_cpu(), time.perf_counter()
    for argv in commands:
        subprocess.run(list(argv), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, check=False)
    return _children_cpu() - cpu0, time.perf_counter() - wall0


def operator_reads() -> List[List[str]]:
    return [["dpkg-query", "-W", *DEFAULT_WATCHED_PATTERNS], ["uname", "-r"], ["cat", "/etc/os-release"]]


def summary(samples: List[float]) -> Dict[str, float]:
    ordered = sorted(samples)
    return {"median": statistics.median(ordered), "min": ordered[0], "max": ordered[-1]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=15)
    parser.add_argument("--gpuguard", default=None, help="the snapshot command's prefix (default: python3 -m agent "
                                                         "from this checkout); e.g. 'gpuguard' for the installed one")
    parser.add_argument("--args", default="snapshot", help="arguments after it (default: snapshot)")
    parser.add_argument("--compare", default=None, metavar="PREFIX",
                        help="a second snapshot command (e.g. an older build) measured in the same rounds")
    parser.add_argument("--json", metavar="FILE", help="also write every sample as JSON")
    args = parser.parse_args()
    if shutil.which("dpkg-query") is None:
        print("dpkg-query not installed: no operator reads to compare with", file=sys.stderr)
        return 1
    env = None
    if args.gpuguard:
        snapshot = [*shlex.split(args.gpuguard), *shlex.split(args.args)]
    else:
        snapshot = [sys.executable, "-m", "agent", *shlex.split(args.args)]
        env = dict(os.environ, PYTHONPATH=str(REPO))
    check = subprocess.run(snapshot, capture_output=True, text=True, env=env, check=False)
    if check.returncode != 0:
        print(f"{shlex.join(snapshot)} failed ({check.returncode}): {check.stderr.strip()[-500:]}", file=sys.stderr)
        return 1
    other = [*shlex.split(args.compare), *shlex.split(args.args)] if args.compare else None
    reads = operator_reads()
    bare = [[sys.executable, "-I", "-S", "-c", "pass"]]
    run_measured([snapshot], env)  # warm the page cache for both sides
    run_measured(reads)
    samples: Dict[str, List[float]] = {"snapshot_cpu": [], "snapshot_wall": [], "reads_cpu": [], "reads_wall": [],
                                       "bare_python_cpu": [], "compare_cpu": [], "compare_wall": []}
    for i in range(args.pairs):
        order = ["snapshot", "reads"] if i % 2 == 0 else ["reads", "snapshot"]  # alternate who goes first
        if other:
            order.insert(i % 3, "compare")
        for side in order:
            if side == "snapshot":
                cpu, wall = run_measured([snapshot], env)
            elif side == "compare":
                cpu, wall = run_measured([other or []])
            else:
                cpu, wall = run_measured(reads)
            samples[f"{side}_cpu"].append(cpu)
            samples[f"{side}_wall"].append(wall)
        samples["bare_python_cpu"].append(run_measured(bare)[0])
    stats = {name: summary(values) for name, values in samples.items() if values}
    ratios = sorted(s / r for s, r in zip(samples["snapshot_cpu"], samples["reads_cpu"]) if r > 0)
    ratio = statistics.median(ratios) if ratios else float("inf")
    snap_cpu = stats["snapshot_cpu"]["median"]
    if other:
        print(f"compared command: {shlex.join(other)}")
    print(f"command: {shlex.join(snapshot)}   pairs: {args.pairs}")
    shown = [shlex.join(r) if len(r) <= 3 else f"{shlex.join(r[:2])} <{len(r) - 2} patterns>" for r in reads]
    print(f"operator reads: {' ; '.join(shown)}")
    print(f"{'':28s} {'CPU median':>11s} {'CPU min':>9s} {'CPU max':>9s} {'wall median':>12s}")
    sides = [("snapshot", "gpuguard snapshot"), ("reads", "operator reads")]
    if other:
        sides.insert(1, ("compare", "--compare " + args.compare[:16]))
    for side, label in sides:
        c, w = stats[f"{side}_cpu"], stats[f"{side}_wall"]
        print(f"{label:28s} {c['median'] * 1000:9.1f}ms {c['min'] * 1000:7.1f}ms {c['max'] * 1000:7.1f}ms "
              f"{w['median'] * 1000:10.1f}ms")
    print(f"{'python3 -I -S -c pass':28s} {stats['bare_python_cpu']['median'] * 1000:9.1f}ms")
    print(f"CPU ratio snapshot / reads (median of pairs): {ratio:.2f}x (goal <= 3x) -> "
          f"{'OK' if ratio <= 3 else 'OVER GOAL'}")
    if other:
        print(f"CPU ratio --compare / reads: {stats['compare_cpu']['median'] / stats['reads_cpu']['median']:.2f}x; "
              f"snapshot / --compare: {snap_cpu / stats['compare_cpu']['median']:.2f}x")
    print(f"snapshot CPU {snap_cpu:.3f} s (goal < 0.2 s on the H200) -> {'OK' if snap_cpu < 0.2 else 'OVER GOAL'}")
    if args.json:
        Path(args.json).write_text(json.dumps({"command": snapshot, "reads": reads, "pairs": args.pairs,
                                               "samples": samples, "stats": stats, "ratio_median": ratio},
                                              indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
