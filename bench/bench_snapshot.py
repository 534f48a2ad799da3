"""Snapshot time on a host with ~2,000 installed packages, as a ratio to `dpkg-query -W` on the same data.

Goal: a whole snapshot (every collector, not just the package read) within 2x of the dpkg-query floor.
Run: .venv/bin/python bench/bench_snapshot.py [--packages 2000] [--repeat 15]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from agent.host import Host  # noqa: E402
from agent.log import configure  # noqa: E402
from agent.snapshot.take import take_snapshot  # noqa: E402

WATCHED_SHARE = ("rocm-lib", "hip-lib", "linux-image-6.8.0-{i}-generic", "amdgpu-dkms-firmware-{i}")


def build_root(root: Path, package_count: int) -> None:
    """A host tree like an ML node: many packages (some watched), ROCm, DKMS, a kernel."""
    stanzas = []
    for i in range(package_count):
        name = f"lib-package-{i:05d}" if i % 10 else WATCHED_SHARE[(i // 10) % 4].format(i=i) + (
            f"-{i}" if "{i}" not in WATCHED_SHARE[(i // 10) % 4] else "")
        stanzas.append(f"Package: {name}\nStatus: install ok installed\nPriority: optional\nSection: libs\n"
                       f"Installed-Size: {100 + i}\nMaintainer: Someone <someone@example.org>\nArchitecture: amd64\n"
                       f"Version: 1.{i % 7}.{i}-1ubuntu1\nDepends: libc6 (>= 2.34), libstdc++6 (>= 12)\n"
                       f"Description: package number {i}\n A longer description line.\n .\n Another paragraph.\n")
    (root / "var/lib/dpkg").mkdir(parents=True)
    (root / "var/lib/dpkg/status").write_text("\n".join(stanzas))
    (root / "etc").mkdir()
    (root / "etc/os-release").write_text('ID=ubuntu\nID_LIKE=debian\nVERSION_ID="22.04"\n')
    (root / "proc/sys/kernel").mkdir(parents=True)
    (root / "proc/sys/kernel/osrelease").write_text("6.8.0-45-generic\n")
    (root / "boot").mkdir()
    (root / "boot/vmlinuz-6.8.0-45-generic").write_text("")
    (root / "sys/module/amdgpu").mkdir(parents=True)
    (root / "sys/module/amdgpu/version").write_text("6.8.5\n")
    (root / "opt/rocm-6.2.2/.info").mkdir(parents=True)
    (root / "opt/rocm-6.2.2/.info/version").write_text("6.2.2-116\n")
    (root / "opt/rocm").symlink_to("/opt/rocm-6.2.2")
    ko = root / "var/lib/dkms/amdgpu/6.8.5-2041575.22.04/6.8.0-45-generic/x86_64/module/amdgpu.ko"
    ko.parent.mkdir(parents=True)
    ko.write_text("")


def median_seconds(fn, repeat: int) -> float:
    samples = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - started)
    return statistics.median(samples)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--packages", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=15)
    args = parser.parse_args()
    configure(level="error", json_output=True)
    if shutil.which("dpkg-query") is None:
        print("dpkg-query not installed: no floor to compare with", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        build_root(root, args.packages)
        host = Host.for_root(str(root))
        admindir = str(root / "var/lib/dpkg")
        floor = median_seconds(lambda: subprocess.run(["dpkg-query", "--admindir", admindir, "-W"],
                                                      capture_output=True, check=True), args.repeat)
        snap_seconds = median_seconds(lambda: take_snapshot(host), args.repeat)
        snap = take_snapshot(host)
        cli = [sys.executable, "-m", "agent", "snapshot", "--json", "--root", str(root)]
        cli_seconds = median_seconds(lambda: subprocess.run(cli, capture_output=True, check=True),
                                     max(3, args.repeat // 3))
    ratio = snap_seconds / floor
    print(f"packages={snap.dpkg.data.installed_count} watched={len(snap.dpkg.data.packages)}")
    print(f"dpkg-query -W median: {floor * 1000:.1f} ms")
    print(f"gpuguard snapshot median: {snap_seconds * 1000:.1f} ms")
    print(f"ratio: {ratio:.2f}x (goal <= 2x) -> {'OK' if ratio <= 2 else 'OVER GOAL'}")
    print(f"whole `gpuguard snapshot --json` process incl. interpreter start and imports: "
          f"{cli_seconds * 1000:.0f} ms ({cli_seconds / floor:.1f}x the dpkg-query process)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
