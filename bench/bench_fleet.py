"""A simulated fleet against the real hub: thousands of hosts, each with its own token and a random heartbeat phase
(as report.startup_jitter_seconds gives real agents), a realistic mix of heartbeats and rarer events, over HTTP to
``gpuguard hub serve`` on 127.0.0.1 with SQLite or a throwaway PostgreSQL (tests/hub/postgres.py).

For each fleet size in --hosts it runs an open loop for --duration-seconds: every host sends one batch per
--interval-seconds (default 60 s, the agent's default heartbeat), a heartbeat plus, in --extra-fraction of the
batches, one snapshot_changed / policy_violation / health_regression event. It reports the sustained reports/s,
latency from each batch's scheduled time (p50/p99/max) and the hub's CPU per 1,000 reports (all its processes).

Then retention: --history-hosts hosts get --history-hours of heartbeats written straight into the same database
(through the store, not HTTP), and one retention pass runs with the hub's defaults while the hub takes a live
run of --load-during-retention hosts: the bench reports how fast it deleted, the ingest latency meanwhile, the
bytes per stored event, and so the storage per host at steady state and per host per day.

The largest fleet a hub serves at the default interval is the largest --hosts run with p99 under 100 ms, no
errors and the offered rate sustained; the arithmetic for 100,000 hosts follows from the per-report CPU and the
retention rate. Traffic goes to 127.0.0.1 only; every phase is bounded in time.

Run (a few minutes):
    .venv/bin/python bench/bench_fleet.py --store sqlite --hosts 10000,30000,60000 --duration-seconds 40
    .venv/bin/python bench/bench_fleet.py --store postgresql --workers 2 --hosts 10000,30000,60000 --duration-seconds 40
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import http.client
import json
import os
import random
import secrets
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from agent.hub.retention import RetentionPolicy, run_pass  # noqa: E402
from agent.hub.settings import HubSettings  # noqa: E402
from agent.hub.store import make_store  # noqa: E402
from agent.log import configure  # noqa: E402
from agent.report.events import Event  # noqa: E402
from bench.bench_hub_ingest import percentile, process_cpu_seconds  # noqa: E402
from tests.hub.process import HubProcess, write_config  # noqa: E402

_PAIRING = {"os_id": "ubuntu", "os_version_id": "22.04", "kernel_running": "5.15.0-119-generic",
            "kernel_next_boot": "5.15.0-119-generic", "amdgpu_loaded": "6.8.5",
            "amdgpu_dkms_package": "1:6.8.5.60202-2041575.22.04", "rocm": "6.2.0",
            "rocm_core_package": "6.2.0.60200-66~22.04", "nvidia_loaded": None, "cuda_driver_api": None,
            "gpu_count": 8, "gpu_models": "AMD Instinct MI300X"}
_PAYLOADS = {
    "heartbeat": {"kind": "heartbeat", "agent_version": "0.1.0", "uptime_seconds": 3600.5, "content_hash": "c" * 64,
                  "outbox_depth": 0, "compliant": True, "last_health_status": "pass", "pairing": _PAIRING},
    "snapshot_changed": {"kind": "snapshot_changed", "old_hash": "a" * 64, "new_hash": "b" * 64,
                         "pairing": _PAIRING},
    "policy_violation": {"kind": "policy_violation", "rule": "rocm-pin", "message": "rocm-core 6.3.1 is not 6.2.0",
                         "packages": {"rocm-core": "6.3.1"}},
    "health_regression": {"kind": "health_regression", "metric": "gemm_tflops", "baseline_value": 100.0,
                          "current_value": 70.0, "drop_fraction": 0.3, "threshold_fraction": 0.1,
                          "fingerprint": "f2", "baseline_fingerprint": "f1"},
}
_EXTRA_KINDS = ("snapshot_changed", "policy_violation", "health_regression")


def event_json(host: str, kind: str, sequence: int, at: dt.datetime) -> str:
    return json.dumps({"schema_version": 1, "event_id": secrets.token_hex(16), "host_id": host,
                       "hostname": f"{host}.fleet", "sequence": sequence,
                       "occurred_at": at.strftime("%Y-%m-%dT%H:%M:%S.%fZ"), "severity": "info",
                       "payload": _PAYLOADS[kind]})


def host_name(index: int) -> str:
    return f"fleet-{index:06d}"


def write_tokens(path: Path, hosts: int) -> List[str]:
    """One host token per simulated host, written in one go (add-host per host would rewrite the file each time)."""
    entries, tokens = [], []
    created = dt.datetime.now(dt.timezone.utc).isoformat()
    for index in range(hosts):
        selector, secret = secrets.token_hex(8), secrets.token_urlsafe(32)
        entries.append({"selector": selector, "sha256": hashlib.sha256(secret.encode()).hexdigest(), "role": "host",
                        "subject": host_name(index), "created_at": created})
        tokens.append(f"gg1.{selector}.{secret}")
    path.write_text(json.dumps({"format": 1, "tokens": entries}))
    path.chmod(0o600)
    return tokens


class Client(threading.Thread):
    """Sends its share of the schedule over one keep-alive connection; latency counts from the scheduled time."""

    def __init__(self, port: int, schedule: List[Tuple[float, int]], tokens: List[str], extra_fraction: float,
                 seed: int) -> None:
        super().__init__(daemon=True)
        self.port, self.schedule, self.tokens = port, schedule, tokens
        self.extra_fraction = extra_fraction
        self.rng = random.Random(seed)
        self.latencies: List[float] = []
        self.done_at: List[float] = []
        self.events_sent = 0
        self.errors: Dict[str, int] = {}
        self.sequences: Dict[int, int] = {}

    def run(self) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        for due, host in self.schedule:
            delay = due - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            name = host_name(host)
            sequence = self.sequences.get(host, 0)
            now = dt.datetime.now(dt.timezone.utc)
            events = [event_json(name, "heartbeat", sequence + 1, now)]
            if self.rng.random() < self.extra_fraction:
                events.append(event_json(name, self.rng.choice(_EXTRA_KINDS), sequence + 2, now))
            self.sequences[host] = sequence + len(events)
            body = ('{"schema_version": 1, "events": [' + ", ".join(events) + "]}").encode()
            headers = {"Authorization": f"Bearer {self.tokens[host]}", "Content-Type": "application/json"}
            try:
                conn.request("POST", "/v1/events", body=body, headers=headers)
                answer = conn.getresponse()
                answer.read()
                status = answer.status
            except (OSError, http.client.HTTPException) as exc:
                status = 0
                self.errors[type(exc).__name__] = self.errors.get(type(exc).__name__, 0) + 1
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
            finished = time.monotonic()
            if status == 200:
                self.latencies.append(finished - due)
                self.done_at.append(finished)
                self.events_sent += len(events)
            elif status:
                self.errors[str(status)] = self.errors.get(str(status), 0) + 1
        conn.close()


def with_children(pid: int) -> List[int]:
    """A process and its direct children (the hub's workers; the PostgreSQL server's backends)."""
    pids = [pid]
    try:
        pids += [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        pass
    return pids


def hub_pids(hub: HubProcess) -> List[int]:
    assert hub.process is not None
    return with_children(hub.process.pid)


def hub_cpu_seconds(pids: List[int]) -> float:
    total = 0.0
    for pid in pids:
        try:
            total += process_cpu_seconds(pid)
        except OSError:
            pass
    return total


def live_run(hub: HubProcess, tokens: List[str], hosts: int, args: argparse.Namespace,
             database_pid: Optional[int] = None) -> Dict[str, Any]:
    """One open-loop run of ``hosts`` hosts for the duration; figures from the middle 80% of the window."""
    rng = random.Random(hosts)
    start = time.monotonic() + 1.0
    schedule = []
    for host in range(hosts):
        due = start + rng.uniform(0, args.interval_seconds)
        while due < start + args.duration_seconds:
            schedule.append((due, host))
            due += args.interval_seconds
    schedule.sort()
    clients = [Client(hub.port or 0, schedule[i::args.clients], tokens, args.extra_fraction, i)
               for i in range(args.clients)]
    pids = hub_pids(hub)
    database = with_children(database_pid) if database_pid else []
    cpu_before, database_before = hub_cpu_seconds(pids), hub_cpu_seconds(database)
    for client in clients:
        client.start()
    for client in clients:
        client.join(args.duration_seconds + 120)
    cpu_after, database_after = hub_cpu_seconds(pids), hub_cpu_seconds(database)
    latencies = sorted(x for c in clients for x in c.latencies)
    done = sorted(x for c in clients for x in c.done_at)
    lo, hi = start + 0.1 * args.duration_seconds, start + 0.9 * args.duration_seconds
    middle = sum(1 for t in done if lo <= t < hi)
    errors: Dict[str, int] = {}
    for client in clients:
        for key, count in client.errors.items():
            errors[key] = errors.get(key, 0) + count
    answered = len(latencies)
    return {"hosts": hosts, "offered_reports_per_second": round(hosts / args.interval_seconds, 1),
            "sustained_reports_per_second": round(middle / (hi - lo), 1), "requests": len(schedule),
            "answered": answered, "events": sum(c.events_sent for c in clients), "errors": errors,
            "latency_ms": {"p50": round(percentile(latencies, 0.5) * 1000, 2),
                           "p99": round(percentile(latencies, 0.99) * 1000, 2),
                           "max": round(latencies[-1] * 1000, 2) if latencies else None},
            "hub_cpu_seconds_per_1000_reports": round((cpu_after - cpu_before) / max(1, answered) * 1000, 3),
            "database_cpu_seconds_per_1000_reports": round((database_after - database_before) / max(1, answered)
                                                           * 1000, 3) if database else None,
            "hub_processes": len(pids)}


def database_bytes(url: str) -> int:
    if url.startswith("sqlite:///"):
        import sqlite3

        path = Path(url[len("sqlite:///"):])
        with sqlite3.connect(path) as conn:  # the WAL's pages into the file, so the file size is the data
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        return sum(p.stat().st_size for p in (path, Path(f"{path}-wal")) if p.exists())
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT pg_total_relation_size('events')").fetchone()
    return int(row[0]) if row else 0


def event_count(url: str) -> int:
    if url.startswith("sqlite:///"):
        import sqlite3

        with sqlite3.connect(url[len("sqlite:///"):]) as conn:
            return int(conn.execute("SELECT COUNT(*) FROM events").fetchone()[0])
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT COUNT(*) FROM events").fetchone()
    return int(row[0]) if row else 0


def retention_run(url: str, args: argparse.Namespace,
                  during: Optional[Callable[[], Dict[str, Any]]] = None) -> Dict[str, Any]:
    """Write history for --history-hosts hosts, then one retention pass with the hub's defaults, timed; with
    ``during``, the pass starts 5 s into that live run and both go on together (does pruning hold up ingest?)."""
    defaults = HubSettings()
    policy = RetentionPolicy(defaults.retention_heartbeat_hours, defaults.retention_event_days)
    store = make_store(url, "normal")
    store.open()
    now = dt.datetime.now(dt.timezone.utc)
    per_host = int(args.history_hours * 3600 / args.interval_seconds)
    written = 0
    started = time.monotonic()
    try:
        batch: List[Event] = []
        for host in range(args.history_hosts):
            name = f"history-{host:05d}"
            for step in range(per_host):
                at = now - dt.timedelta(seconds=(per_host - step) * args.interval_seconds)
                batch.append(Event.model_validate_json(event_json(name, "heartbeat", step + 1, at)))
                if len(batch) >= 5000:
                    store.ingest([batch], received_at=now)
                    written += len(batch)
                    batch = []
        if batch:
            store.ingest([batch], received_at=now)
            written += len(batch)
        write_seconds = time.monotonic() - started
        rows_before = event_count(url)
        bytes_before = database_bytes(url)
        outcome: Dict[str, Any] = {}

        def prune() -> None:
            started = time.monotonic()
            outcome["deleted"] = run_pass(store, policy, now, defaults.retention_batch_rows, pause_seconds=0.05)
            outcome["seconds"] = time.monotonic() - started

        live: Optional[Dict[str, Any]] = None
        if during is None:
            prune()
        else:
            pruner = threading.Timer(5.0, prune)
            pruner.start()
            live = during()
            pruner.join()
        deleted, prune_seconds = outcome["deleted"], outcome["seconds"]
        rows_after = event_count(url)
    finally:
        store.close()
    deleted_total = sum(deleted.values())
    return {"history_hosts": args.history_hosts, "history_hours": args.history_hours, "written": written,
            "write_seconds": round(write_seconds, 1), "rows_before": rows_before, "rows_after": rows_after,
            "deleted": deleted_total, "prune_seconds": round(prune_seconds, 1),
            "deletes_per_second": round(deleted_total / max(prune_seconds, 1e-9)),
            "bytes_per_event": round(bytes_before / max(1, rows_before)),
            "policy": {"heartbeat_hours": policy.heartbeat_hours, "event_days": policy.event_days},
            "ingest_during_the_pass": live}


def arithmetic(runs: List[Dict[str, Any]], retention: Dict[str, Any], args: argparse.Namespace) -> Dict[str, Any]:
    good = [r for r in runs if not r["errors"] and r["latency_ms"]["p99"] < 100
            and r["sustained_reports_per_second"] >= 0.97 * r["offered_reports_per_second"]]
    largest = max((r["hosts"] for r in good), default=0)
    heartbeats_per_day = 86400 / args.interval_seconds
    kept_heartbeats = retention["policy"]["heartbeat_hours"] * 3600 / args.interval_seconds
    extra_per_day = heartbeats_per_day * args.extra_fraction
    kept_extra = extra_per_day * retention["policy"]["event_days"]
    bytes_per_event = retention["bytes_per_event"]
    # The largest run's CPU per report (batching makes it fall with load); hub and database together.
    biggest = max(runs, key=lambda r: r["hosts"]) if runs else {}
    cpu = biggest.get("hub_cpu_seconds_per_1000_reports", 0.0) + (biggest.get("database_cpu_seconds_per_1000_reports")
                                                                  or 0.0)
    reports_100k = 100_000 / args.interval_seconds
    return {
        "largest_fleet_tested_within_goal": largest,
        "storage_per_host_steady_state_bytes": round((kept_heartbeats + kept_extra) * bytes_per_event),
        "storage_per_host_per_day_before_retention_bytes": round((heartbeats_per_day + extra_per_day)
                                                                  * bytes_per_event),
        "storage_growth_per_host_per_day_after_retention_bytes": 0,
        "hosts_100k": {"reports_per_second": round(reports_100k, 1),
                       "cores_at_measured_cpu_hub_and_database": round(reports_100k * cpu / 1000, 2),
                       "retention_deletes_per_second_needed": round(reports_100k * (1 + args.extra_fraction), 1),
                       "storage_steady_state_gb": round(100_000 * (kept_heartbeats + kept_extra)
                                                        * bytes_per_event / 1e9, 1)},
    }


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--store", choices=["sqlite", "postgresql"], default="sqlite")
    parser.add_argument("--workers", type=int, default=1, help="hub workers (hub.toml workers)")
    parser.add_argument("--hosts", default="10000", help="comma-separated fleet sizes, one run each")
    parser.add_argument("--interval-seconds", type=float, default=60.0, help="each host's heartbeat interval")
    parser.add_argument("--duration-seconds", type=float, default=40.0, help="each run's length")
    parser.add_argument("--clients", type=int, default=32, help="sender threads (keep-alive connections)")
    parser.add_argument("--extra-fraction", type=float, default=0.002,
                        help="share of batches that also carry a snapshot/violation/regression event")
    parser.add_argument("--history-hosts", type=int, default=100)
    parser.add_argument("--history-hours", type=float, default=30.0)
    parser.add_argument("--load-during-retention", type=int, default=10000, metavar="HOSTS",
                        help="a live run of this many hosts while the retention pass runs (0: the pass alone)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON only")
    args = parser.parse_args(argv)
    configure(level="warning")  # the in-process store's log lines would mix with the figures on stdout
    sizes = [int(x) for x in args.hosts.split(",")]
    work = Path(tempfile.mkdtemp(prefix="gg-fleet-"))
    pg = None
    if args.store == "sqlite":
        url = f"sqlite:///{work}/hub.db"
    else:
        from tests.hub.postgres import PostgresServer

        pg = PostgresServer()
        pg.start()
        url = pg.create_database("fleet")
    tokens = write_tokens(work / "tokens.json", max(sizes + [args.load_during_retention]))
    config = write_config(work / "hub.toml", listen_host="127.0.0.1", listen_port=0, database_url=url,
                          tokens_file=work / "tokens.json", workers=args.workers, max_pending_batches=100_000)
    hub = HubProcess(config)
    runs: List[Dict[str, Any]] = []
    retention: Dict[str, Any] = {}
    try:
        hub.start()
        for hosts in sizes:
            result = live_run(hub, tokens, hosts, args, pg.process.pid if pg is not None and pg.process else None)
            runs.append(result)
            if not args.json:
                print(json.dumps(result), flush=True)
        during = None
        if args.load_during_retention:
            def during() -> Dict[str, Any]:
                return live_run(hub, tokens, args.load_during_retention, args,
                                pg.process.pid if pg is not None and pg.process else None)
        retention = retention_run(url, args, during)
        if not args.json:
            print(json.dumps(retention), flush=True)
    finally:
        hub.stop()
        if pg is not None:
            pg.stop()
    report = {"store": args.store, "workers": args.workers, "interval_seconds": args.interval_seconds,
              "cpu_count": os.cpu_count(), "load_average_at_end": os.getloadavg(), "runs": runs,
              "retention": retention, "arithmetic": arithmetic(runs, retention, args)}
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
