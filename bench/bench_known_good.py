r"""Recording the known-good set of a big synthetic stack, against ``tar | gzip -6`` of the same files, side by side.

Issue #45: 40 packages no repository offers (8.6 GB installed, ROCm-like) took 273-298 s to keep on one core,
the time of ``tar | gzip -6``. This bench builds such a stack under ``--dir`` (a dpkg status file with each
package's stanza and ``Installed-Size``, ``info/PKG.list`` and ``PKG.md5sums``, and the files: 1 MiB blocks of
this machine's own shared libraries with 40 % of random bytes, so gzip works on machine code and keeps about the
share it keeps of ROCm's), then times, each in a fresh process and in the same round:

- ``record``: this checkout's ``keep_set`` (agent.guard.rollback.kept) with the .deb cache, every package
  rebuilt from its installed files and checked against its md5sums (no repository offers any: the Host's runner
  answers ``apt-get download`` with exit 100), into an empty kept directory;
- ``compare`` (with ``--compare TREE``): the same driver importing ``agent`` from an older tree
  (``git archive COMMIT agent | tar -x -C TREE``), e.g. today's before issue #45;
- ``tar | gzip -6``: ``tar -cf - FILES | gzip -6 > FILE`` of the same installed files;
- ``again``: this checkout's record once more over the directory ``record`` filled (nothing changed: nothing is
  rebuilt).

Each side's CPU time (user + system of the process and its children) comes from ``RUSAGE_CHILDREN``; wall time
from the clock. The record's workers are ``os.cpu_count()``; ``taskset -c 0`` in front of the command measures one
core. Prints the ratios record / compare (goal <= 0.5) and record / tar | gzip.

Run:  .venv/bin/python bench/bench_known_good.py [--packages 40] [--total-gb 8.6] [--dir /var/tmp/kg-bench]
      [--compare /tmp/old] [--rounds 1] [--json FILE]
Figures and the machine: docs/guard.md, "Recording the known-good set".
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional, Tuple

REPO = Path(__file__).resolve().parent.parent
BLOCK_BYTES = 1 << 20
VERSION = "7.0.2.70002-1"

_DRIVER = r"""
import json, sys, time
sys.path.insert(0, sys.argv[1])
from agent.guard.apt.deb_cache import DebCache
from agent.guard.apt.tool import AptTool
from agent.guard.rollback.backend import InstalledPackage
from agent.guard.rollback.kept import keep_set
from agent.host import CommandResult, Host

class NoRepository:
    def __call__(self, argv, timeout_seconds):
        return CommandResult(tuple(argv), 100, "", "E: Can't find a source to download version")

root, directory, names, version = sys.argv[2], sys.argv[3], sys.argv[4].split(","), sys.argv[5]
host = Host.for_root(root)
host = type(host)(root=host.root, runner=NoRepository(), load_module=host.load_module, env={})
cache = DebCache(host, directory, AptTool(host))
started = time.monotonic()
files = keep_set(host, cache, ".deb", {n: InstalledPackage(version, "amd64") for n in names}, {}, 0)
print(json.dumps({"seconds": time.monotonic() - started,
                  "restorable": sum(1 for f in files.values() if f.restorable),
                  "exact": sum(1 for f in files.values() if f.restorable and not f.inexact),
                  "sources": sorted({f.source for f in files.values()})}))
"""


def _blocks(rng: random.Random, count: int = 48) -> List[bytes]:
    """Distinct 1 MiB blocks of this machine's own shared libraries (machine code and data compress, and cost
    gzip, as ROCm's libraries do); random bytes where there are too few."""
    pool = bytearray()
    for directory in ("/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib/aarch64-linux-gnu", "/usr/lib"):
        if not os.path.isdir(directory):
            continue
        for name in sorted(os.listdir(directory)):
            path = os.path.join(directory, name)
            if ".so" in name and os.path.isfile(path) and not os.path.islink(path):
                with open(path, "rb") as f:
                    pool += f.read(8 * BLOCK_BYTES)
            if len(pool) >= count * BLOCK_BYTES:
                break
    while len(pool) < count * BLOCK_BYTES:
        pool += rng.randbytes(BLOCK_BYTES)
    # 32 KiB of every 80 KiB random: ROCm's libraries carry compressed GPU code objects, and gzip -6 keeps
    # about two thirds of their bytes (issue #45: 5.79 of 8.6 GB), where it keeps about 40 % of the host's.
    chunk = 32 * 1024
    blocks = []
    for i in range(count):
        block = bytearray(pool[i * BLOCK_BYTES:(i + 1) * BLOCK_BYTES])
        for at in range(0, BLOCK_BYTES, 5 * chunk // 2):
            block[at:at + chunk] = rng.randbytes(chunk)
        blocks.append(bytes(block))
    return blocks


def build_stack(where: Path, packages: int, total_bytes: int, seed: int = 45) -> Tuple[List[str], List[str], int]:
    """Write the synthetic installed stack under ``where`` (once; reused while the parameters match); the package
    names, every installed file's host path, and the bytes installed."""
    stamp = where / "stack.json"
    wanted = {"packages": packages, "total_bytes": total_bytes, "seed": seed, "version": VERSION,
              "content": "shared libraries, 40 % random"}
    if stamp.is_file():
        known = json.loads(stamp.read_text())
        if known.get("params") == wanted:
            return known["names"], known["files"], known["bytes"]
    shutil.rmtree(where, ignore_errors=True)
    root = where / "root"
    info = root / "var/lib/dpkg/info"
    info.mkdir(parents=True)
    rng = random.Random(seed)
    blocks = _blocks(rng)
    # Package sizes as a ROCm install has them: a few very large libraries, many small packages.
    weights = [rng.lognormvariate(0, 1.4) for _ in range(packages)]
    sizes = [max(BLOCK_BYTES, int(total_bytes * w / sum(weights))) for w in weights]
    names, all_files, stanzas, written = [], [], [], 0
    for i, size in enumerate(sizes):
        name = f"rocm-synthetic-{i:02d}"
        names.append(name)
        directory = f"/opt/rocm-7.0.2/lib/{name}"
        listed = ["/opt", "/opt/rocm-7.0.2", "/opt/rocm-7.0.2/lib", directory]
        md5sums = []
        files = max(1, min(12, size // (8 * BLOCK_BYTES)))
        for j in range(files):
            path = f"{directory}/lib{name}-{j}.so.7.0.2"
            target = root / path.lstrip("/")
            target.parent.mkdir(parents=True, exist_ok=True)
            digest = hashlib.md5(usedforsecurity=False)
            remaining = size // files
            with open(target, "wb") as out:
                while remaining > 0:
                    block = blocks[rng.randrange(len(blocks))][: remaining]
                    out.write(block)
                    digest.update(block)
                    remaining -= len(block)
            written += target.stat().st_size
            listed.append(path)
            all_files.append(path)
            md5sums.append(f"{digest.hexdigest()}  {path.lstrip('/')}\n")
        (info / f"{name}.list").write_text("\n".join(listed) + "\n")
        (info / f"{name}.md5sums").write_text("".join(md5sums))
        stanzas.append(f"Package: {name}\nStatus: install ok installed\nPriority: optional\nSection: devel\n"
                       f"Installed-Size: {size // 1024}\nMaintainer: ROCm Dev Support <rocm@example.com>\n"
                       f"Architecture: amd64\nVersion: {VERSION}\nDescription: synthetic ROCm-like library {i}\n")
    (root / "var/lib/dpkg/status").write_text("\n".join(stanzas))
    stamp.write_text(json.dumps({"params": wanted, "names": names, "files": all_files, "bytes": written}))
    return names, all_files, written


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def measured(argv: List[str], stdout_path: Optional[Path] = None) -> Tuple[float, float, str]:
    """(CPU seconds, wall seconds, stdout) of one command."""
    cpu0, wall0 = _children_cpu(), time.perf_counter()
    if stdout_path is not None:
        with open(stdout_path, "wb") as out:
            result = subprocess.run(argv, stdout=out, stderr=subprocess.PIPE, check=False)
        text = ""
    else:
        result = subprocess.run(argv, capture_output=True, check=False)
        text = result.stdout.decode()
    if result.returncode != 0:
        raise SystemExit(f"{argv[:4]} failed ({result.returncode}): {result.stderr.decode()[-800:]}")
    return _children_cpu() - cpu0, time.perf_counter() - wall0, text


def _dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.iterdir() if p.suffix == ".deb") if path.is_dir() else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--packages", type=int, default=40)
    parser.add_argument("--total-gb", type=float, default=8.6)
    parser.add_argument("--dir", default="/var/tmp/gpuguard-known-good-bench")
    parser.add_argument("--compare", metavar="TREE", help="an older tree whose agent/ records in the same rounds")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args()
    where = Path(args.dir)
    t0 = time.perf_counter()
    names, files, installed = build_stack(where, args.packages, int(args.total_gb * 1e9))
    root = where / "root"
    print(f"stack: {len(names)} packages, {len(files)} files, {installed / 1e9:.2f} GB installed under {root} "
          f"(ready in {time.perf_counter() - t0:.0f} s); CPUs: {os.cpu_count()}, "
          f"usable: {len(os.sched_getaffinity(0))}")
    kept_dir = "/var/lib/gpuguard/debs"
    kept_real = root / kept_dir.lstrip("/")

    def record(tree: str) -> List[str]:
        return [sys.executable, "-c", _DRIVER, tree, str(root), kept_dir, ",".join(names), VERSION]

    file_list = where / "files.txt"
    file_list.write_text("".join(f".{p}\n" for p in files))
    tar_gzip = ["sh", "-c", f'tar -cf - -C "{root}" -T "{file_list}" | gzip -6']
    sides: Dict[str, List[str]] = {"record": record(str(REPO)), "tar | gzip -6": tar_gzip}
    if args.compare:
        sides["compare"] = record(args.compare)
    samples: Dict[str, List[Tuple[float, float]]] = {side: [] for side in [*sides, "again"]}
    sizes: Dict[str, int] = {}
    details: Dict[str, dict] = {}
    for i in range(args.rounds):
        order = list(sides)[i % len(sides):] + list(sides)[:i % len(sides)]
        for side in order:
            shutil.rmtree(kept_real, ignore_errors=True)
            out_file = where / "tar.gz" if side.startswith("tar") else None
            cpu, wall, text = measured(sides[side], out_file)
            samples[side].append((cpu, wall))
            sizes[side] = out_file.stat().st_size if out_file else _dir_bytes(kept_real)
            if text:
                details[side] = json.loads(text.strip().splitlines()[-1])
            if side == "record":  # the same set again over what it kept: nothing to rebuild
                cpu, wall, text = measured(sides["record"])
                samples["again"].append((cpu, wall))
                details["again"] = json.loads(text.strip().splitlines()[-1])
            print(f"  round {i + 1} {side}: CPU {samples[side][-1][0]:.1f} s, wall {samples[side][-1][1]:.1f} s",
                  flush=True)
    (where / "tar.gz").unlink(missing_ok=True)

    def median_wall(side: str) -> float:
        return sorted(w for _, w in samples[side])[len(samples[side]) // 2]

    print(f"{'':16s} {'wall':>9s} {'CPU':>9s} {'kept/written':>14s}  checks")
    for side in samples:
        if not samples[side]:
            continue
        cpu = sorted(c for c, _ in samples[side])[len(samples[side]) // 2]
        detail = details.get(side, {})
        checks = (f"{detail['exact']}/{len(names)} exact, sources {','.join(detail['sources'])}"
                  if detail else "")
        print(f"{side:16s} {median_wall(side):8.1f}s {cpu:8.1f}s {sizes.get(side, 0) / 1e9:12.2f}GB  {checks}")
    ratios = {"record / tar | gzip -6": median_wall("record") / median_wall("tar | gzip -6")}
    if args.compare:
        ratios["record / compare"] = median_wall("record") / median_wall("compare")
    for label, value in ratios.items():
        goal = " (goal <= 0.5)" if label == "record / compare" else ""
        print(f"wall ratio {label}: {value:.2f}x{goal}")
    if args.json:
        Path(args.json).write_text(json.dumps({"packages": len(names), "installed_bytes": installed,
                                               "samples": samples, "sizes": sizes, "details": details,
                                               "ratios": ratios, "cpus": os.cpu_count()}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
