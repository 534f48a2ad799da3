"""The guard's hot path at scale and at start-up: a 10,000-violation decision, and the hook beside a bare python3.

Goals: (1) Decision.decide on a 10,000-package transaction with 10,000 violations (each package a new kernel that
[kernel] allow refuses) in under 1 s, events and audit lines written; (2) the packaged apt hook on the 300-package
transaction of bench_apt_hook.py within 2.5x of `python3 -I -S -c pass` on the same interpreter (interleaved runs,
ratio of medians). Also printed, with no goal: the whole hook process on the 10,000-package transaction.
Run: .venv/bin/python bench/bench_hook_scale.py [--runs 30] [--python /usr/bin/python3]
"""

from __future__ import annotations

import argparse
import datetime as dt
import io
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from bench_apt_hook import build_root, median_seconds  # noqa: E402

from agent.guard.hotpath.decision import EXIT_REFUSED, Decision  # noqa: E402
from agent.guard.hotpath.transaction import Change, Transaction  # noqa: E402
from agent.policy.load import load_and_compile, write_compiled  # noqa: E402

SCALE_POLICY = """
[policy]
name = "scale"
[kernel]
allow = ["6.8.0-4[0-3]-generic"]
"""


def scale_root(root: Path, packages: int) -> str:
    """A host with ``packages`` installed libraries and the hook input installing ``packages`` refused kernels."""
    (root / "var/lib/dpkg").mkdir(parents=True)
    (root / "var/lib/dpkg/status").write_text("".join(
        f"Package: lib{i:05d}\nStatus: install ok installed\nArchitecture: amd64\nVersion: 1.{i}-1\n\n"
        for i in range(packages)))
    (root / "policy.toml").write_text(SCALE_POLICY)
    _, compiled = load_and_compile(str(root / "policy.toml"))
    write_compiled(str(root / "var/lib/gpuguard/policy.compiled.json"), compiled)
    lines = [f"linux-image-6.9.{i}-generic - - none < 6.9.{i}-1 amd64 none /var/cache/apt/archives/"
             f"linux-image-6.9.{i}-generic_6.9.{i}-1_amd64.deb" for i in range(packages)]
    return "VERSION 3\nAPT::Architecture=amd64\n\n" + "\n".join(lines) + "\n"


def decide_seconds(root: Path, packages: int, runs: int) -> tuple:
    """Median and minimum seconds of Decision.decide (events recorded under ``root``), and its exit code."""
    from agent.policy.compiled import read_compiled

    policy = read_compiled(str(root / "var/lib/gpuguard/policy.compiled.json"))
    installed = {f"lib{i:05d}": f"1.{i}-1" for i in range(packages)}
    tx = Transaction("dpkg", "apt", tuple(Change(f"linux-image-6.9.{i}-generic", None, f"6.9.{i}-1", "amd64")
                                          for i in range(packages)), "apt-get install kernels")
    times, code = [], None
    for _ in range(runs):
        err = io.StringIO()
        decision = Decision("apt", str(root), "/var/lib/gpuguard", lambda line, out=err: out.write(line + "\n"),
                            lambda: dt.datetime.now(dt.timezone.utc), "bypass")
        started = time.perf_counter()
        code = decision.decide(policy, tx, installed)
        times.append(time.perf_counter() - started)
        refused = err.getvalue().count("REFUSED (kernel.allow)")
        assert refused == packages, refused
    return statistics.median(times), min(times), code


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--packages", type=int, default=10_000, help="packages (and violations) at scale")
    parser.add_argument("--python", default="/usr/bin/python3" if Path("/usr/bin/python3").exists()
                        else sys.executable, help="interpreter the hook runs on (the system python3)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="gpuguard-bench-scale-"))
    try:
        launcher = work / "gpuguard-apt-hook"
        launcher.write_text((REPO / "packaging/apt/gpuguard-apt-hook").read_text().replace(
            'GPUGUARD_LIB = "/usr/lib/gpuguard"', f'GPUGUARD_LIB = "{REPO}"'))
        env = {"APT_HOOK_INFO_FD": "0", "PATH": os.environ.get("PATH", "/usr/bin:/bin")}

        big = work / "big"
        big_input = scale_root(big, args.packages)
        decide_median, decide_min, code = decide_seconds(big, args.packages, 5)
        assert code == EXIT_REFUSED
        started = time.perf_counter()
        result = subprocess.run([args.python, "-I", "-S", str(launcher), "--root", str(big)], input=big_input,
                                capture_output=True, text=True, env=env)
        hook_big = time.perf_counter() - started
        assert result.returncode == EXIT_REFUSED, result.stderr[-500:]

        small = work / "small"
        small_input = build_root(small, 2000, 300)
        hook = [args.python, "-I", "-S", str(launcher), "--root", str(small)]
        bare_argv = [args.python, "-I", "-S", "-c", "pass"]
        median_seconds(hook, 3, small_input, env)  # warm the page cache and write .pyc files, as on a real host
        median_seconds(bare_argv, 3)
        bare_times, hook_times = [], []
        for _ in range(args.runs):  # interleaved, so load from other processes hits both alike
            bare_times.append(median_seconds(bare_argv, 1)[0])
            hook_times.append(median_seconds(hook, 1, small_input, env)[0])
        bare, hook_median = statistics.median(bare_times), statistics.median(hook_times)
        ratio = hook_median / bare
        version = subprocess.run([args.python, "--version"], capture_output=True, text=True).stdout.strip()
        decide_ok, ratio_ok = decide_median < 1.0, ratio <= 2.5
        print(f"python: {args.python} ({version}); cpus: {os.cpu_count()}")
        print(f"decide, {args.packages} packages / {args.packages} violations: median {decide_median:.3f} s "
              f"(min {decide_min:.3f} s) (goal < 1 s): {'OK' if decide_ok else 'OVER GOAL'}")
        print(f"whole hook process, same transaction ({len(big_input) // 1024} KiB input): {hook_big:.3f} s")
        print(f"bare `python3 -I -S -c pass`: median {bare * 1000:.1f} ms (min {min(bare_times) * 1000:.1f} ms)")
        print(f"apt hook, 300 packages:       median {hook_median * 1000:.1f} ms (min {min(hook_times) * 1000:.1f} "
              f"ms); runs: {args.runs}")
        print(f"ratio of medians: {ratio:.2f}x (goal <= 2.5x): {'OK' if ratio_ok else 'OVER GOAL'}; "
              f"ratio of minimums: {min(hook_times) / min(bare_times):.2f}x")
        return 0 if decide_ok and ratio_ok else 1
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
