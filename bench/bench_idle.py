"""Idle cost of the agent daemon: resident memory and CPU between jobs, next to a bare Python interpreter.

Starts ``gpuguard run`` with its default intervals (snapshot 300 s, heartbeat 60 s, package watch 2 s, delivery
30 s; the health check off: bench_health.py measures it) against a local endpoint on 127.0.0.1, so requests is
loaded as in production; lets it take its first snapshot and deliver; then samples /proc/<pid>/status (VmRSS) and
/proc/<pid>/stat (utime + stime) over ``--seconds``. Sampled side by side in the same run: a second agent whose
jobs are all an hour apart (its window holds only time between jobs), and ``python3 -c 'import time;
time.sleep(...)'`` with the same interpreter; with ``--before DIR``, the same default-interval agent from another
tree (``git archive`` of an older commit) as ``agent_before``. CPU counts the agent's threads and its job children
(the snapshot runs in a child since issue #17; /proc/PID/stat cutime + cstime once the daemon has reaped them).
``rich`` is hidden from the agents (a sitecustomize on PYTHONPATH): .venv has it only as a test dependency, the .deb
has none, and structlog imports it when present.

Goals (issue #6): under 60 MB RSS; no measurable CPU between jobs.
Run: .venv/bin/python bench/bench_idle.py [--seconds 20] [--root DIR] [--before DIR] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Dict, List

from bench_daemon_memory import AcceptingIngest, hide_modules  # the same local ingest and module hiding

REPO = Path(__file__).resolve().parent.parent
FIXTURE_ROOT = REPO / "tests" / "fixtures" / "roots" / "gpuless-debian12"
TICKS_PER_SECOND = os.sysconf("SC_CLK_TCK")
PAGE_KIB = os.sysconf("SC_PAGE_SIZE") // 1024


def rss_kib(pid: int) -> Dict[str, int]:
    """VmRSS and VmHWM (peak) of a process, in KiB."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM", "RssAnon", "RssFile"):
            out[key] = int(value.split()[0])
    return out


def cpu_ticks(pid: int) -> int:
    """utime + stime of a process (all threads) and of its reaped children, in clock ticks."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    # fields 14 to 17 of proc(5) (utime, stime, cutime, cstime), counted after the comm field
    return int(fields[11]) + int(fields[12]) + int(fields[13]) + int(fields[14])


def sample(pid: int, seconds: float, every_seconds: float = 0.5) -> Dict[str, float]:
    """RSS (KiB) and CPU over a window: start, end, max, CPU seconds and percent of one core."""
    rss: List[int] = []
    start_ticks, started = cpu_ticks(pid), time.monotonic()
    while time.monotonic() - started < seconds:
        rss.append(rss_kib(pid)["VmRSS"])
        time.sleep(every_seconds)
    cpu_seconds = (cpu_ticks(pid) - start_ticks) / TICKS_PER_SECOND
    wall = time.monotonic() - started
    final = rss_kib(pid)
    return {"rss_start_kib": rss[0], "rss_end_kib": final["VmRSS"], "rss_max_kib": max(rss + [final["VmRSS"]]),
            "rss_peak_kib": final["VmHWM"], "rss_anon_kib": final.get("RssAnon", 0),
            "rss_file_kib": final.get("RssFile", 0), "cpu_seconds": cpu_seconds, "window_seconds": round(wall, 2),
            "cpu_percent": round(100.0 * cpu_seconds / wall, 4)}


def agent_config(state_dir: str, endpoint: str, token_file: str, quiet: bool) -> str:
    """Default intervals, or (``quiet``) every job an hour apart so the window holds only time between jobs."""
    lines = ["[agent]", f'state_dir = "{state_dir}"', 'log_level = "info"', 'host_id = "bench-host"',
             "[daemon]", "health_enabled = false"]  # the health probe's cost is bench_health.py's subject
    if quiet:
        lines += ["package_watch_interval_seconds = 3600", "[snapshot]", "interval_seconds = 3600"]
    lines += ["[report]", f'endpoint_url = "{endpoint}"', f'token_file = "{token_file}"']
    if quiet:
        lines += ["heartbeat_interval_seconds = 3600", "delivery_interval_seconds = 3600"]
    return "\n".join(lines) + "\n"


def start_agent(tmp: str, name: str, root: str, endpoint: str, token_file: str, quiet: bool,
                tree: Path = REPO) -> subprocess.Popen:
    config = os.path.join(tmp, f"{name}.toml")
    Path(config).write_text(agent_config(os.path.join(tmp, f"state-{name}"), endpoint, token_file, quiet))
    hide = hide_modules(Path(tmp), ["rich"])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(hide), str(tree)])}
    env.pop("NOTIFY_SOCKET", None)
    with open(os.path.join(tmp, f"{name}.log"), "wb") as log:
        return subprocess.Popen([sys.executable, "-m", "agent", "run", "--config", config, "--root", root],
                                cwd=str(tree), env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=log)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0, help="sampling window (default 20)")
    parser.add_argument("--warmup-seconds", type=float, default=4.0, help="wait before sampling (default 4)")
    parser.add_argument("--root", help="host tree to watch (default: a copy of the gpuless-debian12 fixture)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument("--before", type=Path, help="also run the agent of this tree (an older commit), side by side")
    args = parser.parse_args()

    server = ThreadingHTTPServer(("127.0.0.1", 0), AcceptingIngest)
    server.batches = 0  # type: ignore[attr-defined]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    with tempfile.TemporaryDirectory(prefix="gpuguard-bench-idle-") as tmp:
        root = args.root
        if root is None:
            root = os.path.join(tmp, "root")
            shutil.copytree(FIXTURE_ROOT, root, symlinks=True)
        token_file = os.path.join(tmp, "token")
        with open(os.open(token_file, os.O_CREAT | os.O_WRONLY, 0o600), "w") as handle:
            handle.write("bench-token-0123456789\n")
        endpoint = f"http://127.0.0.1:{server.server_port}"
        procs = {"agent": start_agent(tmp, "agent", root, endpoint, token_file, quiet=False),
                 "agent_no_job_due": start_agent(tmp, "agent_no_job_due", root, endpoint, token_file, quiet=True),
                 **({"agent_before": start_agent(tmp, "agent_before", root, endpoint, token_file, quiet=False,
                                                 tree=args.before.resolve())} if args.before else {}),
                 "bare_python": subprocess.Popen([sys.executable, "-c",
                                                  f"import time; time.sleep({args.seconds * 3 + 60})"],
                                                 stdin=subprocess.DEVNULL)}
        results: Dict[str, object] = {}
        try:
            time.sleep(args.warmup_seconds)
            for name in [n for n in procs if n.startswith("agent")]:
                if procs[name].poll() is not None:
                    sys.stderr.write(Path(tmp, f"{name}.log").read_text()[-3000:])
                    return 1
            done: Dict[str, Dict[str, float]] = {}
            threads = [threading.Thread(target=lambda n, p: done.__setitem__(n, sample(p, args.seconds)),
                                        args=(name, proc.pid)) for name, proc in procs.items()]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            results.update(done)
            results.update({
                "rss_ratio": round(done["agent"]["rss_end_kib"] / done["bare_python"]["rss_end_kib"], 2),
                "rss_difference_kib": done["agent"]["rss_end_kib"] - done["bare_python"]["rss_end_kib"],
                "batches_delivered": server.batches,  # type: ignore[attr-defined]
                "python": sys.version.split()[0], "ticks_per_second": TICKS_PER_SECOND})
        finally:
            for proc in procs.values():
                if proc.poll() is None:
                    os.kill(proc.pid, signal.SIGTERM)
            exit_codes = {name: proc.wait(30) for name, proc in procs.items()}
            server.shutdown()
        results["agent_exit_codes"] = {k: v for k, v in exit_codes.items() if k != "bare_python"}
    if args.json:
        print(json.dumps(results, indent=2, sort_keys=True))
        return 0
    a = results["agent"]
    print(f"window {a['window_seconds']} s, Python {results['python']}, CPU tick {1 / TICKS_PER_SECOND:g} s")
    print(f"{'':27}{'RSS end MB':>11}{'RSS max MB':>11}{'peak MB':>9}{'anon MB':>9}{'CPU s':>7}{'CPU %':>8}")
    for name, label in (("agent", "gpuguard run (defaults)"), ("agent_no_job_due", "gpuguard run (no job due)"),
                        ("agent_before", "--before tree (defaults)"), ("bare_python", "bare python")):
        if name not in results:
            continue
        r = results[name]
        print(f"{label:27}{r['rss_end_kib'] / 1024:11.1f}{r['rss_max_kib'] / 1024:11.1f}{r['rss_peak_kib'] / 1024:9.1f}"
              f"{r['rss_anon_kib'] / 1024:9.1f}{r['cpu_seconds']:7.2f}{r['cpu_percent']:8.3f}")
    print(f"agent/bare RSS ratio {results['rss_ratio']}, difference {results['rss_difference_kib'] / 1024:.1f} MB; "
          f"batches delivered {results['batches_delivered']}; agent exit codes {results['agent_exit_codes']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
