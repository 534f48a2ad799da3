r"""The whole ``gpuguard snapshot`` process against the operator's own reads of the same facts, side by side.

The operator's reads (issue #17's reference): ``dpkg-query -W`` of the watched patterns, ``uname -r`` and
``cat /etc/os-release``, each a process. A second reference, "the same facts by the operator's tools": those reads
plus each tool the snapshot itself would otherwise run on this host (``--version`` of every container tool
installed, ``rpm -qa`` of the watched patterns where an rpm database exists, ``nvidia-smi -q`` / ``amd-smi
static`` of the inventory, driver and CUDA versions where that driver is loaded, which the snapshot reads through
NVML / amdsmi); the snapshot answers the tool versions and the rpm rows from its fact cache while their files are
unchanged. Both ratios are printed, the issue's first.

Every side runs once per round, who goes first rotating from round to round, so drift in the machine's load hits
all of them; each side's CPU time (user + system, the process and everything it waited for) comes from
``resource.getrusage(RUSAGE_CHILDREN)`` before and after. Also printed for scale: a bare ``python3 -I -S -c pass``.

Goal (issue #17): the snapshot's CPU within 3x of the reads'; under 0.2 s on the H200.

Run:  .venv/bin/python bench/bench_snapshot.py [--pairs 15 (rounds)] [--gpuguard "gpuguard"] [--json FILE]
      (default command: this checkout's ``python3 -m agent snapshot``; ``--gpuguard gpuguard`` for the installed one)
An older build in the same rounds (its tree from ``git archive COMMIT agent | tar -x -C /tmp/old``):
      --compare "sh -c 'cd /tmp && PYTHONPATH=/tmp/old exec $PWD/.venv/bin/python -m agent \"\$@\"' old"
Where PYTHONDONTWRITEBYTECODE is set, compile both trees first (``python -m compileall -q agent /tmp/old/agent``):
otherwise every run compiles every module it imports.
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

from agent.defaults import DEFAULT_WATCHED_PATTERNS  # noqa: E402 - a tuple of strings, no I/O


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


def operator_tools() -> List[List[str]]:
    """What the operator runs besides the reads for the facts the snapshot also reports on this host."""
    from agent.collectors.containers import TOOLS
    from agent.hostfacts.rpmdb import rpm_database_files

    search = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"  # the agent's command PATH
    tools = [[program, *args] for _, program, args in TOOLS if shutil.which(program, path=search)]
    if rpm_database_files("/") and shutil.which("rpm", path=search):
        tools.append(["rpm", "-qa", *DEFAULT_WATCHED_PATTERNS])
    # The GPU inventory and driver the snapshot reads through NVML / amdsmi where that driver is loaded.
    if os.path.isdir("/proc/driver/nvidia") and shutil.which("nvidia-smi", path=search):
        # -q: the driver and CUDA versions, and each GPU's name, bus id, UUID, VBIOS and memory, as the snapshot
        # records them (issue #17 timed it on the H200: "nvidia-smi -q takes 0.12 s")
        tools.append(["nvidia-smi", "-q"])
    if os.path.isdir("/sys/module/amdgpu") and shutil.which("amd-smi", path=search):
        tools.append(["amd-smi", "static", "--asic", "--vbios", "--driver"])
    return tools


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
    tools = reads + operator_tools()
    bare = [[sys.executable, "-I", "-S", "-c", "pass"]]
    run_measured([snapshot], env)  # warm the page cache for every side
    run_measured(tools)
    sides: Dict[str, List[List[str]]] = {"snapshot": [snapshot], "reads": reads, "tools": tools}
    if other:
        sides["compare"] = [other]
        run_measured([other])
    samples: Dict[str, List[float]] = {f"{side}_{kind}": [] for side in sides for kind in ("cpu", "wall")}
    samples["bare_python_cpu"] = []
    for i in range(args.pairs):
        order = list(sides)[i % len(sides):] + list(sides)[:i % len(sides)]  # rotate who goes first
        for side in order:
            cpu, wall = run_measured(sides[side], env if side == "snapshot" else None)
            samples[f"{side}_cpu"].append(cpu)
            samples[f"{side}_wall"].append(wall)
        samples["bare_python_cpu"].append(run_measured(bare)[0])
    stats = {name: summary(values) for name, values in samples.items() if values}

    def ratio_to(side: str) -> float:
        ratios = sorted(s / r for s, r in zip(samples["snapshot_cpu"], samples[f"{side}_cpu"]) if r > 0)
        return statistics.median(ratios) if ratios else float("inf")

    ratio, tools_ratio = ratio_to("reads"), ratio_to("tools")
    snap_cpu = stats["snapshot_cpu"]["median"]
    if other:
        print(f"compared command: {shlex.join(other)}")
    print(f"command: {shlex.join(snapshot)}   rounds: {args.pairs}")

    def shown(commands: List[List[str]]) -> str:
        return " ; ".join(shlex.join(r) if len(r) <= 3 else f"{shlex.join(r[:2])} <{len(r) - 2} patterns>"
                          for r in commands)

    print(f"operator reads (issue #17): {shown(reads)}")
    print(f"operator tools, besides:    {shown(tools[len(reads):]) or '(none on this host)'}")
    print(f"{'':32s} {'CPU median':>11s} {'CPU min':>9s} {'CPU max':>9s} {'wall median':>12s}")
    labels = [("snapshot", "gpuguard snapshot")]
    if other:
        labels.append(("compare", "--compare " + args.compare[:20]))
    labels += [("reads", "operator reads (issue #17)"), ("tools", "operator reads + tools")]
    for side, label in labels:
        c, w = stats[f"{side}_cpu"], stats[f"{side}_wall"]
        print(f"{label:32s} {c['median'] * 1000:9.1f}ms {c['min'] * 1000:7.1f}ms {c['max'] * 1000:7.1f}ms "
              f"{w['median'] * 1000:10.1f}ms")
    print(f"{'python3 -I -S -c pass':32s} {stats['bare_python_cpu']['median'] * 1000:9.1f}ms")
    print(f"CPU ratio snapshot / operator reads (issue #17's goal, median of rounds): {ratio:.2f}x (goal <= 3x) -> "
          f"{'OK' if ratio <= 3 else 'OVER GOAL'}")
    print(f"CPU ratio snapshot / operator reads + tools (the same facts by the operator's tools): {tools_ratio:.2f}x")
    if other:
        compare_cpu = stats["compare_cpu"]["median"]
        print(f"CPU ratio --compare / operator reads: {compare_cpu / stats['reads_cpu']['median']:.2f}x; "
              f"snapshot / --compare: {snap_cpu / compare_cpu:.2f}x")
    print(f"snapshot CPU {snap_cpu:.3f} s (goal < 0.2 s on the H200) -> {'OK' if snap_cpu < 0.2 else 'OVER GOAL'}")
    if args.json:
        Path(args.json).write_text(json.dumps({"command": snapshot, "reads": reads, "tools": tools,
                                               "pairs": args.pairs, "samples": samples, "stats": stats,
                                               "ratio_median": ratio, "tools_ratio_median": tools_ratio},
                                              indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
