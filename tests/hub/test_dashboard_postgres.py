"""The dashboard's, /metrics' and the alert queue's SQL on a real PostgreSQL (json fields through jsonb, LIKE
with ESCAPE, grouped counts with a parameter, the queue's lease), with the same answers as on SQLite."""

from __future__ import annotations

import datetime as dt
import re
from typing import Dict

from fastapi.testclient import TestClient

from agent.hub.alert_settings import AlertWebhook
from agent.hub.alerts import AlertQueue
from agent.hub.app import create_app
from agent.hub.settings import HubSettings
from agent.hub.store import make_store
from tests.hub.conftest import READER, bearer
from tests.hub.factories import event
from tests.hub.fleet_seed import EXPECTED, NOW, REGRESSED_HEALTH, seed


def test_pages_and_metrics_over_postgresql(settings: HubSettings, tokens: Dict[str, str], postgres_url: str) -> None:
    """Counts, filters, the host page and /metrics agree with the SQLite answers."""
    seed(postgres_url)
    pg = settings.model_copy(update={"database_url": postgres_url})
    with TestClient(create_app(pg, make_store(postgres_url), clock=lambda: NOW)) as client:
        auth = bearer(tokens[READER])
        overview = client.get("/ui/", headers=auth).text
        counts = {k: int(re.search(rf'id="count-{k.replace("host_count", "hosts")}">(\d+)<', overview).group(1))
                  for k in EXPECTED}
        assert counts == EXPECTED
        for query, hosts in (("q=REGRESSED", ["gpu-regressed-01"]), ("q=100%25", []), ("rocm=6.3.1", ["gpu-bad-01"]),
                             ("driver=550.90.07&cuda=12.4", ["gpu-regressed-01"]), ("stale=yes", ["gpu-stale-01"]),
                             ("compliance=unknown", ["gpu-new-01", "gpu-odd-01"])):
            html = client.get(f"/ui/?{query}", headers=auth).text
            assert re.findall(r'<tr class="host" data-host-id="([^"]*)"', html) == hosts, query
        host = client.get("/ui/hosts/gpu-regressed-01", headers=auth).text
        assert host.count('<circle class="point"') == len(REGRESSED_HEALTH)
        assert len(re.findall(r'<li class="drift-entry', host)) == 3
        assert len(re.findall(r'<tr class="pairing">', client.get("/ui/pairings", headers=auth).text)) == 4
        metrics = client.get("/metrics", headers=auth).text
        assert 'gpuguard_hub_hosts{compliance="violating"} 1.0' in metrics
        assert 'gpuguard_hub_events_last_hour{kind="cpu_fallback",severity="critical"} 2.0' in metrics
        # the join of each host's newest heartbeat runs on PostgreSQL too (the seeded fleet reports no coverage)
        assert f'gpuguard_hub_hosts_by_rollback_coverage{{coverage="unknown"}} {EXPECTED["host_count"]}.0' in metrics


def test_the_alert_queue_over_postgresql(postgres_url: str) -> None:
    """Enqueue is idempotent, a leased row is not claimed twice, and settle records retries and dead letters."""
    store = make_store(postgres_url)
    store.open()
    queue = AlertQueue(store, [AlertWebhook(name="ops", url="http://127.0.0.1:9/")])
    queue.open()
    queue.open()  # a second hub process starting: nothing to create, nothing fails
    violation = event("h1", "policy_violation").model_copy(update={"severity": "critical"})
    now = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
    assert queue.enqueue([violation, event("h1", "heartbeat")], now) == 1
    queue.enqueue([violation], now)
    claimed = queue.claim(now, lease_seconds=60)
    assert [c.event_id for c in claimed] == [violation.event_id] and queue.claim(now, lease_seconds=60) == []
    assert queue.settle(claimed[0], now, "HTTP 500", max_attempts=2, retry_in_seconds=5) == "pending"
    assert queue.claim(now + dt.timedelta(seconds=4), lease_seconds=60) == []
    again = queue.claim(now + dt.timedelta(seconds=5), lease_seconds=60)
    assert again[0].attempts == 1
    assert queue.settle(again[0], now, "HTTP 500", max_attempts=2, retry_in_seconds=5) == "dead"
    assert queue.counts() == {("ops", "dead"): 1}
    assert [(r["state"], r["attempts"], r["last_error"]) for r in queue.rows()] == [("dead", 2, "HTTP 500")]
    store.close()
