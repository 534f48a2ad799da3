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

With ``--node-exporter`` (a path, or ``auto``: on PATH or unpacked from Debian's prometheus-node-exporter package
without installing it, as bench_daemon_memory.py does) node_exporter runs in the same window, scraped every
``--scrape-seconds`` (15, Prometheus' usual), and the figures are put per hour: CPU per hour of each process
(window CPU x 3600 / window), the job children the agent started in the window by job (its ``job_child_exited``
debug lines, so with ``--log-level debug``: count and CPU), and the ratios agent / node_exporter of CPU per hour
and of RSS (issue #45). A window shorter than an hour holds none of the hourly forced runs (a full policy fetch, a
snapshot: docs/reporting.md "Idle cost"), so ``cpu_per_hour_with_forced`` adds one of each at the mean cost the
window measured (or ``--forced-child-seconds`` each when it saw none). The local endpoint answers a GET of the
policy bundle with 204 (the hub with no bundle in this host's scope), so the policy fetch runs its production path.

``--tls`` serves that endpoint over plain HTTP (``none``, the default) or over HTTPS (production hubs always are)
with a server certificate issued by a CA generated for the run, and names a ``ca_bundle`` in the agents' ``[report]``:
``private``, that CA alone (a fleet's own PKI); ``public``, that CA appended to a bundle the size of a public trust
store (certifi's cacert.pem from this interpreter, else /etc/ssl/certs/ca-certificates.crt), as a host on requests'
default trust store loads.

Goals (issue #6): under 60 MB RSS; no measurable CPU between jobs. Issue #45: CPU per hour <= 3x node_exporter's,
RSS <= 1.1x.
The agents log at ``--log-level`` (default ``info``, the default an operator runs; the resident's own CPU is a little
higher at ``debug``, which the per-job table needs).
Run: .venv/bin/python bench/bench_idle.py [--seconds 20] [--root DIR] [--before DIR] [--node-exporter auto]
     [--log-level info|debug] [--tls none|private|public] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Dict, List, Optional

from bench_daemon_memory import IngestAndEmptyHub, find_node_exporter, free_port, hide_modules

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.report.receiver import make_ca, make_ca_signed_certificate  # noqa: E402

PUBLIC_TRUST_STORES = ("/etc/ssl/certs/ca-certificates.crt",)

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


def children_in_window(log_path: str, since: str, until: str) -> Dict[str, Dict[str, float]]:
    """``job_child_exited`` lines of an agent's log between two UTC ISO times: count and CPU seconds by job."""
    jobs: Dict[str, Dict[str, float]] = {}
    for line in Path(log_path).read_text(errors="replace").splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if entry.get("event") != "job_child_exited" or not since <= str(entry.get("timestamp", "")) <= until:
            continue
        job = jobs.setdefault(str(entry["job"]), {"count": 0, "cpu_seconds": 0.0})
        job["count"] += 1
        job["cpu_seconds"] = round(job["cpu_seconds"] + float(entry["cpu_seconds"]), 3)
    return jobs


def utc_now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime()) + f".{int(time.time() * 1e6) % 1000000:06d}Z"


def public_trust_store() -> Path:
    """A bundle the size of a public trust store: certifi's (requests' default), else the system's."""
    try:
        import certifi
        return Path(certifi.where())
    except ImportError:
        for path in PUBLIC_TRUST_STORES:
            if os.path.isfile(path):
                return Path(path)
    raise SystemExit("bench_idle: --tls public: neither certifi nor a system CA bundle is available")


def serve_tls(server: ThreadingHTTPServer, tmp: Path, mode: str) -> Dict[str, object]:
    """Serve ``server`` over HTTPS (a leaf of a CA made for the run); write the agents' ``ca_bundle`` for ``mode``."""
    ca = make_ca(tmp, "bench-ca")
    leaf = make_ca_signed_certificate(tmp, "bench-hub", ca)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(*leaf)
    server.socket = context.wrap_socket(server.socket, server_side=True, do_handshake_on_connect=False)
    bundle = tmp / "ca-bundle.pem"
    public = public_trust_store() if mode == "public" else None
    pem = (public.read_text() if public else "") + Path(ca[0]).read_text()
    bundle.write_text(pem)
    return {"ca_bundle": str(bundle), "ca_bundle_bytes": len(pem.encode()),
            "ca_bundle_certificates": pem.count("-----BEGIN CERTIFICATE-----"),
            "ca_bundle_base": str(public) if public else None}


def agent_config(state_dir: str, endpoint: str, token_file: str, quiet: bool, log_level: str,
                 ca_bundle: Optional[str] = None) -> str:
    """Default intervals, or (``quiet``) every job an hour apart so the window holds only time between jobs."""
    lines = ["[agent]", f'state_dir = "{state_dir}"', f'log_level = "{log_level}"', 'host_id = "bench-host"',
             "[daemon]", "health_enabled = false"]  # the health probe's cost is bench_health.py's subject
    if quiet:
        lines += ["package_watch_interval_seconds = 3600", "[snapshot]", "interval_seconds = 3600"]
    lines += ["[report]", f'endpoint_url = "{endpoint}"', f'token_file = "{token_file}"']
    if ca_bundle:
        lines.append(f'ca_bundle = "{ca_bundle}"')
    if quiet:
        lines += ["heartbeat_interval_seconds = 3600", "delivery_interval_seconds = 3600"]
    return "\n".join(lines) + "\n"


def start_agent(tmp: str, name: str, root: str, endpoint: str, token_file: str, quiet: bool, log_level: str,
                tree: Path = REPO, ca_bundle: Optional[str] = None) -> subprocess.Popen:
    config = os.path.join(tmp, f"{name}.toml")
    Path(config).write_text(agent_config(os.path.join(tmp, f"state-{name}"), endpoint, token_file, quiet, log_level,
                                         ca_bundle))
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
    parser.add_argument("--node-exporter", help="node_exporter binary, or 'auto' (PATH or Debian's package, unpacked)")
    parser.add_argument("--scrape-seconds", type=float, default=15.0, help="node_exporter scrape interval (15)")
    parser.add_argument("--log-level", choices=("info", "debug"), default="info",
                        help="the agents' log level (info, the default; debug lists the job children)")
    parser.add_argument("--tls", choices=("none", "private", "public"), default="none",
                        help="endpoint over HTTPS with the agents' ca_bundle its CA alone (private) or appended to "
                             "a public trust store (public); none: plain HTTP (the default)")
    parser.add_argument("--forced-child-seconds", type=float, default=0.4,
                        help="CPU of a forced full fetch or snapshot child when the window saw none (0.4)")
    args = parser.parse_args()

    server = ThreadingHTTPServer(("127.0.0.1", 0), IngestAndEmptyHub)
    server.events = 0  # type: ignore[attr-defined]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    with tempfile.TemporaryDirectory(prefix="gpuguard-bench-idle-") as tmp:
        root = args.root
        if root is None:
            root = os.path.join(tmp, "root")
            shutil.copytree(FIXTURE_ROOT, root, symlinks=True)
        token_file = os.path.join(tmp, "token")
        with open(os.open(token_file, os.O_CREAT | os.O_WRONLY, 0o600), "w") as handle:
            handle.write("bench-token-0123456789\n")
        tls = serve_tls(server, Path(tmp), args.tls) if args.tls != "none" else {}
        ca_bundle = str(tls["ca_bundle"]) if tls else None
        endpoint = f"{'https' if tls else 'http'}://127.0.0.1:{server.server_port}"
        exporter_port = free_port()
        exporter_bin: Optional[str] = None
        if args.node_exporter:
            exporter_bin = find_node_exporter(None if args.node_exporter == "auto" else args.node_exporter, Path(tmp))
            if exporter_bin is None:
                print("node_exporter not available", file=sys.stderr)
                return 1
        level = args.log_level
        procs = {"agent": start_agent(tmp, "agent", root, endpoint, token_file, quiet=False, log_level=level,
                                      ca_bundle=ca_bundle),
                 "agent_no_job_due": start_agent(tmp, "agent_no_job_due", root, endpoint, token_file, quiet=True,
                                                 log_level=level, ca_bundle=ca_bundle),
                 **({"agent_before": start_agent(tmp, "agent_before", root, endpoint, token_file, quiet=False,
                                                 log_level=level, tree=args.before.resolve(),
                                                 ca_bundle=ca_bundle)}
                    if args.before else {}),
                 "bare_python": subprocess.Popen([sys.executable, "-c",
                                                  f"import time; time.sleep({args.seconds * 3 + 60})"],
                                                 stdin=subprocess.DEVNULL),
                 **({"node_exporter": subprocess.Popen(
                     [exporter_bin, f"--web.listen-address=127.0.0.1:{exporter_port}"],
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)} if exporter_bin else {})}
        results: Dict[str, object] = {}
        scraping = threading.Event()
        scrapes = [0, 0]  # done, failed

        def scrape() -> None:
            while not scraping.wait(args.scrape_seconds):
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{exporter_port}/metrics", timeout=10) as reply:
                        reply.read()
                    scrapes[0] += 1
                except OSError:
                    scrapes[1] += 1
        try:
            time.sleep(args.warmup_seconds)
            for name in [n for n in procs if n.startswith("agent")]:
                if procs[name].poll() is not None:
                    sys.stderr.write(Path(tmp, f"{name}.log").read_text()[-3000:])
                    return 1
            if exporter_bin:
                threading.Thread(target=scrape, daemon=True).start()
            since = utc_now()
            done: Dict[str, Dict[str, float]] = {}
            threads = [threading.Thread(target=lambda n, p: done.__setitem__(n, sample(p, args.seconds)),
                                        args=(name, proc.pid)) for name, proc in procs.items()]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            scraping.set()
            until = utc_now()
            results.update(done)
            per_hour(results, done, tmp, since, until, args.forced_child_seconds)
            results["scrapes"] = {"done": scrapes[0], "failed": scrapes[1], "every_seconds": args.scrape_seconds}
            results.update({
                "rss_ratio": round(done["agent"]["rss_end_kib"] / done["bare_python"]["rss_end_kib"], 2),
                "rss_difference_kib": done["agent"]["rss_end_kib"] - done["bare_python"]["rss_end_kib"],
                "events_delivered": server.events,  # type: ignore[attr-defined]
                "python": sys.version.split()[0], "ticks_per_second": TICKS_PER_SECOND, "log_level": level,
                "tls": {"mode": args.tls, **tls}})
        finally:
            for proc in procs.values():
                if proc.poll() is None:
                    os.kill(proc.pid, signal.SIGTERM)
            exit_codes = {name: proc.wait(30) for name, proc in procs.items()}
            server.shutdown()
        results["agent_exit_codes"] = {k: v for k, v in exit_codes.items() if k.startswith("agent")}
    if args.json:
        print(json.dumps(results, indent=2, sort_keys=True))
        return 0
    a = results["agent"]
    print(f"window {a['window_seconds']} s, Python {results['python']}, CPU tick {1 / TICKS_PER_SECOND:g} s, "
          f"log level {results['log_level']}, TLS {json.dumps(results['tls'], sort_keys=True)}")
    print(f"{'':27}{'RSS end MB':>11}{'RSS max MB':>11}{'peak MB':>9}{'anon MB':>9}{'CPU s':>7}{'CPU %':>8}")
    for name, label in (("agent", "gpuguard run (defaults)"), ("agent_no_job_due", "gpuguard run (no job due)"),
                        ("agent_before", "--before tree (defaults)"), ("bare_python", "bare python"),
                        ("node_exporter", "node_exporter")):
        if name not in results:
            continue
        r = results[name]
        print(f"{label:27}{r['rss_end_kib'] / 1024:11.1f}{r['rss_max_kib'] / 1024:11.1f}{r['rss_peak_kib'] / 1024:9.1f}"
              f"{r['rss_anon_kib'] / 1024:9.1f}{r['cpu_seconds']:7.2f}{r['cpu_percent']:8.3f}")
    print(f"agent/bare RSS ratio {results['rss_ratio']}, difference {results['rss_difference_kib'] / 1024:.1f} MB; "
          f"events delivered {results['events_delivered']}; agent exit codes {results['agent_exit_codes']}")
    for name in [n for n in ("agent", "agent_before") if f"{n}_children" in results]:
        print(f"{name}: job children in the window {json.dumps(results[f'{name}_children'], sort_keys=True)}; "
              f"CPU {results[f'{name}_cpu_seconds_per_hour']} s/h, with the hourly forced runs "
              f"{results[f'{name}_cpu_per_hour_with_forced']} s/h")
    if "node_exporter" in results:
        print(f"node_exporter CPU {results['node_exporter_cpu_seconds_per_hour']} s/h ({results['scrapes']}); "
              f"agent / node_exporter: CPU {results['cpu_ratio_to_node_exporter']}x (goal <= 3), "
              f"RSS {results['rss_ratio_to_node_exporter']}x (goal <= 1.1)")
    return 0


def per_hour(results: Dict[str, object], done: Dict[str, Dict[str, float]], tmp: str, since: str, until: str,
             forced_child_seconds: float) -> None:
    """CPU per hour of each process, the agents' children by job, the forced runs added, ratios to node_exporter."""
    for name, r in done.items():
        results[f"{name}_cpu_seconds_per_hour"] = round(r["cpu_seconds"] * 3600 / r["window_seconds"], 2)
    for name in [n for n in ("agent", "agent_before") if n in done]:
        jobs = children_in_window(os.path.join(tmp, f"{name}.log"), since, until)
        results[f"{name}_children"] = jobs
        window = done[name]["window_seconds"]
        extra = 0.0
        if window < 3600:  # one forced full fetch and one forced snapshot an hour, at their measured mean cost
            for job in ("policy_fetch", "snapshot"):
                seen = jobs.get(job)
                extra += seen["cpu_seconds"] / seen["count"] if seen else forced_child_seconds
        results[f"{name}_cpu_per_hour_with_forced"] = round(
            float(results[f"{name}_cpu_seconds_per_hour"]) + (extra if name == "agent" else 0.0), 2)  # type: ignore[arg-type]
    if "node_exporter" in done:
        ne = float(results["node_exporter_cpu_seconds_per_hour"])  # type: ignore[arg-type]
        results["cpu_ratio_to_node_exporter"] = round(float(results["agent_cpu_per_hour_with_forced"]) / ne, 2) \
            if ne else None  # type: ignore[arg-type]
        results["rss_ratio_to_node_exporter"] = round(
            done["agent"]["rss_end_kib"] / done["node_exporter"]["rss_end_kib"], 3)


if __name__ == "__main__":
    raise SystemExit(main())
