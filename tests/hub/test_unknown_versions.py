"""Versions unknown to gpuguard's tables at the hub (issue 42): the heartbeat the agent makes after a snapshot of a
TheRock 10.2 host, posted to the real app over SQLite and PostgreSQL, is stored per host and counted per table in
the host API, /metrics and the dashboard; a malformed field is refused naming it; an older agent's heartbeat without
it is still taken."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any, Dict, Iterator

import pytest
from fastapi.testclient import TestClient

from agent.config import Settings
from agent.daemon_jobs.heartbeat import HeartbeatJob
from agent.daemon_jobs.runtime import SnapshotFacts
from agent.host import Host
from agent.hub.app import create_app
from agent.hub.settings import HubSettings
from agent.hub.store import make_store
from agent.report.events import Event
from agent.snapshot.take import take_snapshot
from agent.wire import MAX_HEARTBEAT_UNKNOWN_VERSIONS, MAX_UNKNOWN_VERSION_CHARS
from tests.daemon.test_jobs import make_runtime
from tests.hub.conftest import bearer
from tests.hub.factories import T0, batch_dict, batch_json, event
from tests.snapshot.test_unknown_to_table import _host

NOW = dt.datetime(2026, 12, 6, 12, tzinfo=dt.timezone.utc)


def agent_heartbeat(tmp_path: Path, host_id: str, facts: SnapshotFacts) -> Event:
    """The heartbeat the agent's own heartbeat job makes after a snapshot whose facts are ``facts``."""
    settings = Settings.model_validate({"agent": {"state_dir": str(tmp_path / host_id / "state"),
                                                  "host_id": host_id}})
    rt = make_runtime(tmp_path / host_id, Host(root=Path("/"), clock=lambda: NOW), settings)
    rt.state.snapshot_facts = facts
    HeartbeatJob(rt).run()
    beat: Event = rt.outbox.pending(10)[-1]
    return beat


@pytest.fixture(params=["sqlite", "postgresql"])
def client(request: pytest.FixtureRequest, settings: HubSettings) -> Iterator[TestClient]:
    """The real app over SQLite in tmp_path or a fresh PostgreSQL database."""
    url = settings.database_url if request.param == "sqlite" else request.getfixturevalue("postgres_url")
    with TestClient(create_app(settings.model_copy(update={"database_url": url}), make_store(url),
                               clock=lambda: NOW)) as app_client:
        yield app_client


def post(client: TestClient, token: str, body: bytes) -> Any:
    return client.post("/v1/events", content=body, headers=bearer(token))


def test_a_therock_10_2_host_is_counted_as_running_versions_unknown_to_two_tables(
        client: TestClient, tokens: Dict[str, str], tmp_path: Path) -> None:
    """host-a's snapshot has a TheRock 10.2 tree: its heartbeat carries two typed items, the hub stores them, the
    host API, /metrics and the overview count one host unknown to AMD's matrix and to the TheRock table and none to
    the dcgm-exporter table, and its host page lists them; host-b (ROCm 10.0) and an older agent's heartbeat (no
    field) count nowhere."""
    from agent.policy.matrix import load_matrix

    snap = take_snapshot(_host(tmp_path / "a", {"10.2": "10.2.0~20261201"}, {}), matrix=load_matrix().to_compiled())
    beat_a = agent_heartbeat(tmp_path, "host-a", SnapshotFacts.of(snap))
    beat_b = agent_heartbeat(tmp_path, "host-b", SnapshotFacts.of(take_snapshot(_host(tmp_path / "b", {}, {}))))
    assert beat_b.payload.unknown_versions is None
    old_agent = event("host-c", at=T0)
    assert batch_dict([old_agent])["events"][0]["payload"].get("unknown_versions") is None
    for host_id, beat in (("host-a", beat_a), ("host-b", beat_b), ("host-c", old_agent)):
        assert post(client, tokens[host_id], batch_json([beat])).status_code == 200
    reader = bearer(tokens["ops"])

    answer = client.get("/v1/hosts", headers=reader).json()
    assert answer["hosts_unknown_by_table"] == {"amd-matrix": 1, "therock": 1, "dcgm-exporter": 0}
    hosts = {h["host_id"]: h for h in answer["hosts"]}
    carried = hosts["host-a"]["unknown_versions"]
    assert sorted((u["table"], u["component"], u["version"], u["newest"]) for u in carried) == [
        ("amd-matrix", "rocm", "10.2", "10.0"), ("therock", "therock", "10.2", "10.1")]
    assert hosts["host-b"]["unknown_versions"] is None and hosts["host-c"]["unknown_versions"] is None
    lines = client.get("/metrics", headers=reader).text.splitlines()
    for line in ('gpuguard_hub_hosts_unknown_versions{table="amd-matrix"} 1.0',
                 'gpuguard_hub_hosts_unknown_versions{table="therock"} 1.0',
                 'gpuguard_hub_hosts_unknown_versions{table="dcgm-exporter"} 0.0'):
        assert line in lines, line
    overview = client.get("/ui/", headers=reader).text
    assert 'id="unknown-amd-matrix-count">1<' in overview and 'id="unknown-therock-count">1<' in overview
    assert 'id="unknown-dcgm-exporter-count">0<' in overview
    host_page = client.get("/ui/hosts/host-a", headers=reader).text
    assert 'data-table="therock">therock 10.2: newer than the TheRock release table dated 2026-12-06' in host_page
    assert 'id="unknown-versions"' not in client.get("/ui/hosts/host-b", headers=reader).text


def _item(**changes: object) -> Dict[str, object]:
    return {"table": "therock", "component": "therock", "version": "10.2", "newest": "10.1", "dated": "2026-12-06",
            **changes}


@pytest.mark.parametrize("items, detail", [
    ([_item(table="nvidia-matrix")], "unknown_versions"),
    ([_item(component="kernel")], "unknown_versions"),
    ([_item(version="1" * (MAX_UNKNOWN_VERSION_CHARS + 1))], "unknown_versions"),
    ([_item(version="")], "unknown_versions"),
    ([_item(extra=1)], "unknown_versions"),
    ([_item()] * (MAX_HEARTBEAT_UNKNOWN_VERSIONS + 1), "unknown_versions"),
    ("therock", "unknown_versions"),
])
def test_a_malformed_unknown_versions_field_is_refused_422_naming_it(
        client: TestClient, tokens: Dict[str, str], items: object, detail: str) -> None:
    """An unknown table or component, a version too long or empty, an unknown key, too many items or not a list:
    refused 422 schema_invalid with a one-line detail naming unknown_versions, and nothing stored for the host."""
    valid = batch_dict([event("host-a", at=T0)])["events"][0]
    body = json.dumps({"events": [{**valid, "payload": {**valid["payload"], "unknown_versions": items}}]}).encode()
    response = post(client, tokens["host-a"], body)
    assert response.status_code == 422, response.text
    refused = response.json()
    assert refused["error"] == "schema_invalid" and detail in refused["detail"] and "\n" not in refused["detail"]
    assert client.get("/v1/hosts", headers=bearer(tokens["ops"])).json()["host_count"] == 0


def test_the_count_takes_each_hosts_newest_heartbeat(client: TestClient, tokens: Dict[str, str]) -> None:
    """A host that reported TheRock 10.2 and then (newer heartbeat) nothing unknown counts nowhere; one that
    reports two TheRock versions counts once for the table."""
    valid = batch_dict([event("host-a", at=T0)])["events"][0]

    def beat(host_id: str, minutes: int, items: Any) -> bytes:
        at = (T0 + dt.timedelta(minutes=minutes)).isoformat()
        return json.dumps({"events": [{**valid, "host_id": host_id, "event_id": f"{host_id}-{minutes:08d}",
                                       "occurred_at": at, "payload": {**valid["payload"],
                                                                      "unknown_versions": items}}]}).encode()

    assert post(client, tokens["host-a"], beat("host-a", 1, [_item()])).status_code == 200
    assert post(client, tokens["host-a"], beat("host-a", 2, None)).status_code == 200
    assert post(client, tokens["host-b"], beat("host-b", 1, [_item(), _item(version="10.3")])).status_code == 200
    answer = client.get("/v1/hosts", headers=bearer(tokens["ops"])).json()
    assert answer["hosts_unknown_by_table"] == {"amd-matrix": 0, "therock": 1, "dcgm-exporter": 0}
