"""How long the dashboard's pages and /metrics take over a large fleet (SQLite).

Goal: every page and a /metrics scrape answer in well under a second for 10,000 hosts, because host lists are
paginated in SQL and counts are grouped queries.

    .venv/bin/python bench/bench_hub_dashboard.py --hosts 10000 --heartbeats-per-host 24

Seeds a temporary SQLite database through the hub's own store (heartbeats every 5 minutes, 1 host in 50 violating,
1 in 100 with drift events), then times each request through the real app in-process (TestClient: routing, auth,
queries, rendering; no network), median and max of ``--repeat`` runs.
"""

from __future__ import annotations

import argparse
import datetime as dt
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agent.hub.app import create_app  # noqa: E402
from agent.hub.settings import HubSettings  # noqa: E402
from agent.hub.store import make_store  # noqa: E402
from agent.hub.tokens import add_token  # noqa: E402
from agent.report.events import Event  # noqa: E402
from tests.hub.factories import CUDA_12, ROCM_62, ROCM_63, event  # noqa: E402


def seed(url: str, hosts: int, heartbeats: int, now: dt.datetime) -> int:
    store = make_store(url)
    store.open()
    stored = 0
    batch: List[List[Event]] = []
    for n in range(hosts):
        host_id = f"gpu-{n:05d}"
        pairing = ROCM_63 if n % 50 == 0 else (CUDA_12 if n % 3 == 0 else ROCM_62)
        events = [event(host_id, "heartbeat", at=now - dt.timedelta(minutes=5 * i), pairing=pairing,
                        compliant=n % 50 != 0) for i in range(heartbeats)]
        if n % 100 == 0:
            events += [event(host_id, kind, at=now - dt.timedelta(minutes=30)).model_copy(
                update={"severity": "critical"}) for kind in ("policy_violation", "cpu_fallback")]
        batch.append(events)
        if len(batch) == 100:
            store.ingest(batch, received_at=now)
            stored += sum(len(b) for b in batch)
            batch = []
    if batch:
        store.ingest(batch, received_at=now)
        stored += sum(len(b) for b in batch)
    store.close()
    return stored


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hosts", type=int, default=10_000)
    parser.add_argument("--heartbeats-per-host", type=int, default=24)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    from fastapi.testclient import TestClient

    now = dt.datetime.now(dt.timezone.utc)
    with tempfile.TemporaryDirectory(prefix="bench-dashboard-") as tmp:
        url = f"sqlite:///{tmp}/hub.db"
        started = time.monotonic()
        stored = seed(url, args.hosts, args.heartbeats_per_host, now)
        size_mb = Path(f"{tmp}/hub.db").stat().st_size / 1e6
        print(f"seeded {args.hosts} hosts, {stored} events ({size_mb:.0f} MB) in {time.monotonic() - started:.0f} s")
        tokens = f"{tmp}/tokens.json"
        reader = add_token(tokens, "reader", "bench")
        settings = HubSettings(database_url=url, tokens_file=tokens)
        paths = ["/metrics", "/ui/", "/ui/?page=150", "/ui/?q=gpu-0999", "/ui/?compliance=violating",
                 "/ui/?rocm=6.3.1", "/ui/pairings", "/ui/hosts/gpu-00100"]
        results: Dict[str, List[float]] = {}
        with TestClient(create_app(settings, make_store(url))) as client:
            for path in paths:
                for _ in range(args.repeat):
                    t0 = time.perf_counter()
                    answer = client.get(path, headers={"Authorization": f"Bearer {reader}"})
                    results.setdefault(path, []).append(time.perf_counter() - t0)
                    assert answer.status_code == 200, (path, answer.status_code)
        print(f"{'request':32} {'median ms':>10} {'max ms':>10}")
        for path, times in results.items():
            print(f"{path:32} {statistics.median(times) * 1000:10.1f} {max(times) * 1000:10.1f}")


if __name__ == "__main__":
    main()
