"""The hub's HTTP API through FastAPI's TestClient, over SQLite in tmp_path (and fake stores for failures)."""

from __future__ import annotations

import datetime as dt
import json
import threading
from pathlib import Path
from typing import Dict, Iterator, List, Sequence

import pytest
from fastapi.testclient import TestClient

from agent.errors import StoreError
from agent.hub.app import create_app
from agent.hub.rows import DRIFT_KINDS, BatchResult, DriftRow, EventQuery, HostRow, StoredEvent
from agent.hub.settings import HubSettings
from agent.hub.tokens import add_token
from agent.report.events import Event
from tests.hub.conftest import READER, HubClock, bearer
from tests.hub.factories import CUDA_12, ROCM_62, ROCM_63, T0, batch_dict, batch_json, event, ids


def post(client: TestClient, token: str, body: bytes, **headers: str):
    return client.post("/v1/events", content=body,
                       headers={**bearer(token), "Content-Type": "application/json", **headers})


def assert_refused(response, status: int, error: str, detail_part: str = "") -> Dict[str, object]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    body = response.json()
    assert body["error"] == error
    assert "\n" not in body["detail"] and detail_part in body["detail"]
    return body


# --- ingest -----------------------------------------------------------------------------------------------------

def test_a_batch_is_accepted_then_answered_as_duplicates(client: TestClient, tokens: Dict[str, str]) -> None:
    """The same batch twice: stored once, the second answer lists its events as duplicates."""
    events = [event("host-a"), event("host-a", kind="snapshot_changed", pairing=ROCM_62)]
    first = post(client, tokens["host-a"], batch_json(events))
    second = post(client, tokens["host-a"], batch_json(events))
    assert first.status_code == 200 and first.json() == {"accepted": ids(events), "duplicates": []}
    assert second.status_code == 200 and second.json() == {"accepted": [], "duplicates": ids(events)}
    listed = client.get("/v1/events", headers=bearer(tokens[READER])).json()
    assert sorted(r["event"]["event_id"] for r in listed["events"]) == sorted(ids(events))


def test_a_partly_resent_batch_splits_into_accepted_and_duplicates(client: TestClient,
                                                                   tokens: Dict[str, str]) -> None:
    """A batch holding an event the hub already stored and a new one answers the new one accepted and the old one a
    duplicate."""
    old, new = event("host-a"), event("host-a")
    post(client, tokens["host-a"], batch_json([old]))
    answer = post(client, tokens["host-a"], batch_json([old, new])).json()
    assert answer == {"accepted": [new.event_id], "duplicates": [old.event_id]}


@pytest.mark.parametrize("headers, detail", [
    ({}, "missing bearer token"),
    ({"Authorization": "Bearer gg1.0123456789abcdef.not-the-secret"}, "invalid bearer token"),
    ({"Authorization": "Bearer garbage"}, "invalid bearer token"),
    ({"Authorization": "Basic dXNlcjpwYXNz"}, "missing bearer token"),
    ({"Authorization": "Bearer"}, "missing bearer token"),
])
def test_missing_or_bad_token_is_401(client: TestClient, headers: Dict[str, str], detail: str) -> None:
    """A post without a bearer token, or with an unknown or malformed one, is refused 401 with WWW-Authenticate:
    Bearer."""
    response = client.post("/v1/events", content=batch_json([event("host-a")]), headers=headers)
    assert_refused(response, 401, "unauthorized", detail)
    assert response.headers["www-authenticate"] == "Bearer"


def test_a_token_with_the_right_selector_and_a_wrong_secret_is_401(client: TestClient,
                                                                    tokens: Dict[str, str]) -> None:
    """A token whose selector is known but whose secret differs by one character is refused 401."""
    prefix, selector, secret = tokens["host-a"].split(".")
    forged = f"{prefix}.{selector}.{secret[:-1]}{'A' if secret[-1] != 'A' else 'B'}"
    assert_refused(post(client, forged, batch_json([event("host-a")])), 401, "unauthorized")


def test_another_hosts_events_are_403(client: TestClient, tokens: Dict[str, str]) -> None:
    """host-b's token cannot post host-a's events, not even mixed with its own."""
    body = batch_json([event("host-b"), event("host-a")])
    assert_refused(post(client, tokens["host-b"], body), 403, "forbidden", "'host-a'")
    assert client.get("/v1/hosts", headers=bearer(tokens[READER])).json()["host_count"] == 0


def test_a_reader_token_cannot_post_events(client: TestClient, tokens: Dict[str, str]) -> None:
    """A reader token is refused 403 on POST /v1/events: only a host's token may post."""
    assert_refused(post(client, tokens[READER], batch_json([event("host-a")])), 403, "forbidden", "reader")


@pytest.mark.parametrize("body, detail", [
    (b"{", "not valid JSON"),
    (b"", "not valid JSON"),
    (b'{"events": [}', "not valid JSON"),
    (b'{"events": []} trailing', "not valid JSON"),
    (b'{"s":"\xff"}', "not valid JSON"),
])
def test_malformed_json_is_400(client: TestClient, tokens: Dict[str, str], body: bytes, detail: str) -> None:
    """A body that is not JSON is refused 400 malformed_json with a detail saying what is wrong."""
    assert_refused(post(client, tokens["host-a"], body), 400, "malformed_json", detail)


def _with(event_dict: Dict[str, object], **changes: object) -> bytes:
    return json.dumps({"events": [{**event_dict, **changes}]}).encode()


@pytest.mark.parametrize("mutate, detail", [
    (lambda e: json.dumps([e]).encode(), "EventBatch"),
    (lambda e: json.dumps({"events": []}).encode(), "at least 1 item"),
    (lambda e: _with(e, payload={"kind": "nonsense"}), "payload"),
    (lambda e: _with(e, host_id=""), "host_id"),
    (lambda e: _with(e, schema_version=2), "schema_version"),
    (lambda e: _with(e, unknown_field=1), "unknown_field"),
    (lambda e: _with(e, occurred_at="2026-01-01T00:00:00"), "needs a UTC offset"),
    (lambda e: _with(e, occurred_at="0001-01-01T00:00:00+05:00"), "out of range"),
    (lambda e: _with(e, sequence=2 ** 64), "sequence"),
    (lambda e: _with(e, hostname="a\u0000b"), "NUL"),
    (lambda e: _with(e, payload={**e["payload"], "uptime_seconds": 1e400}), "finite"),
    (lambda e: _with(e, payload={**e["payload"], "uptime_seconds": 10 ** 400}), "finite"),
    (lambda e: _with(e, payload={**e["payload"], "uptime_seconds": float("nan")}), "finite"),
    (lambda e: _with(e, payload={**e["payload"], "agent_version": "0.1\u0000"}), "NUL"),
])
def test_schema_invalid_bodies_are_422_with_each_problem(client: TestClient, tokens: Dict[str, str], mutate,
                                                         detail: str) -> None:
    """JSON that is not a valid EventBatch (or cannot be stored) is refused 422 schema_invalid, with its problems
    listed."""
    valid = batch_dict([event("host-a")])["events"][0]
    body = assert_refused(post(client, tokens["host-a"], mutate(valid)), 422, "schema_invalid", detail)
    assert body["problems"]


def test_every_problem_is_listed_and_the_detail_stays_one_line(client: TestClient, tokens: Dict[str, str]) -> None:
    """A batch with many problems lists each in problems while the detail stays one line ending in '(N more)'."""
    body = json.dumps({"events": [{"host_id": "host-a"}, {"host_id": "host-a"}]}).encode()
    refused = assert_refused(post(client, tokens["host-a"], body), 422, "schema_invalid", "more)")
    assert len(refused["problems"]) >= 6


def test_a_declared_length_over_the_limit_is_413_before_auth(client: TestClient, settings: HubSettings) -> None:
    """The size check comes first: no token needed to be refused, nothing parsed."""
    big = b"x" * (settings.max_body_bytes + 1)
    assert_refused(client.post("/v1/events", content=big), 413, "body_too_large", str(settings.max_body_bytes))


def test_a_chunked_body_over_the_limit_is_413(client: TestClient, tokens: Dict[str, str],
                                              settings: HubSettings) -> None:
    """Without Content-Length the body is counted as it streams in."""
    def chunks() -> Iterator[bytes]:
        for _ in range(settings.max_body_bytes // 4096 + 2):
            yield b" " * 4096

    response = client.post("/v1/events", content=chunks(), headers=bearer(tokens["host-a"]))
    assert "content-length" not in {k.lower() for k in response.request.headers}
    assert_refused(response, 413, "body_too_large")


def test_a_body_at_the_limit_is_read(client: TestClient, tokens: Dict[str, str], settings: HubSettings) -> None:
    """Exactly max_body_bytes is allowed (here: valid JSON padded with spaces)."""
    body = batch_json([event("host-a")])
    padded = body + b" " * (settings.max_body_bytes - len(body))
    assert post(client, tokens["host-a"], padded).status_code == 200


# --- fleet API --------------------------------------------------------------------------------------------------

@pytest.fixture
def fleet(client: TestClient, tokens: Dict[str, str], hub_clock: HubClock) -> List[Event]:
    """Three hosts: a on ROCm 6.2 then 6.3 with a regression, b on ROCm 6.2, c on CUDA and non-compliant; the hub
    receives each event at the time it carries (its clock then back to real time)."""
    a = [event("host-a", kind="snapshot_changed", pairing=ROCM_62, at=T0),
         event("host-a", kind="snapshot_changed", pairing=ROCM_63, at=T0 + dt.timedelta(days=2)),
         event("host-a", kind="health_regression", at=T0 + dt.timedelta(days=2, hours=1))]
    b = [event("host-b", kind="heartbeat", pairing=ROCM_62, at=T0 + dt.timedelta(days=1))]
    c = [event("host-c", kind="heartbeat", pairing=CUDA_12, compliant=False, at=T0),
         event("host-c", kind="policy_violation", at=T0 + dt.timedelta(days=3))]
    for host, events in (("host-a", a), ("host-b", b), ("host-c", c)):
        for one in events:
            hub_clock.at = one.occurred_at
            assert post(client, tokens[host], batch_json([one])).status_code == 200
    hub_clock.at = None
    return a + b + c


def test_hosts_lists_each_hosts_latest_pairing_and_compliance(client: TestClient, tokens: Dict[str, str],
                                                               fleet: List[Event]) -> None:
    """GET /v1/hosts gives each host its latest pairing, compliance, last event time and last-seen time."""
    answer = client.get("/v1/hosts", headers=bearer(tokens[READER])).json()
    hosts = {h["host_id"]: h for h in answer["hosts"]}
    assert answer["host_count"] == 3
    assert hosts["host-a"]["pairing"]["rocm"] == "6.3.1"
    assert hosts["host-b"]["pairing"]["rocm"] == "6.2.0" and hosts["host-b"]["compliant"] is True
    assert hosts["host-c"]["compliant"] is False
    assert hosts["host-c"]["last_event_at"] == "2026-01-04T00:00:00Z"
    assert all(h["last_seen_at"] for h in hosts.values())


def test_pairings_counts_hosts_per_stack(client: TestClient, tokens: Dict[str, str], fleet: List[Event]) -> None:
    """GET /v1/pairings groups the hosts by their driver/ROCm/CUDA stack and counts them."""
    answer = client.get("/v1/pairings", headers=bearer(tokens[READER])).json()
    by_stack = {(p["rocm"], p["nvidia_loaded"]): (p["host_count"], p["host_ids"]) for p in answer["pairings"]}
    assert by_stack == {("6.3.1", None): (1, ["host-a"]), ("6.2.0", None): (1, ["host-b"]),
                        (None, "550.90.07"): (1, ["host-c"])}
    assert answer["host_count"] == 3 and answer["hosts_without_pairing"] == 0


def test_drift_lists_who_drifted_since_when(client: TestClient, tokens: Dict[str, str], fleet: List[Event]) -> None:
    """GET /v1/drift?since= lists the hosts with drift events received since then, the first received first, with
    their first time on both clocks and kinds."""
    answer = client.get("/v1/drift", params={"since": "2026-01-02T00:00:00Z"},
                        headers=bearer(tokens[READER])).json()
    hosts = {h["host_id"]: h for h in answer["hosts"]}
    assert set(hosts) == {"host-a", "host-c"}
    assert hosts["host-a"]["first_received_at"] == hosts["host-a"]["first_occurred_at"] == "2026-01-03T00:00:00Z"
    assert set(hosts["host-a"]["kinds"]) == {"snapshot_changed", "health_regression"}
    assert hosts["host-c"]["kinds"]["policy_violation"]["event_count"] == 1
    assert [h["host_id"] for h in answer["hosts"]] == ["host-a", "host-c"]
    assert answer["kinds"] == list(DRIFT_KINDS)


def test_drift_since_accepts_a_date_and_offsets(client: TestClient, tokens: Dict[str, str],
                                                fleet: List[Event]) -> None:
    """A bare date is midnight UTC; an offset is honoured."""
    by_date = client.get("/v1/drift", params={"since": "2026-01-01"}, headers=bearer(tokens[READER])).json()
    assert by_date["since"] == "2026-01-01T00:00:00Z" and by_date["host_count"] == 2
    shifted = client.get("/v1/drift", params={"since": "2026-01-04T02:00:00+03:00"},
                         headers=bearer(tokens[READER])).json()
    assert shifted["since"] == "2026-01-03T23:00:00Z" and [h["host_id"] for h in shifted["hosts"]] == ["host-c"]


def test_drift_defaults_to_the_last_day(client: TestClient, tokens: Dict[str, str], fleet: List[Event]) -> None:
    """GET /v1/drift without since looks back one day from now."""
    answer = client.get("/v1/drift", headers=bearer(tokens[READER])).json()
    since = dt.datetime.fromisoformat(answer["since"].replace("Z", "+00:00"))
    assert abs((dt.datetime.now(dt.timezone.utc) - since) - dt.timedelta(days=1)) < dt.timedelta(minutes=1)
    assert answer["hosts"] == []  # the fleet fixture's events are in 2026-01


def test_events_filters_and_limits(client: TestClient, tokens: Dict[str, str], fleet: List[Event]) -> None:
    """GET /v1/events honours limit, host_id, kind, order and since, newest first by default."""
    reader = bearer(tokens[READER])
    newest = client.get("/v1/events", params={"limit": 2}, headers=reader).json()
    assert newest["count"] == 2 and newest["events"][0]["event"]["payload"]["kind"] == "policy_violation"
    snapshots = client.get("/v1/events", params={"host_id": "host-a", "kind": "snapshot_changed", "order": "asc"},
                           headers=reader).json()
    assert [r["event"]["payload"]["pairing"]["rocm"] for r in snapshots["events"]] == ["6.2.0", "6.3.1"]
    since = client.get("/v1/events", params={"since": "2026-01-03T00:30:00Z"}, headers=reader).json()
    assert {r["event"]["payload"]["kind"] for r in since["events"]} == {"health_regression", "policy_violation"}


@pytest.mark.parametrize("params, detail", [
    ({"limit": 0}, "limit"), ({"limit": 1001}, "limit"), ({"kind": "nonsense"}, "kind"),
    ({"order": "sideways"}, "order"), ({"since": "yesterday"}, "since"), ({"host_id": "x" * 129}, "host_id"),
])
def test_bad_queries_are_422(client: TestClient, tokens: Dict[str, str], params: Dict[str, object],
                             detail: str) -> None:
    """A query parameter out of range or of the wrong type is refused 422 invalid_request naming it."""
    response = client.get("/v1/events", params=params, headers=bearer(tokens[READER]))
    assert_refused(response, 422, "invalid_request", detail)


def test_since_out_of_range_is_422(client: TestClient, tokens: Dict[str, str]) -> None:
    """A since that falls outside the representable range once made UTC is refused 422, not a server error."""
    response = client.get("/v1/drift", params={"since": "0001-01-01T00:00:00+05:00"},
                          headers=bearer(tokens[READER]))
    assert_refused(response, 422, "invalid_request", "out of range")


@pytest.mark.parametrize("path", ["/v1/hosts", "/v1/pairings", "/v1/drift", "/v1/events"])
def test_fleet_api_wants_a_reader_token(client: TestClient, tokens: Dict[str, str], path: str) -> None:
    """Each fleet endpoint answers 401 without a token, 403 to a host's token and 200 to a reader token."""
    assert_refused(client.get(path), 401, "unauthorized")
    assert_refused(client.get(path, headers=bearer(tokens["host-a"])), 403, "forbidden", "reader token")
    assert client.get(path, headers=bearer(tokens[READER])).status_code == 200


def test_fleet_api_can_be_opened_to_anyone(settings: HubSettings) -> None:
    """With fleet_api_requires_token = false the fleet endpoints answer without any token."""
    from agent.hub.store import make_store

    opened = settings.model_copy(update={"fleet_api_requires_token": False})
    with TestClient(create_app(opened, make_store(opened.database_url))) as client:
        assert client.get("/v1/hosts").status_code == 200


def test_healthz_needs_no_token(client: TestClient) -> None:
    """GET /healthz answers without a token, naming the store and the event schema version."""
    assert client.get("/healthz").json() == {"status": "ok", "store": "SQLiteStore", "event_schema_version": 1}


def test_unknown_paths_and_methods_answer_json(client: TestClient) -> None:
    """An unknown path is a JSON 404 not_found and a wrong method a JSON 405 method_not_allowed."""
    assert_refused(client.get("/v2/nothing"), 404, "not_found")
    assert_refused(client.delete("/v1/events"), 405, "method_not_allowed")


def test_tokens_added_while_running_are_picked_up(client: TestClient, settings: HubSettings) -> None:
    """`gpuguard hub add-host` on a running hub: the new host can post without a restart."""
    token = add_token(settings.tokens_file, "host", "host-new")
    assert post(client, token, batch_json([event("host-new")])).status_code == 200


def test_a_corrupt_tokens_file_at_start_fails_loudly(tmp_path: Path) -> None:
    """A tokens file that is not JSON stops the app at creation with a ConfigError naming the file."""
    from agent.errors import ConfigError

    bad = tmp_path / "tokens.json"
    bad.write_text("{not json")
    with pytest.raises(ConfigError, match="tokens.json"):
        create_app(HubSettings(tokens_file=str(bad), database_url=f"sqlite:///{tmp_path}/hub.db"),
                   store=FailingStore())


def test_openapi_spec_describes_the_batch_body_and_every_refusal(client: TestClient) -> None:
    """The OpenAPI spec gives POST /v1/events its EventBatch body, every refusal status and the bearer scheme."""
    spec = client.get("/openapi.json").json()
    post_op = spec["paths"]["/v1/events"]["post"]
    assert post_op["requestBody"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/EventBatch"}
    assert {"200", "400", "401", "403", "413", "422", "503"} <= set(post_op["responses"])
    assert {"EventBatch", "Event", "Heartbeat", "Pairing", "ErrorBody"} <= set(spec["components"]["schemas"])
    assert spec["components"]["securitySchemes"]["HTTPBearer"]["scheme"] == "bearer"


# --- failures of the store and back-pressure ----------------------------------------------------------------------

class FailingStore:
    """A Store whose database is down."""

    def open(self) -> None:
        pass

    def close(self) -> None:
        pass

    def ping(self) -> None:
        raise StoreError("ping", "connection refused")

    def ingest(self, batches: Sequence[Sequence[Event]], received_at: dt.datetime) -> List[BatchResult]:
        raise StoreError("ingest", "disk I/O error")

    def hosts(self) -> List[HostRow]:
        raise StoreError("hosts", "connection refused")

    def drift(self, since: dt.datetime, kinds: Sequence[str] = DRIFT_KINDS) -> List[DriftRow]:
        raise StoreError("drift", "connection refused")

    def events(self, query: EventQuery) -> List[StoredEvent]:
        raise StoreError("events", "connection refused")


class GatedStore(FailingStore):
    """A Store whose ingest waits until the test opens the gate, then accepts everything."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.entered = threading.Event()

    def ingest(self, batches: Sequence[Sequence[Event]], received_at: dt.datetime) -> List[BatchResult]:
        self.entered.set()
        assert self.gate.wait(10)
        return [BatchResult(accepted=[e.event_id for e in b], duplicates=[]) for b in batches]


def test_a_failing_store_is_503_with_retry_after(settings: HubSettings, tokens: Dict[str, str]) -> None:
    """A store that fails makes posts, fleet reads and /healthz answer 503 unavailable, posts with Retry-After."""
    with TestClient(create_app(settings, FailingStore())) as client:
        response = post(client, tokens["host-a"], batch_json([event("host-a")]))
        assert_refused(response, 503, "unavailable", "disk I/O error")
        assert response.headers["retry-after"]
        assert_refused(client.get("/v1/hosts", headers=bearer(tokens[READER])), 503, "unavailable")
        assert_refused(client.get("/healthz"), 503, "unavailable")


def test_a_full_write_queue_is_503_not_unbounded_memory(settings: HubSettings, tokens: Dict[str, str]) -> None:
    """With one batch in the writer and one queued, a third is refused at once; the first two still land."""
    store = GatedStore()
    small = settings.model_copy(update={"max_pending_batches": 1})
    results: Dict[str, int] = {}
    with TestClient(create_app(small, store)) as client:
        def send(name: str) -> None:
            results[name] = post(client, tokens["host-a"], batch_json([event("host-a")])).status_code

        first = threading.Thread(target=send, args=("first",))
        first.start()
        assert store.entered.wait(10)
        second = threading.Thread(target=send, args=("second",))
        second.start()
        deadline = dt.datetime.now() + dt.timedelta(seconds=10)
        while client.app.state.writer._queue.qsize() < 1 and dt.datetime.now() < deadline:
            threading.Event().wait(0.01)
        third = post(client, tokens["host-a"], batch_json([event("host-a")]))
        assert_refused(third, 503, "unavailable", "too many batches")
        store.gate.set()
        first.join(10)
        second.join(10)
    assert results == {"first": 200, "second": 200}


def test_a_write_slower_than_the_timeout_is_503(settings: HubSettings, tokens: Dict[str, str]) -> None:
    """A write that takes longer than write_timeout_seconds is answered 503 unavailable, so the agent retries."""
    store = GatedStore()
    quick = settings.model_copy(update={"write_timeout_seconds": 0.2})
    with TestClient(create_app(quick, store)) as client:
        response = post(client, tokens["host-a"], batch_json([event("host-a")]))
        store.gate.set()
    assert_refused(response, 503, "unavailable", "retry")


def test_the_api_over_postgresql(settings: HubSettings, tokens: Dict[str, str], postgres_url: str) -> None:
    """The same requests against PostgresStore: dedupe, hosts, pairings, drift and events agree with SQLite's."""
    from agent.hub.store import PostgresStore

    pg_settings = settings.model_copy(update={"database_url": postgres_url})
    with TestClient(create_app(pg_settings, PostgresStore(postgres_url))) as client:
        events = [event("host-a", kind="snapshot_changed", pairing=ROCM_62, at=T0),
                  event("host-a", kind="rollback", at=T0 + dt.timedelta(hours=1))]
        assert post(client, tokens["host-a"], batch_json(events)).json()["accepted"] == ids(events)
        assert post(client, tokens["host-a"], batch_json(events)).json()["duplicates"] == ids(events)
        reader = bearer(tokens[READER])
        assert client.get("/v1/hosts", headers=reader).json()["hosts"][0]["pairing"]["rocm"] == "6.2.0"
        assert client.get("/v1/pairings", headers=reader).json()["pairings"][0]["host_ids"] == ["host-a"]
        drift = client.get("/v1/drift", params={"since": "2025-12-31"}, headers=reader).json()
        assert set(drift["hosts"][0]["kinds"]) == {"snapshot_changed", "rollback"}
        assert client.get("/v1/events", params={"kind": "rollback"}, headers=reader).json()["count"] == 1
        assert client.get("/healthz").json()["store"] == "PostgresStore"


def test_event_kind_filter_accepts_every_schema_kind() -> None:
    """The hub's kind filter is derived from the event schema, so a new payload kind (override_used) is queryable."""
    from typing import get_args

    from agent.hub.api_models import PayloadKind
    from agent.report.events import PAYLOAD_KINDS

    assert get_args(PayloadKind) == PAYLOAD_KINDS
    assert "override_used" in PAYLOAD_KINDS and "heartbeat" in PAYLOAD_KINDS
