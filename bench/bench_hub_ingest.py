"""Hub ingest throughput: a real ``gpuguard hub serve`` (uvicorn, SQLite in a temp dir) on 127.0.0.1, driven by N
concurrent clients, each request one report batch; then every event_id is checked to be stored exactly once.

Two ways to drive it:
    --rate R     open loop: the clients together send R requests/s on a fixed schedule; latency is measured from
                 each request's scheduled time (so a stall counts against every request it delayed)
    (no --rate)  closed loop: each client sends its next request as soon as the previous one is answered; this
                 finds the ceiling

Goal (issue #6): 1,000 reports/s sustained with SQLite, p99 under 100 ms, nothing lost, on a 2-core machine.
Traffic goes to 127.0.0.1 only; the run is bounded by --duration-seconds and --max-requests and stops by itself.
Run: .venv/bin/python bench/bench_hub_ingest.py --rate 1000 --duration-seconds 30
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import platform
import sqlite3
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Dict, List, Optional, Tuple

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from agent.hub.tokens import add_token  # noqa: E402
from tests.hub.process import HubProcess, write_config  # noqa: E402

# One heartbeat with a full pairing: what a host sends most often (about 700 bytes as JSON).
_TEMPLATE = json.dumps({"schema_version": 1, "events": [{
    "schema_version": 1, "event_id": "@ID@", "host_id": "@HOST@", "hostname": "@HOST@.bench", "sequence": 0,
    "occurred_at": "@AT@", "severity": "info",
    "payload": {"kind": "heartbeat", "agent_version": "0.1.0", "uptime_seconds": 3600.5, "content_hash": "c" * 64,
                "outbox_depth": 0, "compliant": True, "last_health_status": "ok",
                "pairing": {"os_id": "ubuntu", "os_version_id": "22.04", "kernel_running": "5.15.0-119-generic",
                            "kernel_next_boot": "5.15.0-119-generic", "amdgpu_loaded": "6.8.5",
                            "amdgpu_dkms_package": "1:6.8.5.60202-2041575.22.04", "rocm": "6.2.0",
                            "rocm_core_package": "6.2.0.60200-66~22.04", "nvidia_loaded": None,
                            "cuda_driver_api": None, "gpu_count": 8, "gpu_models": "AMD Instinct MI300X"}}}]})


def body_for(host_id: str, event_id: str, sequence: int) -> bytes:
    at = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime()) + "Z"
    text = _TEMPLATE.replace("@ID@", event_id).replace("@HOST@", host_id).replace("@AT@", at)
    return text.replace('"sequence": 0', f'"sequence": {sequence}', 1).encode()


class Client(threading.Thread):
    """One host: a keep-alive connection, its own token, its own events."""

    def __init__(self, index: int, port: int, token: str, start_at: float, stop_at: float,
                 interval_seconds: Optional[float], max_requests: int) -> None:
        super().__init__(name=f"client-{index}", daemon=True)
        self.host_id = f"bench-host-{index:03d}"
        self.port = port
        self.headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
        self.start_at = start_at
        self.stop_at = stop_at
        self.interval_seconds = interval_seconds
        self.max_requests = max_requests
        self.latencies_seconds: List[float] = []
        self.service_seconds: List[float] = []
        self.done_at: List[float] = []
        self.accepted: List[str] = []
        self.sent: List[str] = []
        self.errors: Dict[str, int] = {}

    def _connect(self) -> http.client.HTTPConnection:
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)

    def run(self) -> None:
        conn = self._connect()
        sequence = 0
        scheduled = self.start_at
        while sequence < self.max_requests:
            if self.interval_seconds is not None:
                delay = scheduled - time.perf_counter()
                if delay > 0:
                    time.sleep(delay)
            else:
                scheduled = time.perf_counter()
            if scheduled >= self.stop_at:
                break
            event_id = uuid.uuid4().hex
            self.sent.append(event_id)
            sent_at = time.perf_counter()
            try:
                conn.request("POST", "/v1/events", body=body_for(self.host_id, event_id, sequence),
                             headers=self.headers)
                response = conn.getresponse()
                payload = response.read()
                finished = time.perf_counter()
                if response.status == 200:
                    self.accepted.extend(json.loads(payload)["accepted"])
                    self.latencies_seconds.append(finished - scheduled)
                    self.service_seconds.append(finished - sent_at)
                    self.done_at.append(finished)
                else:
                    key = f"http_{response.status}"
                    self.errors[key] = self.errors.get(key, 0) + 1
            except (OSError, http.client.HTTPException) as exc:
                key = type(exc).__name__
                self.errors[key] = self.errors.get(key, 0) + 1
                conn.close()
                conn = self._connect()
            sequence += 1
            if self.interval_seconds is not None:
                scheduled += self.interval_seconds
        conn.close()


def _cpu_seconds(stat_path: str) -> float:
    fields = Path(stat_path).read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def process_cpu_seconds(pid: int) -> float:
    """User + system CPU of a process so far (Linux /proc)."""
    return _cpu_seconds(f"/proc/{pid}/stat")


def main_thread_cpu_seconds(pid: int) -> float:
    """CPU of the process's main thread (the hub's event loop) so far."""
    return _cpu_seconds(f"/proc/{pid}/task/{pid}/stat")


def percentile(sorted_values: List[float], fraction: float) -> float:
    if not sorted_values:
        return float("nan")
    index = min(len(sorted_values) - 1, max(0, int(round(fraction * len(sorted_values) + 0.5)) - 1))
    return sorted_values[index]


def stored_events(db_path: Path) -> Tuple[int, Dict[Tuple[str, str], int]]:
    with sqlite3.connect(db_path) as conn:
        rows = conn.execute("SELECT host_id, event_id, COUNT(*) FROM events GROUP BY host_id, event_id").fetchall()
        total = conn.execute("SELECT COUNT(*) FROM events").fetchone()[0]
    return total, {(h, e): n for h, e, n in rows}


def run(args: argparse.Namespace) -> dict:
    load_before = round(os.getloadavg()[0], 2)
    with tempfile.TemporaryDirectory(prefix="hub-bench-") as tmp:
        root = Path(tmp)
        tokens_file = root / "tokens.json"
        tokens = [add_token(str(tokens_file), "host", f"bench-host-{i:03d}") for i in range(args.clients)]
        config = write_config(root / "hub.toml", listen_host="127.0.0.1", listen_port=0,
                              database_url=f"sqlite:///{root}/hub.db", tokens_file=tokens_file,
                              sqlite_synchronous=args.sqlite_synchronous, shutdown_timeout_seconds=10)
        env = dict(os.environ)
        hub = HubProcess(config, env=env).start()
        try:
            warmup = Client(0, hub.port, tokens[0], time.perf_counter(), float("inf"), None, args.warmup_requests)
            warmup.run()  # first requests pay for lazy imports and cold caches: not measured, but verified below
            now = time.perf_counter()
            start_at = now + 0.5
            stop_at = start_at + args.duration_seconds
            interval = args.clients / args.rate if args.rate else None
            per_client_cap = max(1, args.max_requests // args.clients)
            clients = [Client(i, hub.port, tokens[i], start_at + (interval or 0) * i / args.clients, stop_at,
                              interval, per_client_cap) for i in range(args.clients)]
            cpu_before = os.times()
            hub_cpu_before = process_cpu_seconds(hub.process.pid)
            loop_cpu_before = main_thread_cpu_seconds(hub.process.pid)
            for client in clients:
                client.start()
            for client in clients:
                client.join(args.duration_seconds + 60)
            wall_end = time.perf_counter()
            cpu_after = os.times()
            hub_cpu_seconds = process_cpu_seconds(hub.process.pid) - hub_cpu_before
            loop_cpu_seconds = main_thread_cpu_seconds(hub.process.pid) - loop_cpu_before
        finally:
            exit_code = hub.stop()
        stopped = hub.events("hub_stopped")
        total_rows, stored = stored_events(root / "hub.db")

    latencies = sorted(s for c in clients for s in c.latencies_seconds)
    service = sorted(s for c in clients for s in c.service_seconds)
    done = sorted(t for c in clients for t in c.done_at)
    accepted = [(c.host_id, e) for c in [warmup, *clients] for e in c.accepted]
    sent = [(c.host_id, e) for c in [warmup, *clients] for e in c.sent]
    errors: Dict[str, int] = {}
    for client in [warmup, *clients]:
        for key, count in client.errors.items():
            errors[key] = errors.get(key, 0) + count
    elapsed = (done[-1] - start_at) if done else float("nan")
    # Sustained rate: answered requests per second over the steady middle (first and last 10% of time cut).
    lo, hi = start_at + 0.1 * args.duration_seconds, start_at + 0.9 * args.duration_seconds
    middle = [t for t in done if lo <= t < hi]
    per_second = [0] * max(1, int(args.duration_seconds + 0.999))
    for t in done:
        second = int(t - start_at)
        if 0 <= second < len(per_second):
            per_second[second] += 1
    missing = [k for k in accepted if k not in stored]
    duplicated = [k for k, n in stored.items() if n != 1]
    unexpected = set(stored) - set(sent)
    commit_count = stopped[0].get("commit_count") if stopped else None
    batch_count = stopped[0].get("batch_count") if stopped else None
    return {
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform(),
                    # Other work on the machine skews every figure: the 1-minute load before and after the run.
                    "loadavg_1min_before": load_before, "loadavg_1min_after": round(os.getloadavg()[0], 2)},
        "config": {"mode": "open loop" if args.rate else "closed loop", "target_rate_per_second": args.rate,
                   "clients": args.clients, "duration_seconds": args.duration_seconds,
                   "events_per_request": 1, "sqlite_synchronous": args.sqlite_synchronous},
        "warmup_requests": len(warmup.sent),
        "requests_sent": len(sent) - len(warmup.sent),
        "requests_ok": len(latencies),
        "errors": errors,
        "reports_per_second_overall": round(len(latencies) / elapsed, 1) if done else None,
        "reports_per_second_sustained": round(len(middle) / (hi - lo), 1),
        "latency_ms": {"p50": round(percentile(latencies, 0.50) * 1000, 2),
                       "p90": round(percentile(latencies, 0.90) * 1000, 2),
                       "p99": round(percentile(latencies, 0.99) * 1000, 2),
                       "max": round(latencies[-1] * 1000, 2) if latencies else None,
                       "mean": round(statistics.fmean(latencies) * 1000, 2) if latencies else None},
        "answered_per_second": per_second,
        # From the moment the request was really sent (not scheduled): the hub's share, without client lag.
        "service_ms": {"p50": round(percentile(service, 0.50) * 1000, 2),
                       "p99": round(percentile(service, 0.99) * 1000, 2),
                       "max": round(service[-1] * 1000, 2) if service else None},
        "stored_rows": total_rows,
        "acknowledged_events": len(accepted),
        "acknowledged_but_missing": len(missing),
        "stored_more_than_once": len(duplicated),
        "stored_but_never_sent": len(unexpected),
        "nothing_lost": not missing and not duplicated and not unexpected and not errors
                        and len(accepted) == len(sent) == total_rows,
        "hub_commits": commit_count,
        "batches_per_commit": round(batch_count / commit_count, 2) if commit_count else None,
        "hub_exit_code": exit_code,
        "hub_cpu_seconds": round(hub_cpu_seconds, 2),
        "hub_event_loop_cpu_seconds": round(loop_cpu_seconds, 2),
        "hub_cpu_microseconds_per_report": round(hub_cpu_seconds / max(1, len(latencies)) * 1e6),
        "bench_process_cpu_seconds": round((cpu_after.user + cpu_after.system)
                                           - (cpu_before.user + cpu_before.system), 2),
        "bench_wall_seconds": round(wall_end - start_at, 2),
    }


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clients", type=int, default=16, help="concurrent clients, one host each (default 16)")
    parser.add_argument("--rate", type=float, default=None, help="open loop: total requests/s (default: closed "
                                                                 "loop, as fast as answered)")
    parser.add_argument("--duration-seconds", type=float, default=20.0)
    parser.add_argument("--max-requests", type=int, default=200_000, help="upper bound on requests in all")
    parser.add_argument("--warmup-requests", type=int, default=200, help="sent first, one at a time, not timed")
    parser.add_argument("--sqlite-synchronous", choices=["full", "normal"], default="full")
    parser.add_argument("--json", action="store_true", help="print only the JSON result")
    args = parser.parse_args(argv)
    result = run(args)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        lat = result["latency_ms"]
        print(f"hub ingest ({result['config']['mode']}, {args.clients} clients, {args.duration_seconds:g} s, "
              f"SQLite synchronous={args.sqlite_synchronous}, {result['machine']['cpus']} CPUs, load "
              f"{result['machine']['loadavg_1min_before']} before / {result['machine']['loadavg_1min_after']} after)")
        print(f"  sustained {result['reports_per_second_sustained']} reports/s "
              f"(overall {result['reports_per_second_overall']}), {result['requests_ok']} ok of "
              f"{result['requests_sent']} sent, errors {result['errors'] or 'none'}")
        print(f"  latency ms: p50 {lat['p50']}  p90 {lat['p90']}  p99 {lat['p99']}  max {lat['max']}  "
              f"(sent-to-answer: p50 {result['service_ms']['p50']}  p99 {result['service_ms']['p99']})")
        print(f"  answered per second: {result['answered_per_second']}")
        print(f"  stored {result['stored_rows']} rows; acknowledged-but-missing {result['acknowledged_but_missing']}, "
              f"stored twice {result['stored_more_than_once']}; nothing lost: {result['nothing_lost']}")
        print(f"  hub: {result['hub_commits']} commits, {result['batches_per_commit']} batches/commit, "
              f"exit {result['hub_exit_code']}; CPU: hub {result['hub_cpu_seconds']} s "
              f"(event loop {result['hub_event_loop_cpu_seconds']} s) "
              f"({result['hub_cpu_microseconds_per_report']} us/report), bench clients "
              f"{result['bench_process_cpu_seconds']} s")
        print(json.dumps(result))
    return 0 if result["nothing_lost"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
