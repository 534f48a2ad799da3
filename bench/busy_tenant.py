"""The health check beside another job on a real GPU (issue #20): busy or deferred, never a regression, tenant unharmed.

Runs ``gpuguard health run --json`` (this checkout's ``python3 -m agent``, or ``--gpuguard``) with a fresh state
directory, as root so that the probe drops to ``--run-as`` (default nobody: /dev/nvidia* are usually 0666; on AMD
give a user in the render/video groups), in this order:

    idle         --idle-runs checks on idle GPUs: pass (they establish the baseline)
    matmul       a tenant runs a bf16 matmul loop on GPU 0: auto mode -> busy (never regression)
    matmul-full  the same tenant, --mode full -> deferred (nothing runs beside it)
    hold         a tenant holds --hold-fraction of GPU 0's memory and idles: busy (functional checks in what is free)
    hold-most    a tenant holds --hold-most-fraction: deferred (not even the smallest check fits)
    after        the tenants have ended: pass (the baseline is unchanged by the busy runs)

Every tenant is a separate process of ``--python`` (torch); it checks its own results when told to stop and exits 0
only when they are intact: "tenant ok" in the table means the check did not disturb it. Prints a table; writes
runs.jsonl under --out; exits 0 when every step got what it expects and every tenant finished without error.

Run: python3 bench/busy_tenant.py --python /path/to/ml/python3 --out DIR [--run-as nobody] [--gpuguard gpuguard]
"""

from __future__ import annotations

import argparse
import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

REPO = Path(__file__).resolve().parent.parent
COMMAND: List[str] = [sys.executable, "-m", "agent"]

# The tenant: a process of the ML interpreter on GPU 0 that either multiplies bf16 matrices in a loop or holds a
# share of the device memory and idles, until a stop file appears (or its time is up); then it checks its own data.
TENANT = r'''
import os, sys, time, torch
kind, stop_file, seconds, fraction = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4])
dev = torch.device("cuda", 0)
torch.cuda.set_device(dev)
deadline = time.time() + seconds
if kind == "matmul":
    torch.manual_seed(0)
    a = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    c = torch.empty_like(a)
    torch.matmul(a, b, out=c)
    reference = c.float().sum().item()
    print("TENANT_READY", flush=True)
    n = 0
    while time.time() < deadline and not os.path.exists(stop_file):
        for _ in range(20):
            torch.matmul(a, b, out=c)
        torch.cuda.synchronize()
        n += 20
    again = c.float().sum().item()
    ok = again == reference and torch.isfinite(c).all().item()
    print("TENANT_DONE ok=%s iterations=%d" % (ok, n), flush=True)
    sys.exit(0 if ok else 3)
free, total = torch.cuda.mem_get_info(dev)
want = int(free - (1.0 - fraction) * total)
held = torch.full((max(want, 1),), 7, device=dev, dtype=torch.uint8)
torch.cuda.synchronize()
print("TENANT_READY held=%d free_before=%d total=%d" % (held.numel(), free, total), flush=True)
while time.time() < deadline and not os.path.exists(stop_file):
    time.sleep(0.2)
# In 64 MiB pieces: a comparison of the whole buffer at once would itself need as much memory again.
ok = all(bool((piece == 7).all().item()) for piece in held.split(64 << 20))
print("TENANT_DONE ok=%s held=%d" % (ok, held.numel()), flush=True)
sys.exit(0 if ok else 3)
'''


class Tenant:
    """One tenant process; ``finish()`` asks it to stop and returns (exit code, its last line, stderr tail)."""

    def __init__(self, python: str, kind: str, fraction: float, seconds: float, workdir: Path) -> None:
        self.stop_file = workdir / f"stop-{kind}-{time.monotonic_ns()}"
        script = workdir / "tenant.py"
        script.write_text(TENANT)
        self.proc = subprocess.Popen([python, str(script), kind, str(self.stop_file), str(seconds), str(fraction)],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.ready_line = self._wait_ready(timeout_seconds=120)

    def _wait_ready(self, timeout_seconds: float) -> str:
        assert self.proc.stdout is not None
        started = time.monotonic()
        while time.monotonic() - started < timeout_seconds:
            line = self.proc.stdout.readline()
            if line.startswith("TENANT_READY"):
                return line.strip()
            if not line and self.proc.poll() is not None:
                break
        raise RuntimeError(f"tenant did not start: {self.proc.stderr.read()[-1500:] if self.proc.stderr else ''}")

    def finish(self, timeout_seconds: float = 120) -> Tuple[Optional[int], str, str]:
        self.stop_file.write_text("stop")
        try:
            out, err = self.proc.communicate(timeout=timeout_seconds)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, err = self.proc.communicate()
            return None, "killed: did not stop within the time", err[-1500:]
        lines = [ln for ln in out.splitlines() if ln.startswith("TENANT_DONE")]
        return self.proc.returncode, (lines[-1] if lines else "no TENANT_DONE line"), err[-1500:]


def probe_interpreter(python: str, user: str) -> Tuple[str, Dict[str, str]]:
    """An interpreter with torch that ``user`` can run: ``python`` itself, or (when it lives where the user cannot
    reach, e.g. under /root) the system python of the same release with ``python``'s site-packages on PYTHONPATH."""
    if os.geteuid() != 0:
        return python, {}
    entry = pwd.getpwnam(user)
    info = json.loads(subprocess.run([python, "-c", "import json, sys, sysconfig; print(json.dumps("
                                      "{'v': '%d.%d' % sys.version_info[:2], 'purelib': sysconfig.get_paths()"
                                      "['purelib'], 'platlib': sysconfig.get_paths()['platlib']}))"],
                                     capture_output=True, text=True, check=True, timeout=60).stdout)
    candidates = [(python, {}), (f"/usr/bin/python{info['v']}",
                                 {"PYTHONPATH": os.pathsep.join(dict.fromkeys([info["purelib"], info["platlib"]]))})]
    for candidate, env in candidates:
        try:
            done = subprocess.run([candidate, "-c", "import torch; print(torch.cuda.is_available())"],
                                  user=entry.pw_uid, group=entry.pw_gid, extra_groups=os.getgrouplist(user,
                                                                                                      entry.pw_gid),
                                  env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **env}, cwd="/",
                                  capture_output=True, text=True, timeout=120)
        except OSError:
            continue
        if done.returncode == 0 and done.stdout.strip().endswith("True"):
            return candidate, env
    raise SystemExit(f"no interpreter with a working torch that {user} can run (tried {python} and the system "
                     f"python{info['v']} with its site-packages)")


def write_config(path: Path, python: str, env: Dict[str, str], run_as: str, baseline_runs: int) -> None:
    # The probe's interpreter starts isolated (-I): the site-packages go to [health] python_path, not PYTHONPATH.
    dirs = [d for d in env.get("PYTHONPATH", "").split(os.pathsep) if d]
    extra = ", ".join(f'{k} = "{v}"' for k, v in env.items() if k != "PYTHONPATH")
    path.write_text(f'[health]\npython = "{python}"\nrun_as = "{run_as}"\nbaseline_runs = {baseline_runs}\n'
                    f"timeout_seconds = 300\nextra_env = {{ {extra} }}\npython_path = {json.dumps(dirs)}\n")


def run_check(config: Path, state_dir: str, extra: Sequence[str]) -> dict:
    argv = [*COMMAND, "health", "run", "--json", "--config", str(config), "--state-dir", state_dir, *extra]
    started = time.monotonic()
    proc = subprocess.run(argv, cwd=str(REPO), capture_output=True, text=True, timeout=400)
    try:
        result = json.loads(proc.stdout)
    except json.JSONDecodeError:
        result = {"status": "unparsed", "summary": (proc.stdout + proc.stderr)[-600:]}
    return {"exit_code": proc.returncode, "outside_wall_seconds": round(time.monotonic() - started, 2),
            "result": result}


def _num(value: Optional[float]) -> str:
    return "-" if value is None else f"{value:.0f}"


def row_of(step: str, expected: Sequence[str], run: dict, tenant: str) -> List[str]:
    result = run["result"]
    probe = result.get("probe") or {}
    gpu = (probe.get("gpus") or [{}])[0]
    occ = result.get("occupancy") or {}
    budget = occ.get("device_memory_budget_bytes")
    peak = gpu.get("device_memory_peak_bytes")
    ok = result.get("status") in expected
    return [step, "/".join(expected), str(result.get("status")), str(run["exit_code"]), "yes" if ok else "NO",
            "-" if probe.get("uid") is None else str(probe["uid"]),
            "-" if budget is None else f"{budget / 2**30:.1f}", "-" if peak is None else f"{peak / 2**30:.2f}",
            _num(gpu.get("gemm_bf16_tflops")), _num(gpu.get("copy_bandwidth_gbps")), tenant,
            str(result.get("summary"))[:160]]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", required=True, help="the ML interpreter (torch) for the probe and the tenants")
    parser.add_argument("--out", default=".", help="directory for runs.jsonl")
    parser.add_argument("--run-as", default="nobody", help="the probe's user (the agent runs as root)")
    parser.add_argument("--idle-runs", type=int, default=3, help="idle runs first; they establish the baseline")
    parser.add_argument("--hold-fraction", type=float, default=0.85, help="memory share the 'hold' tenant takes")
    parser.add_argument("--hold-most-fraction", type=float, default=0.995,
                        help="memory share the 'hold-most' tenant takes")
    parser.add_argument("--tenant-seconds", type=float, default=240, help="a tenant's longest life")
    parser.add_argument("--gpuguard", default=None, help="command prefix (default: python3 -m agent of this checkout)")
    args = parser.parse_args()
    if args.gpuguard:
        COMMAND[:] = args.gpuguard.split()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="gpuguard-busy-"))
    work.chmod(0o755)  # the probe's user reaches its home under the state directory
    state_dir = str(work / "state")
    os.makedirs(state_dir, mode=0o755)
    python, env = probe_interpreter(args.python, args.run_as)
    config = work / "agent.toml"
    write_config(config, python, env, args.run_as, max(1, args.idle_runs))
    print(f"probe interpreter {python} {env or ''}; run_as {args.run_as} (agent uid {os.geteuid()})", flush=True)
    rows: List[List[str]] = []
    failures = 0

    def record(step: str, expected: Sequence[str], run: dict, tenant: str = "-") -> None:
        nonlocal failures
        run.update(step=step, expected=list(expected), tenant=tenant)
        log.write(json.dumps(run, sort_keys=True) + "\n")
        log.flush()
        rows.append(row_of(step, expected, run, tenant))
        failures += rows[-1][4] != "yes"
        print("  ".join(rows[-1]), flush=True)

    def with_tenant(step: str, kind: str, fraction: float, checks: Sequence[Tuple[str, Sequence[str], List[str]]]
                    ) -> None:
        nonlocal failures
        tenant = Tenant(args.python, kind, fraction, args.tenant_seconds, work)
        print(f"{step}: {tenant.ready_line}", flush=True)
        time.sleep(3)  # utilization reaches the SMI library's window
        runs = [(name, expected, run_check(config, state_dir, extra)) for name, expected, extra in checks]
        code, line, err = tenant.finish()
        ok = code == 0
        failures += not ok
        last_error = (err.strip().splitlines() or [""])[-1][:160]
        verdict = f"ok ({line})" if ok else f"HARMED exit {code}: {line}; {last_error}"
        for name, expected, run in runs:
            record(name, expected, run, verdict)

    with open(out / "runs.jsonl", "w") as log:
        for i in range(args.idle_runs):
            record(f"idle {i + 1}", ["pass"], run_check(config, state_dir, []))
        with_tenant("matmul", "matmul", 0.0, [("matmul", ["busy"], []),
                                              ("matmul-full", ["deferred"], ["--mode", "full"])])
        with_tenant("hold", "hold", args.hold_fraction, [("hold", ["busy"], [])])
        with_tenant("hold-most", "hold", args.hold_most_fraction, [("hold-most", ["deferred", "busy"], [])])
        record("after", ["pass"], run_check(config, state_dir, []))
    header = ["step", "expected", "status", "exit", "as expected", "probe uid", "budget GiB", "peak GiB",
              "GEMM TFLOP/s", "copy GB/s", "tenant", "summary"]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header) - 1)]
    print()
    for r in [header, *rows]:
        print("  ".join(c.ljust(w) for c, w in zip(r[:-1], widths)) + "  " + r[-1])
    regressions = [r[0] for r in rows if r[2] == "regression"]
    print(f"\n{len(rows)} checks, {failures} not as expected; regressions: {', '.join(regressions) or 'none'}")
    shutil.rmtree(work, ignore_errors=True)
    return 0 if failures == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
