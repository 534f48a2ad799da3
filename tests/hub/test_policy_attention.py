"""Policy attention at the hub (issue 42): the heartbeat the agent makes for an expired bundle, posted to the real
app over SQLite and PostgreSQL, shows as attention in the host API, /metrics, the dashboard, and raises one alert."""

from __future__ import annotations

import datetime as dt
from dataclasses import replace
from pathlib import Path
from typing import Any, Dict, Iterator, List, Tuple

import pytest
from fastapi.testclient import TestClient

from agent.bundle.state import BundleState, write_bundle_state
from agent.config import Settings
from agent.daemon_jobs.heartbeat import HeartbeatJob
from agent.host import Host
from agent.hub.alert_settings import AlertWebhook
from agent.hub.alerts import AlertQueue, attention_alerts
from agent.hub.app import create_app
from agent.hub.settings import HubSettings
from agent.hub.store import make_store
from agent.report.events import Event, Heartbeat
from tests.daemon.test_jobs import make_runtime
from tests.hub.conftest import bearer
from tests.hub.factories import T0, batch_json, event

NOW = dt.datetime(2026, 12, 6, 12, tzinfo=dt.timezone.utc)
DAY = dt.timedelta(days=1)
HOOK = AlertWebhook(name="ops", url="http://127.0.0.1:9/")  # nothing listens: deliveries stay queued


def agent_heartbeat(tmp_path: Path, host_id: str, state: BundleState, at: dt.datetime = NOW) -> Event:
    """The heartbeat the agent's own heartbeat job makes for a host whose policy-bundle state is ``state``."""
    settings = Settings.model_validate({"agent": {"state_dir": str(tmp_path / host_id / "state"), "host_id": host_id},
                                        "guard": {"policy_source": "bundle"}})
    rt = make_runtime(tmp_path / host_id, Host(root=Path("/"), clock=lambda: at), settings)
    write_bundle_state(str(tmp_path / host_id / "state/policy-bundle/state.json"), state)
    HeartbeatJob(rt).run()
    beat: Event = rt.outbox.pending(10)[-1]
    return beat


@pytest.fixture(params=["sqlite", "postgresql"])
def hub(request: pytest.FixtureRequest, settings: HubSettings) -> Iterator[Tuple[TestClient, str]]:
    """The real app with one alert webhook, over SQLite in tmp_path or a fresh PostgreSQL database."""
    url = settings.database_url if request.param == "sqlite" else request.getfixturevalue("postgres_url")
    hooked = settings.model_copy(update={"database_url": url, "alert_webhooks": [HOOK]})
    with TestClient(create_app(hooked, make_store(url), clock=lambda: NOW)) as client:
        yield client, url


def attention_deliveries(url: str) -> List[Dict[str, Any]]:
    store = make_store(url)
    store.open()
    try:
        queue = AlertQueue(store, [HOOK])
        queue.open()
        return [r for r in queue.rows() if r["kind"] == "policy_attention"]
    finally:
        store.close()


def post(client: TestClient, token: str, beat: Event) -> None:
    assert client.post("/v1/events", content=batch_json([beat]), headers=bearer(token)).status_code == 200


def test_an_expired_bundle_shows_as_attention_on_the_host_and_the_dashboard(
        hub: Tuple[TestClient, str], tokens: Dict[str, str], tmp_path: Path) -> None:
    """host-a's agent, its bundle past expires, reports "expired": the host API, /v1/policy/hosts, /metrics (one
    series per word), the overview, /ui/policy and the host page show it, host-b (fresh) shows none, and one
    policy_attention alert is queued however often the host repeats it."""
    client, url = hub
    expired = agent_heartbeat(tmp_path, "host-a", BundleState(serial=4, source="hub", expires=NOW - DAY,
                                                              freshness_expires=NOW + DAY, freshness_newest=4))
    fresh = agent_heartbeat(tmp_path, "host-b", BundleState(serial=4, source="hub", expires=NOW + DAY,
                                                            freshness_expires=NOW + DAY, freshness_newest=4))
    assert expired.payload.policy_attention == ("expired",) and fresh.payload.policy_attention is None
    post(client, tokens["host-a"], expired)
    post(client, tokens["host-b"], fresh)
    reader = bearer(tokens["ops"])

    hosts = {h["host_id"]: h for h in client.get("/v1/hosts", headers=reader).json()["hosts"]}
    assert (hosts["host-a"]["policy_attention"], hosts["host-b"]["policy_attention"]) == (["expired"], None)
    rollout = client.get("/v1/policy/hosts", headers=reader).json()
    by_host = {h["host_id"]: h for h in rollout["hosts"]}
    assert (by_host["host-a"]["attention"], by_host["host-b"]["attention"]) == (["expired"], [])
    assert rollout["attention_by_word"] == {"expired": 1, "freshness": 0, "denied": 0}
    lines = client.get("/metrics", headers=reader).text.splitlines()
    for line in ('gpuguard_hub_hosts_policy_attention{word="expired"} 1.0',
                 'gpuguard_hub_hosts_policy_attention{word="freshness"} 0.0'):
        assert line in lines, line

    overview = client.get("/ui/", headers=reader).text
    assert 'id="policy-attention-expired-count">1<' in overview
    table = overview.split('id="policy-attention"')[1].split("</table>")[0]
    assert 'class="attention" data-host-id="host-a" data-words="expired"' in table and "host-b" not in table
    assert 'class="attention" data-host-id="host-a"' in client.get("/ui/policy", headers=reader).text
    host_page = client.get("/ui/hosts/host-a", headers=reader).text
    assert 'id="policy-attention"' in host_page and 'data-word="expired"' in host_page
    assert 'id="policy-attention"' not in client.get("/ui/hosts/host-b", headers=reader).text

    [alert] = attention_deliveries(url)
    assert (alert["event_id"], alert["severity"], alert["state"]) == ("policy-attention-host-a-expired-4", "warning",
                                                                      "pending")
    again = agent_heartbeat(tmp_path, "host-a", BundleState(serial=4, source="hub", expires=NOW - DAY,
                                                            freshness_expires=NOW + DAY, freshness_newest=4),
                            at=NOW + dt.timedelta(minutes=5))
    post(client, tokens["host-a"], again)
    assert len(attention_deliveries(url)) == 1


def test_a_host_starting_to_report_freshness_raises_its_own_alert(hub: Tuple[TestClient, str],
                                                                  tokens: Dict[str, str]) -> None:
    """A host that reported nothing, then "freshness" (a freeze), gets one alert naming the word and its serial; the
    dashboard counts it under freshness."""
    client, url = hub
    quiet = event("host-c", at=T0).model_copy(update={"payload": Heartbeat(
        agent_version="1", uptime_seconds=1.0, policy_source="bundle", policy_serial=7)})
    frozen = event("host-c", at=T0 + dt.timedelta(minutes=1)).model_copy(update={"payload": Heartbeat(
        agent_version="1", uptime_seconds=1.0, policy_source="bundle", policy_serial=7,
        policy_attention=("freshness",))})
    post(client, tokens["host-c"], quiet)
    assert attention_deliveries(url) == []
    post(client, tokens["host-c"], frozen)
    assert [r["event_id"] for r in attention_deliveries(url)] == ["policy-attention-host-c-freshness-7"]
    overview = client.get("/ui/", headers=bearer(tokens["ops"])).text
    assert 'id="policy-attention-freshness-count">1<' in overview


def test_a_host_on_a_known_bad_version_is_counted_and_raises_an_alert(
        hub: Tuple[TestClient, str], tokens: Dict[str, str], tmp_path: Path) -> None:
    """host-c's agent found a package at a version the deny list in force denies (issue 43): its heartbeat says
    "denied", the hub counts it (policy hosts, /metrics, dashboard) and queues one alert saying what it means."""
    client, url = hub
    beat = agent_heartbeat(tmp_path, "host-c", BundleState(
        serial=4, source="hub", deny_serial=2, denied_installed=("amdgpu-dkms 1:6.8.5-1: denied.amdgpu-recall",)))
    assert beat.payload.policy_attention == ("denied",)
    post(client, tokens["host-c"], beat)
    reader = bearer(tokens["ops"])
    assert client.get("/v1/policy/hosts", headers=reader).json()["attention_by_word"]["denied"] == 1
    assert 'gpuguard_hub_hosts_policy_attention{word="denied"} 1.0' in client.get("/metrics", headers=reader).text
    assert 'id="policy-attention-denied-count">1<' in client.get("/ui/", headers=reader).text
    [alert] = attention_deliveries(url)
    assert alert["event_id"] == "policy-attention-host-c-denied-4"


def test_attention_alerts_take_each_hosts_newest_heartbeat_only() -> None:
    """Within one batch, a host's older heartbeat with "expired" and its newer one without raise nothing; the
    summary names host, word, serial and what the word means."""
    def beat(minutes: int, words: Tuple[str, ...]) -> Event:
        return event("host-a", at=T0 + dt.timedelta(minutes=minutes)).model_copy(update={"payload": Heartbeat(
            agent_version="1", uptime_seconds=1.0, policy_serial=3, policy_attention=words or None)})

    assert attention_alerts([beat(1, ("expired",)), beat(2, ())]) == []
    [(key, alert)] = attention_alerts([beat(2, ()), beat(3, ("expired",))])
    assert key == "policy-attention-host-a-expired-3"
    assert alert["kind"] == "policy_attention" and "serial 3" in alert["summary"] and "past its expiry" in \
        alert["summary"]


def test_a_host_below_the_deny_serial_the_hub_names_is_counted_as_freshness(
        hub: Tuple[TestClient, str], tokens: Dict[str, str], tmp_path: Path) -> None:
    """host-c's freshness statement names deny list serial 3 while serial 2 is in force there (a newer known-bad
    list held back or refused, issue 43): its heartbeat says "freshness" and the hub counts it; at serial 3 it is
    counted no more."""
    client, url = hub
    behind = BundleState(serial=4, source="hub", freshness_issued_at=NOW - DAY, freshness_expires=NOW + DAY,
                         freshness_newest=4, deny_serial=2, freshness_deny_serial=3)
    beat = agent_heartbeat(tmp_path, "host-c", behind)
    assert beat.payload.policy_attention == ("freshness",)
    post(client, tokens["host-c"], beat)
    reader = bearer(tokens["ops"])
    assert client.get("/v1/policy/hosts", headers=reader).json()["attention_by_word"]["freshness"] == 1
    caught_up = agent_heartbeat(tmp_path, "host-c", replace(behind, deny_serial=3), at=NOW + dt.timedelta(minutes=1))
    assert caught_up.payload.policy_attention is None
    post(client, tokens["host-c"], caught_up)
    assert client.get("/v1/policy/hosts", headers=reader).json()["attention_by_word"]["freshness"] == 0
