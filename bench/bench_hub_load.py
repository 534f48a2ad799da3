"""The load harness (issue #43, "Scale, for real"): N simulated agents against several real hub processes over HTTP
on 127.0.0.1, sharing one real PostgreSQL, with a staged rollout running through them and one cohort breaking.

What it starts (and stops, each by its PID): a throwaway PostgreSQL (tests/hub/postgres.py: a unix socket in a temp
dir, fsync off, so it measures the hub, not the disk), --hub-processes ``gpuguard hub serve`` processes on
127.0.0.1 (each its own port, ``workers = 1``, the same ``database_url`` and tokens file: the "several machines"
shape of docs/hub.md "Scale out"), and one load-generator process (this one) with --clients threads, each holding one
keep-alive connection to one hub (thread i to hub i mod --hub-processes, as DNS round robin would spread them; a host
always talks to its thread's hub).
The tokens file for the --hosts hosts is written in one go (bench/bench_fleet.py's ``write_tokens``).

Each simulated agent does what the daemon does at the documented intervals (docs/reporting.md), with a random phase
as ``report.startup_jitter_seconds`` gives real agents: every ``report.heartbeat_interval_seconds`` (60 s) a
``POST /v1/events`` with its heartbeat (pairing, policy serial in force, last health status; in --extra-fraction of
them one snapshot_changed, policy_violation or health_regression event before it, bench_fleet's mix: a
health_regression is background failure the rollout's judge must not halt on), and on the same schedule
(the daemon's ``policy_fetch``) a ``GET /v1/policy/bundle`` with ``If-None-Match`` of the bundle it holds; a 200
offer is "installed" (its serial reported from then on). --speedup divides the intervals (time compressed); the
figures are given back at the real intervals (per-host rates, CPU per 1,000 hosts). The hub's own tick
(``rollout_tick_seconds``) is not compressed, so at --speedup above 1 its cost is spread over more hosts than it
would be: take CPU figures from --speedup 1.

The scenario, as an operator runs it: bundle 1 pushed, every host fetches it (warm-up, one interval); bundle 2 pushed
``--staged`` and a rollout started, both with the CLI (``gpuguard hub policy push``, ``gpuguard hub rollout start``
with --canaries per cohort, batches 5,25,100, no soak); the canaries fetch it, report a pass, and the rollout
widens to stage 1 at the hub's tick. Then every host of cohort 0 that installed the target reports
``cpu_fallback`` at once (a cpu_fallback event and its heartbeat with that status, as the agent delivers its
post-change check; its later heartbeats keep the status): the bench measures from the first failing report's send
to the halt stored (committed: first seen by polling ``GET /v1/rollouts`` every 50 ms, so at most one poll late),
to the deciding evaluation's start (the rollout row's ``updated_at``, the hub's clock, this machine's), and to the
first held-back host's fetch that carried the halted state (that one waits for the host's own next fetch). The load
goes on until --seconds have passed since it began.

Reported (text, or one JSON object with --json): the hub's CPU (all its processes, from /proc) in cores and per
1,000 hosts at the real intervals, PostgreSQL's CPU (its processes), requests/s, p50/p99 latency per endpoint (from
each request's send to its answer) and the generator's lag behind its schedule, errors by status, the halt delays,
and from the hubs' logs the rollout ticks that overran their interval or were skipped behind a running one.
Figures come from the window from the rollout's start to the end of the load (the warm-up's bundle downloads left
out). Traffic goes to 127.0.0.1 and the unix socket only; every wait is bounded.

Goal (issue #43): the halt stored within HALT_GOAL_SECONDS (5 s) of the failing report at 10,000 hosts, every request
answered; the exit status is 1 when no halt came. Run (about 6 minutes at 10,000 hosts; docs/hub.md has the figures):
    .venv/bin/python bench/bench_hub_load.py --hosts 10000 --hub-processes 2 --seconds 300
At 50,000 hosts on a 2-core machine, stretch the agents' intervals (--speedup below 1: 0.5 makes them 120 s, so the
hubs take the request rate of 25,000 hosts at 60 s while holding 50,000 hosts and rollout members; the CPU per 1,000
hosts is given back at the real interval), about 8 minutes:
    .venv/bin/python bench/bench_hub_load.py --hosts 50000 --hub-processes 2 --speedup 0.5 --seconds 420
"""

from __future__ import annotations

import argparse
import datetime as dt
import heapq
import http.client
import json
import os
import random
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Set, Tuple

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from agent.hub.tokens import add_token  # noqa: E402
from agent.log import configure  # noqa: E402
from agent.wire import BUNDLE_PATH, INGEST_PATH, ROLLOUT_STATE_HEADER  # noqa: E402
from bench.bench_fleet import event_json, with_children, write_tokens  # noqa: E402
from bench.bench_hub_ingest import percentile  # noqa: E402
from tests.hub.postgres import PostgresServer  # noqa: E402
from tests.hub.process import HubProcess, write_config  # noqa: E402
from tests.hub.signing import keys_dir, signature_of  # noqa: E402
from tests.hub.test_policy_bundles import bundle_bytes  # noqa: E402

HEARTBEAT, FETCH = 0, 1
ENDPOINTS = {HEARTBEAT: f"POST {INGEST_PATH}", FETCH: f"GET {BUNDLE_PATH}"}
ROLLOUTS_ENDPOINT = "GET /v1/rollouts"
EXTRA_KINDS = ("snapshot_changed", "policy_violation", "health_regression")  # bench_fleet's payloads
BROKEN_COHORT = 0
FAILING_STATUS = "cpu_fallback"
POLL_SECONDS = 0.05
HALT_GOAL_SECONDS = 5.0
HALT_TIMEOUT_SECONDS = 60.0  # ends a run whose halt never comes; the bound is 5 s
CLI_TIMEOUT_SECONDS = 120.0
BURST_CONNECTIONS = 8
SKIPPED_RUN = "skipped: maximum number of running instances reached"  # apscheduler's warning for a merged tick


def host_name(index: int) -> str:
    """The same names as bench_fleet's tokens (its write_tokens names hosts fleet-NNNNNN)."""
    return f"fleet-{index:06d}"


def pairing_for(cohort: int) -> Dict[str, Any]:
    """A pairing whose GPU model puts the host in ``cohort`` (the rest is the same for every host)."""
    return {"os_id": "ubuntu", "os_version_id": "22.04", "kernel_running": "6.8.0-49-generic",
            "kernel_next_boot": "6.8.0-49-generic", "amdgpu_loaded": "6.10.5",
            "amdgpu_dkms_package": "1:6.10.5.60301-2111487.22.04", "rocm": "6.3.1",
            "rocm_core_package": "6.3.1.60301-48~22.04", "nvidia_loaded": None, "cuda_driver_api": None,
            "gpu_count": 8, "gpu_models": f"GPU model {cohort}"}


class Fleet:
    """What every simulated host holds: the serial in force, the ETag of its bundle, its event sequence; and what the
    scenario decided (the target serial, the broken cohort) and observed (who installed the target, when a held-back
    host first saw the halt). Each host belongs to one client thread; the burst writes only ``broken`` first."""

    def __init__(self, hosts: int, cohorts: int, tokens: List[str]) -> None:
        self.hosts, self.cohorts, self.tokens = hosts, cohorts, tokens
        self.serial: List[Optional[int]] = [None] * hosts
        self.etag: List[Optional[str]] = [None] * hosts
        self.heard: List[bool] = [False] * hosts
        self.sequence = [0] * hosts
        self.lock = threading.Lock()
        self.pairings = [json.dumps(pairing_for(c)) for c in range(cohorts)]
        self.target: Optional[int] = None
        self.broken: bool = False
        self.installed_target: Set[int] = set()
        self.halt_offered_at: Optional[float] = None  # wall clock (time.time)

    def cohort(self, host: int) -> int:
        return host % self.cohorts

    def status(self, host: int) -> str:
        failing = (self.broken and self.cohort(host) == BROKEN_COHORT and self.target is not None
                   and self.serial[host] == self.target)
        return FAILING_STATUS if failing else "pass"

    def batch_body(self, host: int, extras: Sequence[str] = ()) -> bytes:
        """The host's EventBatch: each event of ``extras`` (EXTRA_KINDS, or FAILING_STATUS: the health check's
        cpu_fallback event), then its heartbeat, as the agent's outbox delivers them."""
        with self.lock:
            first = self.sequence[host] + 1
            self.sequence[host] += len(extras) + 1
        name = host_name(host)
        at = dt.datetime.now(dt.timezone.utc)
        events = [extra_json(name, kind, first + i, at) for i, kind in enumerate(extras)]
        serial = self.serial[host]
        policy = f', "policy_source": "bundle", "policy_serial": {serial}' if serial is not None else ""
        payload = ('{"kind": "heartbeat", "agent_version": "0.1.0", "uptime_seconds": 3600.5, '
                   f'"content_hash": "{"c" * 64}", "outbox_depth": 0, "compliant": true, '
                   f'"last_health_status": "{self.status(host)}", "pairing": {self.pairings[self.cohort(host)]}'
                   f'{policy}}}')
        events.append(f'{{"schema_version": 1, "event_id": "{secrets.token_hex(16)}", "host_id": "{name}", '
                      f'"hostname": "{name}.fleet", "sequence": {first + len(extras)}, '
                      f'"occurred_at": "{at.strftime("%Y-%m-%dT%H:%M:%S.%fZ")}", "severity": "info", '
                      f'"payload": {payload}}}')
        return ('{"schema_version": 1, "events": [' + ", ".join(events) + "]}").encode()


def extra_json(name: str, kind: str, sequence: int, at: dt.datetime) -> str:
    """One event other than the heartbeat: bench_fleet's payloads, or the health check's cpu_fallback."""
    if kind != FAILING_STATUS:
        return event_json(name, kind, sequence, at)
    return json.dumps({"schema_version": 1, "event_id": secrets.token_hex(16), "host_id": name,
                       "hostname": f"{name}.fleet", "sequence": sequence,
                       "occurred_at": at.strftime("%Y-%m-%dT%H:%M:%S.%fZ"), "severity": "critical",
                       "payload": {"kind": FAILING_STATUS, "reason": "the workload ran on the CPU",
                                   "fingerprint": "f1"}})


class Connection:
    """One keep-alive connection to one hub; a request on a connection the hub closed meanwhile is sent again once on
    a new one (counted as a reconnect, not an error)."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        self.reconnects = 0

    def request(self, method: str, path: str, body: Optional[bytes],
                headers: Dict[str, str]) -> Tuple[int, Dict[str, str], bytes]:
        for attempt in (0, 1):
            try:
                self.conn.request(method, path, body=body, headers=headers)
                answer = self.conn.getresponse()
                data = answer.read()
                return answer.status, {k.lower(): v for k, v in answer.getheaders()}, data
            except (OSError, http.client.HTTPException):
                self.conn.close()
                self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
                if attempt:
                    raise
                self.reconnects += 1
        raise AssertionError("unreachable")

    def close(self) -> None:
        self.conn.close()


class Recorder:
    """Latencies per endpoint and statuses, per thread (merged at the end: no lock on the hot path)."""

    def __init__(self) -> None:
        self.latencies: Dict[str, List[Tuple[float, float, int]]] = {}  # endpoint -> (sent at, seconds, status)
        self.lags: List[Tuple[float, float]] = []
        self.failures: Dict[str, int] = {}

    def record(self, endpoint: str, sent: float, seconds: float, status: int) -> None:
        self.latencies.setdefault(endpoint, []).append((sent, seconds, status))


def exchange(fleet: Fleet, conn: Connection, recorder: Recorder, host: int, kind: int,
             extras: Sequence[str] = ()) -> None:
    """One heartbeat (with ``extras`` before it) or one bundle fetch of ``host``, recorded; a fetch's 200 installs
    the offered serial."""
    token = fleet.tokens[host]
    sent = time.monotonic()
    try:
        if kind == HEARTBEAT:
            status, headers, _ = conn.request("POST", INGEST_PATH, fleet.batch_body(host, extras), {
                "Authorization": f"Bearer {token}", "Content-Type": "application/json"})
            if status == 200:
                fleet.heard[host] = True
        else:
            request_headers = {"Authorization": f"Bearer {token}"}
            etag = fleet.etag[host]
            if etag is not None:
                request_headers["If-None-Match"] = etag
            status, headers, data = conn.request("GET", BUNDLE_PATH, None, request_headers)
            if status == 200:
                serial = int(json.loads(data)["serial"])
                if fleet.serial[host] is None or serial > (fleet.serial[host] or 0):  # never back (as the agent)
                    fleet.serial[host], fleet.etag[host] = serial, headers.get("etag")
                    if serial == fleet.target:
                        fleet.installed_target.add(host)
            if (headers.get(ROLLOUT_STATE_HEADER.lower()) == "halted" and fleet.halt_offered_at is None
                    and fleet.serial[host] != fleet.target):
                fleet.halt_offered_at = time.time()
    except (OSError, http.client.HTTPException) as exc:
        recorder.failures[type(exc).__name__] = recorder.failures.get(type(exc).__name__, 0) + 1
        return
    recorder.record(ENDPOINTS[kind], sent, time.monotonic() - sent, status)


class Client(threading.Thread):
    """Plays its share of the hosts (one heap of due heartbeats and fetches) over one keep-alive connection."""

    def __init__(self, fleet: Fleet, port: int, hosts: List[int], interval_seconds: float, start: float,
                 stop: threading.Event, seed: int, extra_fraction: float) -> None:
        super().__init__(daemon=True)
        self.fleet, self.port, self.interval_seconds, self.stop = fleet, port, interval_seconds, stop
        self.recorder = Recorder()
        self.extra_fraction = extra_fraction
        self.rng = rng = random.Random(seed)
        self.due: List[Tuple[float, int, int]] = []
        for host in hosts:  # a random phase per host and job, as the daemon's startup jitter gives them
            self.due.append((start + rng.uniform(0, interval_seconds), host, HEARTBEAT))
            self.due.append((start + rng.uniform(0, interval_seconds), host, FETCH))
        heapq.heapify(self.due)
        self.reconnects = 0

    def run(self) -> None:
        conn = Connection(self.port)
        try:
            while self.due and not self.stop.is_set():
                due, host, kind = self.due[0]
                delay = due - time.monotonic()
                if delay > 0 and self.stop.wait(min(delay, 0.5)):
                    break
                if delay > 0.5:
                    continue
                heapq.heapreplace(self.due, (due + self.interval_seconds, host, kind))
                self.recorder.lags.append((due, max(0.0, time.monotonic() - due)))
                extras = (self.rng.choice(EXTRA_KINDS),) if kind == HEARTBEAT and self.rng.random() < \
                    self.extra_fraction else ()
                exchange(self.fleet, conn, self.recorder, host, kind, extras)
        finally:
            self.reconnects = conn.reconnects
            conn.close()


def cli(args: List[str], hub_url: str, admin_file: Path) -> Dict[str, Any]:
    """One ``gpuguard hub ...`` command as an operator runs it (its own process), its JSON answer."""
    done = subprocess.run([sys.executable, "-m", "agent", *args, "--hub", hub_url, "--token-file", str(admin_file),
                           "--json"], cwd=str(REPO), env={**os.environ, "PYTHONPATH": str(REPO)},
                          capture_output=True, text=True, timeout=CLI_TIMEOUT_SECONDS)
    if done.returncode != 0:
        raise RuntimeError(f"gpuguard {' '.join(args)}: exit {done.returncode}: {done.stderr.strip()[-500:]}")
    answer = json.loads(done.stdout)
    return answer if isinstance(answer, dict) else {}


def rollout_row(conn: Connection, token: str, rollout_id: str, recorder: Recorder) -> Dict[str, Any]:
    """The rollout's stored row, from ``GET /v1/rollouts`` (rows only, not the 10,000 hosts of the status call)."""
    sent = time.monotonic()
    status, _, data = conn.request("GET", "/v1/rollouts", None, {"Authorization": f"Bearer {token}"})
    recorder.record(ROLLOUTS_ENDPOINT, sent, time.monotonic() - sent, status)
    if status != 200:
        return {}
    return next((r for r in json.loads(data)["rollouts"] if r["rollout_id"] == rollout_id), {})


def wait_for(predicate: Any, timeout_seconds: float, step_seconds: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout_seconds
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(step_seconds)
    return bool(predicate())


def burst(fleet: Fleet, ports: List[int], clients: int, hosts: List[int],
          recorder: Recorder) -> Tuple[float, float]:
    """Every host in ``hosts`` sends its failing heartbeat now, over BURST_CONNECTIONS connections to its own hub;
    returns when the first was sent and the last answered (wall clock)."""
    first_sent = time.time()

    def send(share: List[int]) -> None:
        conns: Dict[int, Connection] = {}
        for host in share:
            port = ports[(host % clients) % len(ports)]  # the hub its thread talks to (run(): thread i, hub i mod N)
            conn = conns.setdefault(port, Connection(port))
            exchange(fleet, conn, recorder, host, HEARTBEAT, (FAILING_STATUS,))
        for conn in conns.values():
            conn.close()

    threads = [threading.Thread(target=send, args=(hosts[i::BURST_CONNECTIONS],), daemon=True)
               for i in range(BURST_CONNECTIONS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(HALT_TIMEOUT_SECONDS)
    return first_sent, time.time()


def measure_halt(fleet: Fleet, ports: List[int], clients: int, poller: Connection, poll_recorder: Recorder,
                 admin: str, rollout_id: str, interval: float) -> Dict[str, Any]:
    """Cohort 0's hosts on the target report their failure at once; the time to the stored halt, to the poll that
    saw it and to the first held-back host's fetch that carried it, from the first failing report's send."""
    broken = sorted(h for h in set(fleet.installed_target) if fleet.cohort(h) == BROKEN_COHORT)
    fleet.broken = True
    first_sent, last_answered = burst(fleet, ports, clients, broken, poll_recorder)
    halt: Dict[str, Any] = {"failing_hosts": len(broken)}
    seen: Dict[str, Any] = {}

    def halted() -> bool:
        row = rollout_row(poller, admin, rollout_id, poll_recorder)
        if row.get("state") == "halted":
            seen.update(row, seen_at=time.time())
            return True
        return False

    if wait_for(halted, HALT_TIMEOUT_SECONDS, POLL_SECONDS):
        # updated_at is the deciding evaluation's clock, read as it began; the poll sees the halt once committed.
        halt.update(stored_seconds_after_first_send=round(seen["seen_at"] - first_sent, 3),
                    evaluation_began_seconds_after_first_send=round(parse_time(seen["updated_at"]) - first_sent, 3),
                    last_failing_report_answered_seconds_after_first_send=round(last_answered - first_sent, 3),
                    reason=seen.get("reason", "")[:300])
        wait_for(lambda: fleet.halt_offered_at is not None, interval + 5)
        if fleet.halt_offered_at is not None:
            halt["held_back_host_offered_halt_seconds_after_first_send"] = round(
                fleet.halt_offered_at - first_sent, 3)
    halt["halted"] = bool(seen)
    halt["within_goal"] = bool(seen) and halt["stored_seconds_after_first_send"] <= HALT_GOAL_SECONDS
    return halt


def parse_time(text: str) -> float:
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def _stat_cpu_seconds(pid: int, reaped: bool) -> float:
    """utime + stime of a process (/proc/PID/stat), plus cutime + cstime (its children it has waited for) if
    ``reaped``; 0 for a process that is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    ticks = int(fields[11]) + int(fields[12]) + (int(fields[13]) + int(fields[14]) if reaped else 0)
    return ticks / os.sysconf("SC_CLK_TCK")


def cpu(roots: List[int]) -> float:
    """CPU seconds of each root process, its live children and the children it reaped: the difference of two calls
    counts a child that started or ended between them (a PostgreSQL backend, the hub's gpgv) as well."""
    total = 0.0
    for root in roots:
        total += _stat_cpu_seconds(root, reaped=True)
        total += sum(_stat_cpu_seconds(child, reaped=True) for child in with_children(root)[1:])
    return total


def rollout_ticks(hubs: Sequence[HubProcess]) -> Dict[str, Any]:
    """Over the whole run, from the hubs' logs: rollout ticks that ran longer than their interval
    (``hub_periodic_job_overran``, agent/hub/periodic.py) and the longest, and the ticks apscheduler skipped because
    one was still running (its own warning line)."""
    overran = [r for hub in hubs for r in hub.events("hub_periodic_job_overran") if r.get("job") == "rollouts"]
    skipped = sum(1 for hub in hubs for line in list(hub.lines) if SKIPPED_RUN in line and 'job "rollouts ' in line)
    return {"overran": len(overran), "skipped": skipped,
            "longest_overrun_seconds": max((float(r["duration_seconds"]) for r in overran), default=None)}


def summarize(recorders: List[Recorder], window: Tuple[float, float]) -> Dict[str, Any]:
    """p50/p99 per endpoint and requests/s in the window (monotonic times), statuses, lag behind the schedule."""
    lo, hi = window
    endpoints: Dict[str, Any] = {}
    names = sorted({name for r in recorders for name in r.latencies})
    total = 0
    for name in names:
        rows = [row for r in recorders for row in r.latencies.get(name, []) if lo <= row[0] < hi]
        inside = sorted(seconds for _, seconds, _ in rows)
        statuses: Dict[str, int] = {}
        for _, _, status in rows:
            statuses[str(status)] = statuses.get(str(status), 0) + 1
        total += len(inside)
        endpoints[name] = {"requests": len(inside), "per_second": round(len(inside) / max(hi - lo, 1e-9), 1),
                           "p50_ms": round(percentile(inside, 0.5) * 1000, 2) if inside else None,
                           "p99_ms": round(percentile(inside, 0.99) * 1000, 2) if inside else None,
                           "max_ms": round(inside[-1] * 1000, 2) if inside else None, "statuses": statuses}
    lags = sorted(lag for r in recorders for due, lag in r.lags if lo <= due < hi)
    failures: Dict[str, int] = {}
    for r in recorders:
        for kind, count in r.failures.items():
            failures[kind] = failures.get(kind, 0) + count
    return {"endpoints": endpoints, "requests_per_second": round(total / max(hi - lo, 1e-9), 1),
            "schedule_lag_ms": {"p50": round(percentile(lags, 0.5) * 1000, 2) if lags else None,
                                "p99": round(percentile(lags, 0.99) * 1000, 2) if lags else None},
            "connection_failures": failures}


def run(args: argparse.Namespace) -> Dict[str, Any]:
    interval = args.interval_seconds / args.speedup
    work = Path(tempfile.mkdtemp(prefix="gg-load-"))
    pg = PostgresServer()
    hubs: List[HubProcess] = []
    stop = threading.Event()
    clients: List[Client] = []
    result: Dict[str, Any] = {"hosts": args.hosts, "hub_processes": args.hub_processes, "speedup": args.speedup,
                              "extra_fraction": args.extra_fraction,
                              "interval_seconds": args.interval_seconds, "cohorts": args.cohorts,
                              "canaries": args.canaries, "cpu_count": os.cpu_count()}
    try:
        pg.start()
        url = pg.create_database("load")
        made = time.monotonic()
        tokens = write_tokens(work / "tokens.json", args.hosts)
        admin_file = work / "admin.token"
        admin = add_token(str(work / "tokens.json"), "admin", "operator")
        admin_file.write_text(admin + "\n")
        admin_file.chmod(0o600)
        result["tokens_seconds"] = round(time.monotonic() - made, 2)
        keys = work / "keys"
        keys.mkdir()
        shutil.copy(Path(keys_dir()) / "release.gpg", keys / "release.gpg")
        for serial in (1, 2):
            (work / f"policy-{serial}.json").write_bytes(bundle_bytes(serial))
            (work / f"policy-{serial}.json.sig").write_bytes(signature_of(bundle_bytes(serial)))
        for index in range(args.hub_processes):
            config = write_config(work / f"hub-{index}.toml", listen_host="127.0.0.1", listen_port=0,
                                  database_url=url, tokens_file=work / "tokens.json", policy_keys_dir=keys,
                                  max_pending_batches=100_000, rollout_tick_seconds=args.rollout_tick_seconds,
                                  shutdown_timeout_seconds=5)
            hub = HubProcess(config)
            hubs.append(hub)
            hub.start()
        ports = [hub.port or 0 for hub in hubs]
        cli(["hub", "policy", "push", str(work / "policy-1.json")], hubs[0].url, admin_file)

        fleet = Fleet(args.hosts, args.cohorts, tokens)
        started = time.monotonic()
        end = started + args.seconds
        for index in range(args.clients):
            clients.append(Client(fleet, ports[index % len(ports)], list(range(index, args.hosts, args.clients)),
                                  interval, started, stop, index, args.extra_fraction))
        for client in clients:
            client.start()
        warm = wait_for(lambda: all(fleet.heard) and all(s == 1 for s in fleet.serial), 3 * interval + 60)
        result["warm_up_seconds"] = round(time.monotonic() - started, 1)
        result["warm_up_complete"] = warm

        hub_pids = [hub.process.pid for hub in hubs if hub.process is not None]
        pg_pids = [pg.process.pid] if pg.process is not None else []
        window_start = time.monotonic()
        hub_cpu0, pg_cpu0, bench_cpu0 = cpu(hub_pids), cpu(pg_pids), time.process_time()

        fleet.target = 2
        cli(["hub", "policy", "push", str(work / "policy-2.json"), "--staged"], hubs[0].url, admin_file)
        started_rollout = cli(["hub", "rollout", "start", "2", "--canaries", str(args.canaries), "--batches",
                               "5,25,100", "--soak-seconds", "0"], hubs[-1].url, admin_file)
        rollout_id = started_rollout["rollout"]["rollout_id"]
        canaries = [int(h["host_id"].split("-")[1]) for h in started_rollout["hosts"] if h.get("stage") == 0]
        result["rollout"] = {"id": rollout_id, "members": len(started_rollout["hosts"]), "canaries": len(canaries)}
        poller = Connection(ports[0])
        poll_recorder = Recorder()
        widened_by = 3 * interval + 3 * args.rollout_tick_seconds + 30
        last: Dict[str, Any] = {}

        def widened_or_ended() -> bool:
            last.update(rollout_row(poller, admin, rollout_id, poll_recorder))
            return last.get("stage", -1) >= 1 or last.get("state") != "running"

        wait_for(widened_or_ended, widened_by, 0.5)
        result["rollout"]["widened_to_stage_1"] = last.get("stage", -1) >= 1
        result["rollout"]["widened_after_seconds"] = round(time.monotonic() - window_start, 1)
        if last.get("state") == "running":
            result["halt"] = measure_halt(fleet, ports, args.clients, poller, poll_recorder, admin, rollout_id,
                                          interval)
        else:  # a background failure (--extra-fraction's health_regression) halted it first: nothing to time
            result["halt"] = {"halted": False, "within_goal": False, "state_before_the_failing_reports":
                              last.get("state"), "reason": str(last.get("reason", ""))[:300]}

        while time.monotonic() < end and not stop.is_set():
            time.sleep(min(1.0, max(0.0, end - time.monotonic())))
        window_end = time.monotonic()
        hub_cpu, pg_cpu = cpu(hub_pids) - hub_cpu0, cpu(pg_pids) - pg_cpu0
        bench_cpu = time.process_time() - bench_cpu0
        stop.set()
        for client in clients:
            client.join(60)
        poller.close()
        seconds = window_end - window_start
        hub_cores = hub_cpu / seconds
        summary = summarize([c.recorder for c in clients] + [poll_recorder],
                            (window_start, window_end))
        real_hosts_k = args.hosts * args.speedup / 1000  # hosts at the real intervals that this load stands for
        result.update(summary)
        result.update(
            window_seconds=round(seconds, 1),
            hub_cpu_cores=round(hub_cores, 3),
            hub_cpu_percent_of_a_core_per_1000_hosts=round(hub_cores / real_hosts_k * 100, 2),
            postgresql_cpu_cores=round(pg_cpu / seconds, 3),
            postgresql_cpu_percent_of_a_core_per_1000_hosts=round(pg_cpu / seconds / real_hosts_k * 100, 2),
            load_generator_cpu_cores=round(bench_cpu / seconds, 3),
            per_host_requests_per_minute_real=round(summary["requests_per_second"] / args.speedup / args.hosts * 60,
                                                    2),
            reconnects=sum(c.reconnects for c in clients), hub_pids=len(hub_pids),
            postgresql_processes=len(with_children(pg_pids[0])) if pg_pids else 0,
            load_average_at_end=[round(x, 2) for x in os.getloadavg()], rollout_ticks=rollout_ticks(hubs))
        return result
    finally:
        stop.set()
        for client in clients:
            client.join(10)
        for hub in hubs:
            hub.stop()
        pg.stop()
        shutil.rmtree(work, ignore_errors=True)


def text(result: Dict[str, Any]) -> str:
    lines = [f"{result['hosts']} hosts x{result['speedup']:g} speedup, {result['hub_processes']} hub processes, "
             f"{result['cpu_count']} CPUs, load average at end {result['load_average_at_end']}",
             f"tokens written in {result['tokens_seconds']} s; warm-up {result['warm_up_seconds']} s "
             f"(complete: {result['warm_up_complete']})",
             f"rollout {result['rollout']['id']}: {result['rollout']['members']} members, "
             f"{result['rollout']['canaries']} canaries, stage 1 opened: {result['rollout']['widened_to_stage_1']} "
             f"({result['rollout']['widened_after_seconds']} s after start)",
             f"halt: {json.dumps(result['halt'])}",
             f"window {result['window_seconds']} s: {result['requests_per_second']} requests/s "
             f"({result['per_host_requests_per_minute_real']} per host per minute at the real intervals)",
             f"hub CPU {result['hub_cpu_cores']} cores = {result['hub_cpu_percent_of_a_core_per_1000_hosts']} % of a "
             f"core per 1,000 hosts; PostgreSQL {result['postgresql_cpu_cores']} cores = "
             f"{result['postgresql_cpu_percent_of_a_core_per_1000_hosts']} % per 1,000 hosts; load generator "
             f"{result['load_generator_cpu_cores']} cores",
             f"schedule lag p50/p99 ms: {result['schedule_lag_ms']}; reconnects {result['reconnects']}, "
             f"connection failures {result['connection_failures']}",
             f"rollout ticks longer than their interval / skipped: {result['rollout_ticks']}"]
    for name, figures in result["endpoints"].items():
        lines.append(f"  {name}: {figures['requests']} requests ({figures['per_second']}/s), p50 {figures['p50_ms']} "
                     f"ms, p99 {figures['p99_ms']} ms, max {figures['max_ms']} ms, statuses {figures['statuses']}")
    return "\n".join(lines)


def _stop_on_sigterm(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hosts", type=int, default=10_000)
    parser.add_argument("--hub-processes", type=int, default=2, help="gpuguard hub serve processes, one port each")
    parser.add_argument("--seconds", type=float, default=300.0, help="how long the load runs (at least through the "
                        "warm-up, the rollout's first widening and the halt)")
    parser.add_argument("--speedup", type=float, default=1.0, help="divide the agents' intervals by this")
    parser.add_argument("--interval-seconds", type=float, default=60.0,
                        help="the agents' heartbeat and policy-fetch interval (report.heartbeat_interval_seconds)")
    parser.add_argument("--clients", type=int, default=32, help="load-generator threads (keep-alive connections)")
    parser.add_argument("--extra-fraction", type=float, default=0.002,
                        help="share of heartbeats delivered with one snapshot_changed, policy_violation or "
                        "health_regression event before them (bench_fleet's: about 3 a host a day; a "
                        "health_regression is a background failure the rollout's judge sees)")
    parser.add_argument("--cohorts", type=int, default=8, help="GPU models: the rollout's cohorts")
    parser.add_argument("--canaries", type=int, default=25,
                        help="canaries per cohort (20 or more: each cohort judged against its control)")
    parser.add_argument("--rollout-tick-seconds", type=float, default=10.0, help="the hubs' rollout_tick_seconds")
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    args = parser.parse_args(argv)
    if args.hosts < args.cohorts or args.hub_processes < 1 or args.speedup <= 0 or args.clients < 1:
        parser.error("need --hosts >= --cohorts, --hub-processes >= 1, --speedup > 0, --clients >= 1")
    configure(level="warning")  # add_token's log line would mix with the figures
    signal.signal(signal.SIGTERM, _stop_on_sigterm)  # run()'s cleanup stops what it started, by PID
    result = run(args)
    print(json.dumps(result, indent=2) if args.json else text(result), flush=True)
    return 0 if result["halt"]["halted"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
