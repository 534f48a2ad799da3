"""Daemon memory soak: ``gpuguard run``'s RSS over a day of jobs run faster, beside Prometheus' node_exporter.

The agent runs as a real process with every default interval divided by ``--speedup`` (300: a snapshot and a guard
check every second, a heartbeat every 0.2 s, delivery every 0.1 s, so the default 288 s are a day's 288 snapshots
and 1,440 heartbeats). The package watch runs every ``max(2 s / speedup, 0.05 s)``. The health check is off (it
runs a separate probe process; its memory is not the daemon's). Events go to ``--endpoint``, by default a local
ingest on 127.0.0.1 that acknowledges every batch (delivery children run, as in production) and answers the policy
fetch as a hub with no bundle for this host (204; its probe then finds nothing changed, as against a real hub; it
answered 501 until 2026-12-07, so every probe led to a full fetch child that failed: 339 a simulated day instead of
about 24); ``--endpoint none`` leaves them in the outbox.

Since issue #17's structural fix the daemon runs the snapshot, the guard's rollback check, the health check and
delivery's sending in short-lived children (``python -m agent _job NAME``); each child's exit is logged
(``job_child_exited``, with its peak RSS and CPU time from ``wait4``; delivery's clean exits at debug), so the bench
runs the agent at ``log_level = "debug"``, reads those lines and reports the children's peak RSS and CPU beside the
resident daemon's RSS and CPU. ``rich`` is hidden from agent and
children (``--hide rich``, a sitecustomize on PYTHONPATH): it is in .venv only as a test dependency, the .deb has
none, and structlog imports it when present.

node_exporter runs beside it on 127.0.0.1 (a free port) and is scraped every ``--scrape-seconds``; both RSS figures
(/proc/PID/status VmRSS) are printed every ``--sample-seconds``. node_exporter comes from ``--node-exporter`` or is
unpacked from the distribution's package without installing it (``apt-get download prometheus-node-exporter``,
``dpkg-deb -x`` into a temporary directory).

Goal: after warm-up (the first ``--warmup-seconds``) the agent's RSS stays within +-2 MB (issue #17), and its maximum
is at most ``--goal-ratio`` times node_exporter's (1.1, issue #45; it was 2 for issue #17).

To measure the installed layout on another Python (Ubuntu 24.04's 3.12), point ``--gpuguard`` at the unpacked .deb's
launcher run by that interpreter (``dpkg-deb -x``; its ``GPUGUARD_LIB`` line pointed at the unpacked tree):
``--gpuguard "python3.12 -I -S /tmp/root/usr/bin/gpuguard"``.

Run:  .venv/bin/python bench/bench_daemon_memory.py [--speedup 300] [--seconds 288] [--gpuguard gpuguard]
      [--hide rich] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Dict, List, Optional

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from agent.wire import BUNDLE_PATH  # noqa: E402

DEFAULTS = {"snapshot": 300.0, "heartbeat": 60.0, "delivery": 30.0, "package_watch": 2.0}


def rss_mib(pid: int) -> Optional[float]:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def cpu_seconds(pid: int) -> Optional[float]:
    """utime + stime of a process (all its threads; not its children), in seconds."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def child_exits(log_path: Path) -> List[Dict[str, object]]:
    """The daemon's ``job_child_exited`` log lines (JSON), as dicts."""
    found = []
    for line in log_path.read_text(errors="replace").splitlines():
        if '"job_child_exited"' not in line:
            continue
        try:
            found.append(json.loads(line))
        except ValueError:
            continue
    return found


def hide_modules(workdir: Path, names: List[str]) -> Optional[Path]:
    """A directory with a sitecustomize.py that makes ``import NAME`` fail (as where the package is absent)."""
    if not names:
        return None
    site = workdir / "hide"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text("import sys\n" + "".join(
        f"sys.modules.setdefault({name!r}, None)\n" for name in names))
    return site


class AcceptingIngest(BaseHTTPRequestHandler):
    """Acknowledges every batch, as the hub would (no dedupe needed here); bench_idle.py uses it too."""

    protocol_version = "HTTP/1.1"

    def log_message(self, fmt: str, *args: object) -> None:
        pass

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
        reply = json.dumps({"accepted": [e["event_id"] for e in body["events"]], "duplicates": []}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)
        self.server.events += len(body["events"])  # type: ignore[attr-defined]


class IngestAndEmptyHub(AcceptingIngest):
    """The local ingest, and a hub with no policy bundle in this host's scope (204), as the policy fetch sees it."""

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self.send_response(204 if self.path.split("?")[0] == BUNDLE_PATH else 404)
        self.send_header("Content-Length", "0")
        self.end_headers()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def find_node_exporter(given: Optional[str], workdir: Path) -> Optional[str]:
    """The node_exporter binary: given, on PATH, or unpacked from the distribution's package (nothing installed)."""
    if given:
        if not (os.path.isfile(given) and os.access(given, os.X_OK)):
            raise SystemExit(f"bench_daemon_memory: --node-exporter {given}: not an executable file")
        return given
    found = shutil.which("node_exporter") or shutil.which("prometheus-node-exporter")
    if found:
        return found
    if shutil.which("apt-get") is None or shutil.which("dpkg-deb") is None:
        return None
    fetched = subprocess.run(["apt-get", "download", "prometheus-node-exporter"], cwd=workdir, capture_output=True,
                             text=True, check=False)
    debs = sorted(workdir.glob("prometheus-node-exporter_*.deb"))
    if fetched.returncode != 0 or not debs:
        print(f"apt-get download prometheus-node-exporter failed: {fetched.stderr.strip()[-300:]}", file=sys.stderr)
        return None
    unpacked = workdir / "node-exporter"
    subprocess.run(["dpkg-deb", "-x", str(debs[0]), str(unpacked)], check=True)
    binary = unpacked / "usr/bin/prometheus-node-exporter"
    return str(binary) if binary.exists() else None


def write_config(path: Path, state_dir: Path, speedup: float, endpoint: Optional[str]) -> Dict[str, float]:
    intervals = {name: seconds / speedup for name, seconds in DEFAULTS.items()}
    intervals["package_watch"] = max(intervals["package_watch"], 0.05)
    report = ""
    if endpoint:
        token = path.parent / "token"
        with open(os.open(token, os.O_CREAT | os.O_WRONLY, 0o600), "w") as handle:
            handle.write("bench-token-0123456789\n")
        report = f'endpoint_url = "{endpoint}"\ntoken_file = "{token}"\n'
    path.write_text(f'[agent]\nstate_dir = "{state_dir}"\nlog_level = "debug"\n'
                    f'[snapshot]\ninterval_seconds = {intervals["snapshot"]}\n'
                    f'[daemon]\nhealth_enabled = false\npackage_watch_interval_seconds = {intervals["package_watch"]}\n'
                    f'[report]\n{report}heartbeat_interval_seconds = {intervals["heartbeat"]}\n'
                    f'delivery_interval_seconds = {intervals["delivery"]}\n')
    return intervals


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--speedup", type=float, default=300.0)
    parser.add_argument("--seconds", type=float, default=None, help="soak length (default: a day / speedup)")
    parser.add_argument("--warmup-seconds", type=float, default=30.0)
    parser.add_argument("--sample-seconds", type=float, default=10.0)
    parser.add_argument("--scrape-seconds", type=float, default=1.0)
    parser.add_argument("--gpuguard", default=None, help="command prefix (default: python3 -m agent of this checkout)")
    parser.add_argument("--node-exporter", default=None,
                        help="node_exporter binary (default: PATH or apt-get download)")
    parser.add_argument("--endpoint", default=None,
                        help="report endpoint_url (default: a local ingest; 'none': events stay queued)")
    parser.add_argument("--goal-ratio", type=float, default=1.1,
                        help="agent max / node_exporter max at most this (default 1.1, issue #45)")
    parser.add_argument("--json", metavar="FILE", help="also write every sample as JSON")
    parser.add_argument("--hide", action="append", default=None, metavar="MODULE",
                        help="make MODULE unimportable in agent and children (default: rich; 'none' for nothing)")
    args = parser.parse_args()
    seconds = args.seconds if args.seconds is not None else 86400.0 / args.speedup
    ingest: Optional[ThreadingHTTPServer] = None
    endpoint = None if args.endpoint == "none" else args.endpoint
    if args.endpoint is None:
        ingest = ThreadingHTTPServer(("127.0.0.1", 0), IngestAndEmptyHub)
        ingest.events = 0  # type: ignore[attr-defined]
        threading.Thread(target=ingest.serve_forever, daemon=True).start()
        endpoint = f"http://127.0.0.1:{ingest.server_port}"
    with tempfile.TemporaryDirectory(prefix="gpuguard-soak-") as tmp:
        work = Path(tmp)
        intervals = write_config(work / "agent.toml", work / "state", args.speedup, endpoint)
        env = dict(os.environ)
        hidden = [m for m in (args.hide if args.hide is not None else ["rich"]) if m != "none"]
        site = hide_modules(work, hidden)
        if site is not None:
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site), env.get("PYTHONPATH", "")]))
        if args.gpuguard:
            agent_cmd = [*shlex.split(args.gpuguard), "run", "--config", str(work / "agent.toml")]
        else:
            agent_cmd = [sys.executable, "-m", "agent", "run", "--config", str(work / "agent.toml")]
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [env.get("PYTHONPATH", ""), str(REPO)]))
        exporter_bin = find_node_exporter(args.node_exporter, work)
        exporter: Optional[subprocess.Popen] = None
        port = free_port()
        if exporter_bin:
            exporter = subprocess.Popen([exporter_bin, f"--web.listen-address=127.0.0.1:{port}"],
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        else:
            print("node_exporter not available: agent RSS only", file=sys.stderr)
        agent_log = work / "agent.log"
        with open(agent_log, "wb") as log_file:
            agent = subprocess.Popen(agent_cmd, env=env, stdout=subprocess.DEVNULL, stderr=log_file)
        print(f"agent: {shlex.join(agent_cmd)}")
        print(f"intervals (s): {json.dumps({k: round(v, 4) for k, v in intervals.items()})}; soak {seconds:.0f} s "
              f"= {seconds * args.speedup / 3600:.1f} h of default-interval jobs")
        if exporter_bin:
            print(f"node_exporter: {exporter_bin} on 127.0.0.1:{port}, scraped every {args.scrape_seconds} s")
        samples: List[Dict[str, Optional[float]]] = []
        scrapes = scrape_failures = 0
        started = time.monotonic()
        next_sample = started
        print(f"{'t (s)':>7s} {'agent RSS (MiB)':>16s} {'node_exporter RSS (MiB)':>24s}")
        try:
            while time.monotonic() - started <= seconds:
                if agent.poll() is not None:
                    print(f"agent exited early ({agent.returncode}): {agent_log.read_text()[-800:]}",
                          file=sys.stderr)
                    return 1
                if exporter is not None:
                    try:
                        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
                            resp.read()
                        scrapes += 1
                    except OSError:
                        scrape_failures += 1
                now = time.monotonic()
                if now >= next_sample:
                    sample = {"t": round(now - started, 1), "agent_mib": rss_mib(agent.pid),
                              "node_exporter_mib": rss_mib(exporter.pid) if exporter is not None else None}
                    samples.append(sample)
                    ne = sample["node_exporter_mib"]
                    print(f"{sample['t']:7.0f} {sample['agent_mib'] or 0:16.1f} "
                          f"{(f'{ne:.1f}' if ne is not None else '-'):>24s}", flush=True)
                    next_sample += args.sample_seconds
                time.sleep(args.scrape_seconds)
        finally:
            agent_cpu = cpu_seconds(agent.pid)
            exporter_cpu = cpu_seconds(exporter.pid) if exporter is not None else None
            agent.send_signal(signal.SIGTERM)
            try:
                agent.wait(timeout=30)
            except subprocess.TimeoutExpired:
                agent.kill()
            if exporter is not None:
                exporter.terminate()
                exporter.wait(timeout=10)
        after = [s["agent_mib"] for s in samples if s["t"] >= args.warmup_seconds and s["agent_mib"] is not None]
        exporter_rss = [s["node_exporter_mib"] for s in samples if s["node_exporter_mib"] is not None]
        if not after:
            print("no samples after warm-up", file=sys.stderr)
            return 1
        mid = (max(after) + min(after)) / 2
        spread = (max(after) - min(after)) / 2
        print(f"agent after {args.warmup_seconds:.0f} s warm-up: {min(after):.1f} to {max(after):.1f} MiB "
              f"({mid:.1f} +- {spread:.1f}; goal +- 2) -> {'OK' if spread <= 2 else 'OVER GOAL'}")
        if exporter_rss:
            ne_max = max(exporter_rss)
            ratio = max(after) / ne_max
            print(f"node_exporter: {min(exporter_rss):.1f} to {ne_max:.1f} MiB over {scrapes} scrapes "
                  f"({scrape_failures} failed); agent max / node_exporter max = {ratio:.2f}x (goal <= "
                  f"{args.goal_ratio:g}x) -> {'OK' if ratio <= args.goal_ratio else 'OVER GOAL'}")
        exits = child_exits(agent_log)
        children: Dict[str, Dict[str, float]] = {}
        for entry in exits:
            job = children.setdefault(str(entry.get("job")), {"runs": 0, "failed": 0, "stopped": 0,
                                                               "max_rss_mib": 0.0, "cpu_seconds": 0.0})
            job["runs"] += 1
            # SIGTERM comes only from the daemon's shutdown (passed on, or the kernel's when it died): not a failure.
            job["stopped"] += entry.get("exit_code") == -signal.SIGTERM
            job["failed"] += entry.get("exit_code") not in (0, -signal.SIGTERM)
            job["max_rss_mib"] = max(job["max_rss_mib"], float(entry.get("max_rss_kib") or 0) / 1024)
            job["cpu_seconds"] += float(entry.get("cpu_seconds") or 0)
        if ingest is not None:
            ingest.shutdown()
            print(f"local ingest {endpoint}: {ingest.events} events delivered")  # type: ignore[attr-defined]
        print(f"resident daemon CPU: {agent_cpu if agent_cpu is not None else '-'} s over the soak; node_exporter "
              f"CPU: {exporter_cpu if exporter_cpu is not None else '-'} s")
        if not children:
            print("job children: none (the daemon ran every job in-process)")
        for name, job in sorted(children.items()):
            print(f"job children '{name}': {job['runs']:.0f} runs ({job['failed']:.0f} failed, {job['stopped']:.0f} "
                  f"stopped by the shutdown), peak RSS "
                  f"{job['max_rss_mib']:.1f} MiB, CPU {job['cpu_seconds']:.2f} s in all "
                  f"({job['cpu_seconds'] / max(job['runs'], 1):.3f} s a run)")
        if args.json:
            Path(args.json).write_text(json.dumps({"command": agent_cmd, "intervals": intervals, "seconds": seconds,
                                                   "speedup": args.speedup, "samples": samples, "scrapes": scrapes,
                                                   "agent_cpu_seconds": agent_cpu,
                                                   "node_exporter_cpu_seconds": exporter_cpu,
                                                   "hidden_modules": hidden, "children": children},
                                                  indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
