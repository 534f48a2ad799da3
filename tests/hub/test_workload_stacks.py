"""The verified-stack matrix (issue 44): heartbeats' workload verdicts kept per workload, stack and host, on SQLite
and a real PostgreSQL, shown by GET /v1/workloads/stacks, /ui/workloads and /metrics, and refused when malformed."""

from __future__ import annotations

import datetime as dt
import re
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional

import pytest
import requests
from fastapi.testclient import TestClient

from agent.hub.app import create_app
from agent.hub.settings import HubSettings
from agent.hub.store import PostgresStore, SQLiteStore, SqlStore, make_store
from agent.hub.workload_stacks import matrix
from agent.report.events import Event, Heartbeat, WorkloadReport, WorkloadStackReport
from tests.hub.conftest import HOSTS, READER, bearer
from tests.hub.factories import T0, batch_dict, batch_json
from tests.hub.process import HubProcess, write_config

NOW = dt.datetime(2026, 2, 1, tzinfo=dt.timezone.utc)
OLD = WorkloadStackReport(gpu_models="NVIDIA H200", driver="nvidia 570.86.15", gpu_stack="CUDA 12.8",
                          framework="torch 2.9.1 (CUDA 12.8)")
NEW = OLD.model_copy(update={"driver": "nvidia 580.159.04", "gpu_stack": "CUDA 13.0"})
OLD_ID, NEW_ID = "0123456789abcdef", "fedcba9876543210"
_numbers = iter(range(1, 1_000_000))


def beat(host: str, checked_minutes: Optional[int], *workloads: WorkloadReport, sent_minutes: int = 0) -> Event:
    """A heartbeat of ``host`` sent at T0 + sent_minutes carrying the verdicts of a check that finished at
    T0 + checked_minutes (None: the agent does not say)."""
    n = next(_numbers)
    checked = None if checked_minutes is None else T0 + dt.timedelta(minutes=checked_minutes)
    return Event(event_id=f"wl{n:012d}", host_id=host, hostname=f"{host}.lab", sequence=n,
                 occurred_at=T0 + dt.timedelta(minutes=max(sent_minutes, checked_minutes or 0)),
                 payload=Heartbeat(agent_version="0.1.0", uptime_seconds=1.0, last_health_status="pass",
                                   last_health_at=checked, workloads=list(workloads)))


def run(status: str, stack_id: str = OLD_ID, stack: WorkloadStackReport = OLD, name: str = "resnet-train",
        gates: bool = True) -> WorkloadReport:
    return WorkloadReport(name=name, status=status, gates=gates, stack_id=stack_id, stack=stack)


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SqlStore]:
    opened: SqlStore
    if request.param == "sqlite":
        opened = SQLiteStore(str(tmp_path / "hub.db"))
    else:
        opened = PostgresStore(request.getfixturevalue("postgres_url"))
    opened.open()
    yield opened
    opened.close()


def _cells(store: SqlStore) -> Dict[Any, Any]:
    return {(c.workload, c.stack_id): (c.hosts_passed, c.hosts_failed, c.passes, c.failures) for c in matrix(store)}


def test_each_check_counts_once_per_host_whatever_the_heartbeats_repeat(store: SqlStore) -> None:
    """Three heartbeats of one check count one pass; a newer check counts again; two hosts count two hosts; a
    failure on the new stack is kept apart from the old stack's passes."""
    store.ingest([[beat("host-a", 10, run("pass")), beat("host-a", 10, run("pass"), sent_minutes=15)],
                  [beat("host-a", 10, run("pass"), sent_minutes=20)]], received_at=NOW)
    store.ingest([[beat("host-a", 30, run("pass")), beat("host-b", 31, run("pass"))]], received_at=NOW)
    store.ingest([[beat("host-c", 40, run("cpu_fallback", NEW_ID, NEW))]], received_at=NOW)
    assert _cells(store) == {("resnet-train", OLD_ID): (2, 0, 3, 0), ("resnet-train", NEW_ID): (0, 1, 0, 1)}
    [old, new] = matrix(store)
    assert (old.verified, new.verified) == (True, False)
    assert old.stack == OLD and new.stack.driver == "nvidia 580.159.04"
    assert old.last_pass_at == T0 + dt.timedelta(minutes=31) and new.last_failure_at == T0 + dt.timedelta(minutes=40)


def test_a_late_older_check_and_an_unknown_check_time_count_nothing(store: SqlStore) -> None:
    """A heartbeat of an older check arriving after a newer one, and one without last_health_at, leave the counts
    and the last verdict as they were; busy counts neither way."""
    store.ingest([[beat("host-a", 30, run("pass"))]], received_at=NOW)
    store.ingest([[beat("host-a", 20, run("failed"), sent_minutes=40)]], received_at=NOW)
    store.ingest([[beat("host-a", None, run("failed"), sent_minutes=50)]], received_at=NOW)
    store.ingest([[beat("host-b", 35, run("busy"))]], received_at=NOW)
    assert _cells(store) == {("resnet-train", OLD_ID): (1, 0, 1, 0)}
    assert store.query("t", "SELECT last_status FROM workload_stacks WHERE host_id = ?", ["host-a"]) == [("pass",)]


def test_a_schema_version_5_database_gets_the_matrix_table(store: SqlStore) -> None:
    """A version 5 database (no workload_stacks) opens as the newest version with the table there, its rows kept."""
    from agent.hub import schema
    from tests.hub.test_store import _reopened_after

    store.ingest([[beat("host-a", 10)]], received_at=NOW)
    reopened = _reopened_after(store, ["DROP TABLE workload_stacks",
                                       "ALTER TABLE hosts DROP COLUMN policy_refused_kind",
                                       "ALTER TABLE hosts DROP COLUMN policy_attention",
                                       "ALTER TABLE hosts DROP COLUMN unknown_versions",
                                       "UPDATE hub_meta SET value = '5' WHERE key = 'schema_version'"])
    try:
        assert reopened.query("t", "SELECT value FROM hub_meta WHERE key = 'schema_version'") == [
            (str(schema.SCHEMA_VERSION),)]
        assert [h.host_id for h in reopened.hosts()] == ["host-a"]
        reopened.ingest([[beat("host-a", 20, run("pass"))]], received_at=NOW)
        assert _cells(reopened) == {("resnet-train", OLD_ID): (1, 0, 1, 0)}
    finally:
        reopened.close()


@pytest.fixture(params=["sqlite", "postgresql"])
def app_client(request: pytest.FixtureRequest, settings: HubSettings) -> Iterator[TestClient]:
    url = settings.database_url if request.param == "sqlite" else request.getfixturevalue("postgres_url")
    with TestClient(create_app(settings.model_copy(update={"database_url": url}), make_store(url),
                               clock=lambda: T0 + dt.timedelta(hours=1))) as client:
        yield client


def _post(client: TestClient, token: str, events: List[Event]) -> Any:
    return client.post("/v1/events", content=batch_json(events), headers=bearer(token))


def test_the_matrix_over_the_api_the_dashboard_and_metrics(app_client: TestClient, tokens: Dict[str, str]) -> None:
    """Heartbeats posted by two hosts show as one verified and one failed stack in /v1/workloads/stacks, as rows of
    /ui/workloads and as the hosts/checks gauges of /metrics."""
    for host, minutes, report in (("host-a", 10, run("pass")), ("host-b", 11, run("pass")),
                                  ("host-c", 12, run("cpu_fallback", NEW_ID, NEW))):
        assert _post(app_client, tokens[host], [beat(host, minutes, report)]).status_code == 200
    reader = bearer(tokens[READER])
    body = app_client.get("/v1/workloads/stacks", headers=reader).json()
    assert (body["workload_count"], body["stack_count"]) == (1, 2)
    assert [(s["stack_id"], s["hosts_passed"], s["hosts_failed"], s["stack"]["gpu_stack"]) for s in body["stacks"]] \
        == [(OLD_ID, 2, 0, "CUDA 12.8"), (NEW_ID, 0, 1, "CUDA 13.0")]
    assert app_client.get("/v1/workloads/stacks").status_code == 401
    html = app_client.get("/ui/workloads", headers=reader).text
    assert re.findall(r'<tr class="workload-stack (\w+)" data-workload="resnet-train" data-stack-id="(\w+)"',
                      html) == [("verified", OLD_ID), ("unverified", NEW_ID)]
    assert "driver nvidia 580.159.04, CUDA 13.0, torch 2.9.1 (CUDA 12.8)" in html
    metrics = app_client.get("/metrics", headers=reader).text
    assert ('gpuguard_hub_workload_stack_hosts{driver="nvidia 570.86.15",gpu_stack="CUDA 12.8",result="pass",'
            f'stack_id="{OLD_ID}",workload="resnet-train"}} 2.0') in metrics
    assert ('gpuguard_hub_workload_stack_checks{driver="nvidia 580.159.04",gpu_stack="CUDA 13.0",result="fail",'
            f'stack_id="{NEW_ID}",workload="resnet-train"}} 1.0') in metrics


@pytest.mark.parametrize("change, field", [
    ({"name": "Bad Name"}, "name"), ({"status": "skipped"}, "status"), ({"stack_id": "xyz"}, "stack_id"),
    ({"stack": {"framework": "t" * 301}}, "framework")])
def test_a_malformed_workload_is_refused_naming_the_field(client: TestClient, tokens: Dict[str, str],
                                                         change: Dict[str, Any], field: str) -> None:
    """A heartbeat whose workload breaks a bound is a 422 whose problems name the field, and nothing is stored."""
    body = batch_dict([beat("host-a", 10, run("pass"))])
    body["events"][0]["payload"]["workloads"][0].update(change)
    answer = client.post("/v1/events", json=body, headers=bearer(tokens["host-a"]))
    assert answer.status_code == 422 and field in answer.text
    assert client.get("/v1/workloads/stacks", headers=bearer(tokens[READER])).json()["stack_count"] == 0


def test_more_than_32_workloads_are_refused(client: TestClient, tokens: Dict[str, str]) -> None:
    """A heartbeat with 33 workloads is a 422 naming workloads."""
    body = batch_dict([beat("host-a", 10, run("pass"))])
    body["events"][0]["payload"]["workloads"] *= 33
    answer = client.post("/v1/events", json=body, headers=bearer(tokens["host-a"]))
    assert answer.status_code == 422 and "workloads" in answer.text


@pytest.mark.slow
def test_a_real_hub_process_keeps_the_matrix(tmp_path: Path) -> None:
    """A real hub process on 127.0.0.1 takes a heartbeat with a workload over HTTP and answers the matrix."""
    from agent.hub.tokens import add_token

    tokens_file = tmp_path / "tokens.json"
    config = write_config(tmp_path / "hub.toml", listen_host="127.0.0.1", listen_port=0,
                          database_url=f"sqlite:///{tmp_path}/hub.db", tokens_file=tokens_file,
                          tokens_reload_seconds=0, shutdown_timeout_seconds=5)
    host, reader = add_token(str(tokens_file), "host", HOSTS[0]), add_token(str(tokens_file), "reader", READER)
    hub = HubProcess(config).start()
    try:
        answer = requests.post(f"{hub.url}/v1/events", data=batch_json([beat(HOSTS[0], 10, run("pass"))]),
                               headers={**bearer(host), "Content-Type": "application/json"}, timeout=10)
        assert answer.status_code == 200, answer.text
        stacks = requests.get(f"{hub.url}/v1/workloads/stacks", headers=bearer(reader), timeout=10).json()["stacks"]
        assert [(s["workload"], s["stack_id"], s["hosts_passed"]) for s in stacks] == [("resnet-train", OLD_ID, 1)]
    finally:
        hub.stop()


def test_the_verified_list_a_host_fetches(app_client: TestClient, tokens: Dict[str, str]) -> None:
    """GET /v1/workloads/verified (host token) lists per workload the stacks it passed on, newest pass first, in
    the form the hook's parser reads; failed-only stacks are left out; a reader token is refused."""
    from agent.hostfacts.verified_stacks import VerifiedStack, parse_verified_stacks

    for host, minutes, report in (("host-a", 10, run("pass")), ("host-b", 20, run("pass", NEW_ID, NEW)),
                                  ("host-c", 30, run("failed", NEW_ID, NEW, name="llm-decode"))):
        assert _post(app_client, tokens[host], [beat(host, minutes, report)]).status_code == 200
    answer = app_client.get("/v1/workloads/verified", headers=bearer(tokens["host-a"]))
    assert answer.status_code == 200
    listing = parse_verified_stacks(answer.json())
    assert listing.workloads == (("resnet-train", (VerifiedStack("nvidia 580.159.04", "CUDA 13.0"),
                                                   VerifiedStack("nvidia 570.86.15", "CUDA 12.8"))),)
    assert app_client.get("/v1/workloads/verified", headers=bearer(tokens[READER])).status_code == 403
    assert app_client.get("/v1/workloads/verified").status_code == 401


@pytest.mark.slow
def test_a_host_caches_the_real_hubs_list_and_its_rule_reads_it(tmp_path: Path) -> None:
    """refresh_verified against a real hub process writes workloads-verified.json, which the [workloads] rule then
    allows a verified driver by and refuses another by; a hub that cannot be reached keeps the cached list."""
    from agent.bundle.verified import refresh_verified
    from agent.hostfacts.context import HostContext
    from agent.hostfacts.verified_stacks import read_verified_stacks
    from agent.hub.tokens import add_token
    from agent.policy.compiled import CompiledPolicy
    from agent.policy.evaluate import evaluate
    from agent.policy.families import HostState

    tokens_file = tmp_path / "tokens.json"
    config = write_config(tmp_path / "hub.toml", listen_host="127.0.0.1", listen_port=0,
                          database_url=f"sqlite:///{tmp_path}/hub.db", tokens_file=tokens_file,
                          tokens_reload_seconds=0, shutdown_timeout_seconds=5)
    host = add_token(str(tokens_file), "host", HOSTS[0])
    cache = tmp_path / "root/var/lib/gpuguard/workloads-verified.json"
    cache.parent.mkdir(parents=True)
    hub = HubProcess(config).start()
    try:
        answer = requests.post(f"{hub.url}/v1/events", data=batch_json([beat(HOSTS[0], 10, run("pass", NEW_ID, NEW))]),
                               headers={**bearer(host), "Content-Type": "application/json"}, timeout=10)
        assert answer.status_code == 200, answer.text
        written, detail = refresh_verified(hub.url, host, None, (5.0, 10.0), str(cache))
        assert (written, detail) == (True, "1 workload(s)")
    finally:
        hub.stop()
    cached = read_verified_stacks(str(tmp_path / "root"), "/var/lib/gpuguard/workloads-verified.json")
    policy = CompiledPolicy({"name": "t", "action": "block", "kernel_packages": [], "guarded": [],
                             "workloads": {"verified": ["resnet-train"], "action": None}})

    def rules(after_version: str) -> List[str]:
        state = HostState({"nvidia-driver-570": "570.86.15-1"}, {"nvidia-driver-580": after_version}, "dpkg",
                          HostContext(verified_stacks=cached))
        return [v.rule for v in evaluate(state, policy)]

    assert rules("580.159.04-1") == [] and rules("580.105.08-1") == ["workloads.unverified"]
    before = cache.read_bytes()
    written, detail = refresh_verified(hub.url, host, None, (1.0, 1.0), str(cache))
    assert not written and "ConnectionError" in detail and cache.read_bytes() == before
