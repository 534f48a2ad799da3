"""Start-up and run time of the apt hook on a 300-package transaction, as a ratio to a bare `python3 -c pass`.

Goal: within 4x. The hook runs as apt runs it: the packaged launcher on the system python3 (-I -S), reading a
protocol-v3 transaction (a ~110-line config dump, then 300 packages, each unpacked and configured) on its
InfoFD, against a host with ~2,000 installed packages and a compiled policy with AMD pairings and kernel rules.
Run: .venv/bin/python bench/bench_apt_hook.py [--runs 30] [--python /usr/bin/python3]
"""

from __future__ import annotations

import argparse
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

from agent.policy.load import load_and_compile, write_compiled  # noqa: E402

POLICY = """
[policy]
name = "bench"
[amd]
action = "rollback"
[[amd.pairing]]
name = "rocm-6.2"
amdgpu = "6.2.*"
rocm = "6.2.*"
kernels = ["6.8.0-4[0-3]-generic"]
[[amd.pairing]]
name = "rocm-6.3"
amdgpu = "6.3.*"
rocm = "6.3.*"
kernels = ["6.8.0-4[0-3]-generic"]
[kernel]
allow = ["6.8.0-4[0-3]-generic"]
[[versions]]
packages = ["nvidia-container-toolkit*"]
allow = ">= 1.17.3"
[frozen]
packages = ["linux-generic-hwe-22.04"]
"""


def build_root(root: Path, installed_count: int, tx_count: int) -> str:
    """A host tree and the hook input of an allowed 300-package ROCm 6.2 -> 6.3 upgrade (driver included)."""
    stanzas, actions = [], []
    moving = {"amdgpu-dkms": ("1:6.8.5.60202-2041575.22.04", "1:6.10.5.60300-2084815.22.04"),
              "rocm-core": ("6.2.2.60202-116~22.04", "6.3.0.60300-39~22.04")}
    for i in range(tx_count - len(moving)):
        moving[f"rocm-lib{i:03d}"] = (f"1.{i}.0.60202-116~22.04", f"1.{i}.1.60300-39~22.04")
    for i in range(installed_count):
        name, version = f"lib-package-{i:05d}", f"1.{i % 7}.{i}-1ubuntu1"
        stanzas.append(_stanza(name, version))
    stanzas += [_stanza(name, old) for name, (old, _) in moving.items()]
    stanzas.append(_stanza("linux-image-6.8.0-41-generic", "6.8.0-41.41"))
    (root / "var/lib/dpkg").mkdir(parents=True)
    (root / "var/lib/dpkg/status").write_text("\n".join(stanzas))
    config = ["APT::Architecture=amd64", "CommandLine::AsString=apt-get%20install%20rocm"]
    config += [f"APT::Some::Option{i}=value%20{i}" for i in range(108)]
    for name, (old, new) in moving.items():
        actions.append(f"{name} {old} amd64 none < {new} amd64 none /var/cache/apt/archives/{name}_{new}_amd64.deb")
    for name, (old, new) in moving.items():
        actions.append(f"{name} {old} amd64 none < {new} amd64 none **CONFIGURE**")
    policy = root / "policy.toml"
    policy.write_text(POLICY)
    _, compiled = load_and_compile(str(policy))
    write_compiled(str(root / "var/lib/gpuguard/policy.compiled.json"), compiled)
    return "VERSION 3\n" + "\n".join(config) + "\n\n" + "\n".join(actions) + "\n"


def _stanza(name: str, version: str) -> str:
    return (f"Package: {name}\nStatus: install ok installed\nPriority: optional\nSection: libs\n"
            f"Installed-Size: 1234\nMaintainer: Someone <someone@example.org>\nArchitecture: amd64\n"
            f"Version: {version}\nDepends: libc6 (>= 2.34), libstdc++6 (>= 12)\n"
            f"Description: a package\n A longer description line.\n .\n Another paragraph.\n")


def median_seconds(argv: list, runs: int, stdin_text: str = "", env: dict = None) -> tuple:
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        result = subprocess.run(argv, input=stdin_text, capture_output=True, text=True, env=env)
        times.append(time.perf_counter() - started)
        if result.returncode != 0:
            raise SystemExit(f"{argv[0]} exited {result.returncode}: {result.stderr.strip()[-500:]}")
    return statistics.median(times), min(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--packages", type=int, default=300, help="packages in the transaction")
    parser.add_argument("--installed", type=int, default=2000, help="packages installed on the host")
    parser.add_argument("--python", default="/usr/bin/python3" if Path("/usr/bin/python3").exists()
                        else sys.executable, help="interpreter the hook runs on (the system python3)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="gpuguard-bench-hook-"))
    try:
        root = work / "root"
        text = build_root(root, args.installed, args.packages)
        launcher = work / "gpuguard-apt-hook"
        launcher.write_text((REPO / "packaging/apt/gpuguard-apt-hook").read_text().replace(
            'GPUGUARD_LIB = "/usr/lib/gpuguard"', f'GPUGUARD_LIB = "{REPO}"'))
        env = {"APT_HOOK_INFO_FD": "0", "PATH": os.environ.get("PATH", "/usr/bin:/bin")}
        hook = [args.python, "-I", "-S", str(launcher), "--root", str(root)]
        median_seconds(hook, 3, text, env)  # warm the page cache and write .pyc files, as on a real host
        median_seconds([args.python, "-c", "pass"], 3)
        bare_times, hook_times = [], []
        for _ in range(args.runs):  # interleaved, so load from other processes hits both alike
            bare_times.append(median_seconds([args.python, "-c", "pass"], 1)[0])
            hook_times.append(median_seconds(hook, 1, text, env)[0])
        bare, bare_min = statistics.median(bare_times), min(bare_times)
        run, run_min = statistics.median(hook_times), min(hook_times)
        ratio = run / bare
        version = subprocess.run([args.python, "--version"], capture_output=True, text=True).stdout.strip()
        print(f"python: {args.python} ({version})")
        print(f"transaction: {args.packages} packages ({2 * args.packages} action lines); host: {args.installed} "
              f"installed packages; runs: {args.runs}")
        print(f"bare `python3 -c pass`: median {bare * 1000:.1f} ms (min {bare_min * 1000:.1f} ms)")
        print(f"apt hook (allowed):     median {run * 1000:.1f} ms (min {run_min * 1000:.1f} ms)")
        print(f"ratio of medians: {ratio:.2f}x (goal <= 4x): {'OK' if ratio <= 4 else 'OVER GOAL'}; "
              f"ratio of minimums: {run_min / bare_min:.2f}x")
        return 0 if ratio <= 4 else 1
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
