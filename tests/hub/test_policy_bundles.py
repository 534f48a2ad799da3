"""Policy bundles at the hub: admins push and withdraw, readers list and show, every change audited, a new serial
decided in the database, and each host fetching the newest bundle in its scope (ETag, 304, 204)."""

from __future__ import annotations

import base64
import datetime as dt
import threading
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional

import pytest
from fastapi.testclient import TestClient

from agent.bundle.format import PolicyBundle, render_bundle
from agent.hub.app import create_app
from agent.hub.bundles import PolicyBundles
from agent.hub.responses import HubHTTPError
from agent.hub.settings import HubSettings
from agent.hub.store import PostgresStore, SQLiteStore, SqlStore, make_store
from agent.hub.tokens import Principal
from agent.report.events import Heartbeat
from tests.hub.conftest import bearer
from tests.hub.factories import CUDA_12, ROCM_62, T0, batch_json, event
from tests.hub.signing import check, signature_of

ADMIN = Principal(role="admin", subject="alice")


def bundle_bytes(serial: int, **scope: Any) -> bytes:
    """A well-formed bundle's canonical bytes."""
    return render_bundle(PolicyBundle.model_validate({
        "format": "gpuguard-policy-bundle/1", "serial": serial, "created_at": "2026-12-04T23:00:00Z",
        "created_by": "ops@example.com", "matrix_version": "2026.11",
        "scope": scope or {"all": True}, "policy_files": {"10-pairing.toml": "# pin\n"}, "matrix": None}))


def push_body(data: bytes, signature: Optional[bytes] = None) -> Dict[str, str]:
    """A push's JSON body; the signature is a real one by the key the hub under test trusts unless given."""
    signature = signature_of(data) if signature is None else signature
    return {"bundle": base64.b64encode(data).decode(), "signature": base64.b64encode(signature).decode()}


@pytest.fixture
def hub(settings: HubSettings) -> Iterator[TestClient]:
    """The real app over SQLite in tmp_path (its lifespan runs for the test)."""
    with TestClient(create_app(settings, make_store(settings.database_url))) as client:
        yield client


def refused(response: Any, status: int, error: str, words: str) -> None:
    """One JSON error body with the status, code and a one-line detail containing ``words``."""
    body = response.json()
    assert response.status_code == status, body
    assert body["error"] == error and words in body["detail"] and "\n" not in body["detail"], body


def push(hub: TestClient, token: str, data: bytes) -> Any:
    return hub.post("/v1/policy/bundles", json=push_body(data), headers=bearer(token))


def heartbeat(hub: TestClient, token: str, host_id: str, minutes: int = 1, **fields: Any) -> None:
    beat = event(host_id, at=T0 + dt.timedelta(minutes=minutes)).model_copy(
        update={"payload": Heartbeat(agent_version="1.0", uptime_seconds=1.0, **fields)})
    assert hub.post("/v1/events", content=batch_json([beat]), headers=bearer(token)).status_code == 200


def test_an_admin_pushes_and_a_reader_lists_shows_and_audits(hub: TestClient, tokens: Dict[str, str],
                                                             admin_token: str) -> None:
    """A pushed bundle is stored byte for byte with its signature and pusher, listed, shown and audited."""
    data = bundle_bytes(42)
    answer = push(hub, admin_token, data)
    assert answer.status_code == 201 and answer.headers["location"] == "/v1/policy/bundles/42"
    assert (answer.json()["serial"], answer.json()["pushed_by"], answer.json()["bundle_bytes"]) == (42, "release-admin",
                                                                                                   len(data))
    reader = bearer(tokens["ops"])
    listed = hub.get("/v1/policy/bundles", headers=reader).json()
    assert [b["serial"] for b in listed["bundles"]] == [42] and listed["bundles"][0]["scope"]["all"] is True
    shown = hub.get("/v1/policy/bundles/42", headers=reader).json()
    assert base64.b64decode(shown["bundle"]) == data
    assert base64.b64decode(shown["signature"]).startswith(b"\x88")  # the pushed binary signature, kept
    assert shown["policy_files"] == ["10-pairing.toml"] and shown["summary"]["matrix_version"] == "2026.11"
    [entry] = hub.get("/v1/audit", headers=reader).json()["entries"]
    assert (entry["actor"], entry["role"], entry["action"], entry["serial"]) == ("release-admin", "admin", "push", 42)


def test_only_an_admin_may_push_or_withdraw(hub: TestClient, tokens: Dict[str, str], admin_token: str) -> None:
    """A reader or host token is 403 on push and withdraw, no token 401; nothing is stored by them."""
    for token, who in ((tokens["ops"], "a reader"), (tokens["host-a"], "a host")):
        refused(push(hub, token, bundle_bytes(1)), 403, "forbidden", f"{who} token cannot change policy bundles")
    refused(hub.post("/v1/policy/bundles", json=push_body(bundle_bytes(1))), 401, "unauthorized", "missing bearer")
    assert push(hub, admin_token, bundle_bytes(1)).status_code == 201
    refused(hub.post("/v1/policy/bundles/1/withdraw", headers=bearer(tokens["ops"])), 403, "forbidden", "admin token")
    refused(hub.get("/v1/policy/bundles", headers=bearer(tokens["host-a"])), 403, "forbidden", "host token")
    assert hub.get("/v1/hosts", headers=bearer(admin_token)).status_code == 200  # an admin reads as a reader does


def test_a_serial_not_above_every_stored_one_is_409_and_audited(hub: TestClient, admin_token: str,
                                                               tokens: Dict[str, str]) -> None:
    """After serial 5, pushing 5 or 3 is 409 naming the highest stored serial; the refusal is in the audit trail."""
    assert push(hub, admin_token, bundle_bytes(5)).status_code == 201
    refused(push(hub, admin_token, bundle_bytes(5)), 409, "serial_not_newer", "serial 5 is not above 5")
    refused(push(hub, admin_token, bundle_bytes(3)), 409, "serial_not_newer", "--serial 6 or higher")
    assert push(hub, admin_token, bundle_bytes(6)).status_code == 201
    entries = hub.get("/v1/audit", headers=bearer(tokens["ops"])).json()["entries"]
    actions = [(e["action"], e["serial"]) for e in entries]
    assert actions == [("push", 6), ("push_refused", 3), ("push_refused", 5), ("push", 5)]


@pytest.mark.parametrize("body, error, words", [
    (push_body(b"{\"format\": \"something-else\"}", signature=b"sig"), "invalid_bundle", "format"),
    (push_body(bundle_bytes(1), signature=b""), "invalid_request", "signature"),
    ({"bundle": "%%% not base64", "signature": "c2ln"}, "invalid_request", "bundle: not base64"),
    ({"bundle": "e30="}, "invalid_request", "signature"),
], ids=["not-a-bundle", "empty-signature", "bad-base64", "no-signature"])
def test_a_push_that_is_not_a_bundle_is_422_in_one_line(hub: TestClient, admin_token: str, body: Dict[str, str],
                                                        error: str, words: str) -> None:
    """A body whose bundle does not parse, is not base64 or lacks a signature is 422 with one line naming it."""
    refused(hub.post("/v1/policy/bundles", json=body, headers=bearer(admin_token)), 422, error, words)
    assert hub.get("/v1/policy/bundles", headers=bearer(admin_token)).json()["count"] == 0


def test_withdrawal_is_admin_only_once_and_audited(hub: TestClient, admin_token: str, tokens: Dict[str, str]) -> None:
    """Withdrawing marks the bundle with who and when; a second withdrawal is 409, an unknown serial 404."""
    push(hub, admin_token, bundle_bytes(7))
    answer = hub.post("/v1/policy/bundles/7/withdraw", headers=bearer(admin_token))
    assert answer.status_code == 200 and answer.json()["withdrawn_by"] == "release-admin"
    refused(hub.post("/v1/policy/bundles/7/withdraw", headers=bearer(admin_token)), 409, "already_withdrawn",
            "already withdrawn by release-admin")
    refused(hub.post("/v1/policy/bundles/8/withdraw", headers=bearer(admin_token)), 404, "not_found", "serial 8")
    refused(hub.get("/v1/policy/bundles/8", headers=bearer(tokens["ops"])), 404, "not_found", "serial 8")
    for path in (f"/v1/policy/bundles/{2**70}", "/v1/policy/bundles/0"):  # beyond a database integer, below 1
        refused(hub.get(path, headers=bearer(tokens["ops"])), 422, "invalid_request", "path -> serial")
    entries = hub.get("/v1/audit", headers=bearer(tokens["ops"])).json()["entries"]
    assert [(e["action"], e["serial"]) for e in entries] == [("withdraw", 7), ("push", 7)]


def test_a_host_fetches_the_newest_bundle_in_its_scope(hub: TestClient, admin_token: str,
                                                      tokens: Dict[str, str]) -> None:
    """No bundle is 204; an in-scope one is 200 with ETag "bundle-N"; If-None-Match with it is 304; a newer bundle
    out of the host's scope is not offered, and a withdrawn one no longer."""
    host = bearer(tokens["host-a"])
    assert hub.get("/v1/policy/bundle", headers=host).status_code == 204
    push(hub, admin_token, bundle_bytes(10))
    first = hub.get("/v1/policy/bundle", headers=host)
    assert first.status_code == 200 and first.headers["etag"] == '"bundle-10"' and first.json()["serial"] == 10
    assert base64.b64decode(first.json()["bundle"]) == bundle_bytes(10)
    again = hub.get("/v1/policy/bundle", headers={**host, "If-None-Match": '"bundle-10"'})
    assert again.status_code == 304 and again.content == b""
    assert hub.get("/v1/policy/bundle", headers={**host, "If-None-Match": '"bundle-9", *'}).status_code == 304
    assert hub.get("/v1/policy/bundle", headers={**host, "If-None-Match": '"bundle-9"'}).status_code == 200
    push(hub, admin_token, bundle_bytes(11, labels={"rack": "a7"}))
    assert hub.get("/v1/policy/bundle", headers={**host, "If-None-Match": '"bundle-10"'}).status_code == 304
    heartbeat(hub, tokens["host-a"], "host-a", labels={"rack": "a7"})
    assert hub.get("/v1/policy/bundle", headers={**host, "If-None-Match": '"bundle-10"'}).json()["serial"] == 11
    assert hub.get("/v1/policy/bundle", headers=bearer(tokens["host-b"])).json()["serial"] == 10
    hub.post("/v1/policy/bundles/11/withdraw", headers=bearer(admin_token))
    assert hub.get("/v1/policy/bundle", headers=host).json()["serial"] == 10
    refused(hub.get("/v1/policy/bundle", headers=bearer(tokens["ops"])), 403, "forbidden", "use the host's token")


def test_scope_is_judged_by_the_pairing_and_os_the_host_reported(hub: TestClient, admin_token: str,
                                                                tokens: Dict[str, str]) -> None:
    """A bundle for NVIDIA hosts on Debian 12 reaches the host whose heartbeat carried that pairing, not the
    ROCm host nor a host never heard from."""
    push(hub, admin_token, bundle_bytes(20, pairings=["nvidia 550.*"], os=["debian-12"]))
    heartbeat(hub, tokens["host-a"], "host-a", pairing=CUDA_12)
    heartbeat(hub, tokens["host-b"], "host-b", pairing=ROCM_62)
    assert hub.get("/v1/policy/bundle", headers=bearer(tokens["host-a"])).json()["serial"] == 20
    assert hub.get("/v1/policy/bundle", headers=bearer(tokens["host-b"])).status_code == 204
    assert hub.get("/v1/policy/bundle", headers=bearer(tokens["host-c"])).status_code == 204


def _stores(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> List[SqlStore]:
    if kind == "sqlite":
        return [SQLiteStore(str(tmp_path / "hub.db")) for _ in range(2)]
    url = request.getfixturevalue("postgres_url")
    return [PostgresStore(url) for _ in range(2)]


@pytest.mark.parametrize("kind", ["sqlite", "postgresql"])
def test_two_hubs_pushing_one_serial_at_once_store_it_once(kind: str, tmp_path: Path,
                                                           request: pytest.FixtureRequest) -> None:
    """Two hub processes' stores pushing serial 9 at the same moment, eight times over: each time exactly one
    push is stored and the other is 409, decided in the database."""
    stores = _stores(kind, tmp_path, request)
    for store in stores:
        store.open()
    try:
        hubs = [PolicyBundles(store, check()) for store in stores]
        for serial in range(9, 17):
            barrier = threading.Barrier(2)
            outcomes: List[Optional[int]] = [None, None]

            def attempt(index: int, serial: int = serial, barrier: threading.Barrier = barrier,
                        outcomes: List[Optional[int]] = outcomes) -> None:
                barrier.wait(timeout=10)
                try:
                    hubs[index].push(ADMIN, bundle_bytes(serial), signature_of(bundle_bytes(serial)))
                    outcomes[index] = 201
                except HubHTTPError as exc:
                    outcomes[index] = exc.status

            threads = [threading.Thread(target=attempt, args=(i,)) for i in range(2)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(timeout=30)
            assert sorted(outcomes, key=str) == [201, 409], (serial, outcomes)
        assert [s.serial for s in hubs[0].summaries()] == list(range(16, 8, -1))
    finally:
        for store in stores:
            store.close()


@pytest.fixture
def rollout_fleet(hub: TestClient, admin_token: str, tokens: Dict[str, str]) -> TestClient:
    """Serial 11 offered to all; host-a enforces 10, host-b enforces 10 and refused 11 (an escaped reason), host-c
    enforces 11."""
    push(hub, admin_token, bundle_bytes(10))
    push(hub, admin_token, bundle_bytes(11))
    heartbeat(hub, tokens["host-a"], "host-a", policy_source="bundle", policy_serial=10)
    heartbeat(hub, tokens["host-b"], "host-b", policy_source="bundle", policy_serial=10, policy_refused_serial=11,
              policy_refused_reason="signature: BADSIG <key ABCD>", policy_refused_kind="scope")
    heartbeat(hub, tokens["host-c"], "host-c", policy_source="bundle", policy_serial=11)
    return hub


def test_the_fleet_api_shows_each_hosts_serial_offer_and_refusal(rollout_fleet: TestClient,
                                                                 tokens: Dict[str, str]) -> None:
    """/v1/policy/hosts: hosts on an older serial than offered and the one that refused, with why; /v1/hosts rows
    carry the heartbeat's policy fields."""
    reader = bearer(tokens["ops"])
    rollout = rollout_fleet.get("/v1/policy/hosts", headers=reader).json()
    assert (rollout["newest_serial"], rollout["behind_count"], rollout["refused_count"]) == (11, 2, 1)
    by_host = {h["host_id"]: h for h in rollout["hosts"]}
    assert (by_host["host-a"]["behind"], by_host["host-a"]["refused_serial"]) == (True, None)
    assert (by_host["host-b"]["refused_serial"], by_host["host-b"]["refused_reason"]) == (
        11, "signature: BADSIG <key ABCD>")
    assert (by_host["host-b"]["refused"], by_host["host-b"]["refused_kind"]) == (True, "scope")
    assert (by_host["host-c"]["behind"], by_host["host-c"]["offered_serial"]) == (False, 11)
    hosts = {h["host_id"]: h for h in rollout_fleet.get("/v1/hosts", headers=reader).json()["hosts"]}
    assert (hosts["host-b"]["policy_source"], hosts["host-b"]["policy_serial"]) == ("bundle", 10)


def test_metrics_show_serials_hosts_behind_and_refusals(rollout_fleet: TestClient, tokens: Dict[str, str]) -> None:
    """/metrics carries each host's serial, the newest serial, hosts behind and hosts that refused."""
    text = rollout_fleet.get("/metrics", headers=bearer(tokens["ops"])).text
    for line in ('gpuguard_hub_host_policy_serial{host_id="host-a"} 10.0',
                 'gpuguard_hub_host_policy_serial{host_id="host-c"} 11.0', "gpuguard_hub_policy_newest_serial 11.0",
                 "gpuguard_hub_hosts_policy_behind 2.0", "gpuguard_hub_hosts_policy_refused 1.0"):
        assert line in text.splitlines(), line


def test_the_dashboard_shows_hosts_behind_and_refusals_with_why(rollout_fleet: TestClient,
                                                               tokens: Dict[str, str]) -> None:
    """The overview lists the host that refused (reason escaped) and the hosts behind; the host page says behind;
    /ui/policy lists both bundles and the audit trail."""
    reader = bearer(tokens["ops"])
    overview = rollout_fleet.get("/ui/", headers=reader).text
    assert 'id="policy-refused-count">1<' in overview and 'id="policy-behind-count">2<' in overview
    assert 'class="refused" data-host-id="host-b"' in overview and "BADSIG &lt;key ABCD&gt;" in overview
    assert 'class="behind" data-host-id="host-a"' in overview and 'data-host-id="host-c"' not in \
        overview.split('id="policy-behind"')[1].split("</table>")[0]
    host_page = rollout_fleet.get("/ui/hosts/host-a", headers=reader).text
    assert 'id="policy-behind"' in host_page and "<th>Offered serial</th><td>11</td>" in host_page
    policy_page = rollout_fleet.get("/ui/policy", headers=reader).text
    assert 'data-serial="11"' in policy_page and 'data-serial="10"' in policy_page
    assert policy_page.count('<tr class="audit">') == 2


def test_roots_and_freshness_are_204_until_configured_and_for_hosts_only(hub: TestClient,
                                                                          tokens: Dict[str, str]) -> None:
    """Without [hub] root_dir and a freshness key the hub serves neither (204, so a host keeps what it trusts); a
    reader token may not ask, a host token without a version is 422."""
    host = bearer(tokens["host-a"])
    assert hub.get("/v1/policy/root?version=2", headers=host).status_code == 204
    assert hub.get("/v1/policy/freshness", headers=host).status_code == 204
    assert hub.get("/v1/policy/root", headers=host).status_code == 422
    assert hub.get("/v1/policy/freshness", headers=bearer(tokens["ops"])).status_code == 403
    assert hub.get("/v1/policy/root?version=2").status_code == 401


def test_a_refusal_kind_and_a_fast_forward_are_counted_and_shown(rollout_fleet: TestClient,
                                                                 tokens: Dict[str, str]) -> None:
    """host-c's signature refusal (no serial: a claim is never kept) counts as refused with its kind in the host
    API, /metrics (one series per kind) and the dashboard; host-a enforcing 2**63-1, above every serial offered,
    is flagged ahead."""
    heartbeat(rollout_fleet, tokens["host-c"], "host-c", policy_source="bundle", policy_serial=11,
              policy_refused_kind="signature", policy_refused_reason="signature: NO_PUBKEY", minutes=2)
    heartbeat(rollout_fleet, tokens["host-a"], "host-a", policy_source="bundle", policy_serial=2**63 - 1, minutes=2)
    reader = bearer(tokens["ops"])
    rollout = rollout_fleet.get("/v1/policy/hosts", headers=reader).json()
    by_host = {h["host_id"]: h for h in rollout["hosts"]}
    assert (by_host["host-c"]["refused"], by_host["host-c"]["refused_serial"], by_host["host-c"]["refused_kind"]) == (
        True, None, "signature")
    assert (by_host["host-a"]["ahead"], by_host["host-c"]["ahead"], rollout["ahead_count"]) == (True, False, 1)
    assert rollout["refused_count"] == 2
    assert rollout["refused_by_kind"] == {"signature": 1, "threshold": 0, "expired": 0, "rollback": 0, "scope": 1,
                                          "format": 0, "compile": 0, "freshness": 0}
    hosts = {h["host_id"]: h for h in rollout_fleet.get("/v1/hosts", headers=reader).json()["hosts"]}
    assert hosts["host-c"]["policy_refused_kind"] == "signature"
    lines = rollout_fleet.get("/metrics", headers=reader).text.splitlines()
    for line in ('gpuguard_hub_hosts_policy_refused_by_kind{kind="signature"} 1.0',
                 'gpuguard_hub_hosts_policy_refused_by_kind{kind="format"} 0.0',
                 "gpuguard_hub_hosts_policy_refused 2.0", "gpuguard_hub_hosts_policy_ahead 1.0"):
        assert line in lines, line
    host_page = rollout_fleet.get("/ui/hosts/host-c", headers=reader).text
    assert '<span class="badge bad" id="policy-refused">signature</span>' in host_page
    assert 'id="policy-ahead"' in rollout_fleet.get("/ui/hosts/host-a", headers=reader).text
    overview = rollout_fleet.get("/ui/", headers=reader).text
    assert 'class="refused" data-host-id="host-c" data-kind="signature"' in overview
    assert 'id="policy-ahead-count">1<' in overview


def test_a_keyless_push_cannot_raise_the_serial_floor(hub: TestClient, admin_token: str,
                                                      tokens: Dict[str, str]) -> None:
    """An admin token pushing serial 2**63-1 with 120 random bytes as its signature, or with a real signature by a
    key the hub does not trust, or a trusted signature over other bytes, is refused (422, audited, nothing stored
    or offered); later good pushes still succeed and are offered."""
    import os

    from tests.bundle.keys import Signer

    assert push(hub, admin_token, bundle_bytes(5)).status_code == 201
    top = bundle_bytes(2**63 - 1)
    refused(hub.post("/v1/policy/bundles", json=push_body(top, signature=os.urandom(120)), headers=bearer(admin_token)),
            422, "signature_refused", "signature: refused: signature: ")
    import tempfile
    with tempfile.TemporaryDirectory() as home:
        stranger = Signer(Path(home), "mallory")
        path = Path(home) / "top.json"
        path.write_bytes(top)
        foreign = stranger.sign(path).read_bytes()
        stranger.close()
    refused(hub.post("/v1/policy/bundles", json=push_body(top, signature=foreign), headers=bearer(admin_token)),
            422, "signature_refused", "which no trusted keyring holds")
    refused(hub.post("/v1/policy/bundles", json=push_body(top, signature=signature_of(bundle_bytes(6))),
                     headers=bearer(admin_token)), 422, "signature_refused", "bad signature")
    reader = bearer(tokens["ops"])
    assert [b["serial"] for b in hub.get("/v1/policy/bundles", headers=reader).json()["bundles"]] == [5]
    assert push(hub, admin_token, bundle_bytes(6)).status_code == 201
    assert hub.post("/v1/policy/bundles/6/withdraw", headers=bearer(admin_token)).status_code == 200
    assert push(hub, admin_token, bundle_bytes(7)).status_code == 201  # the floor is 6, never 2**63-1
    offered = hub.get("/v1/policy/bundle", headers=bearer(tokens["host-a"]))
    assert offered.status_code == 200 and offered.json()["serial"] == 7
    actions = [(e["action"], e["serial"]) for e in hub.get("/v1/audit", headers=reader).json()["entries"]]
    assert actions.count(("push_refused", None)) == 3  # an unverified bundle's serial is not kept


def test_a_hub_without_trusted_keys_refuses_every_push(tmp_path: Path, settings: HubSettings,
                                                       admin_token: str) -> None:
    """With no keyring in policy_keys_dir the hub stores nothing: every push is 422 naming the directory."""
    empty = tmp_path / "no-keys"
    empty.mkdir()
    bare = settings.model_copy(update={"policy_keys_dir": str(empty)})
    with TestClient(create_app(bare, make_store(bare.database_url))) as client:
        refused(push(client, admin_token, bundle_bytes(1)), 422, "signature_refused", f"no trusted key in {empty}")


def test_a_stored_bundle_that_does_not_verify_is_never_offered(settings: HubSettings, admin_token: str,
                                                                tokens: Dict[str, str]) -> None:
    """A row stored before the hub verified pushes (serial 2**63-1, 120 random bytes as its signature) is offered
    to no host, counted nowhere and raises no serial floor: hosts get the newest bundle that verifies, and the next
    push above it is stored."""
    import os

    store = make_store(settings.database_url)
    store.open()
    bundles = PolicyBundles(store, check())  # type: ignore[arg-type]
    bundles.push(ADMIN, bundle_bytes(5), signature_of(bundle_bytes(5)))
    top = bundle_bytes(2**63 - 1)

    def legacy(cur: Any) -> None:
        cur.execute(store.dialect.sql(  # type: ignore[attr-defined]
            "INSERT INTO policy_bundles (serial, bundle, signature, sha256, scope, created_at, created_by, "
            "pushed_at, pushed_by, staged) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, 0)"),
            (2**63 - 1, top, os.urandom(120), "0" * 64, '{"all": true}', "2026-12-04T23:00:00Z", "x",
             store.dialect.to_db_time(T0), "mallory"))  # type: ignore[attr-defined]

    store.write("legacy_row", legacy)  # type: ignore[attr-defined]
    assert bundles.offer_serial("host-a") == 5 and bundles.rollout().newest_serial == 5
    assert bundles.push(ADMIN, bundle_bytes(6), signature_of(bundle_bytes(6))).serial == 6
    with pytest.raises(HubHTTPError, match="taken by a stored bundle whose signature does not verify"):
        bundles.push(ADMIN, top, signature_of(top))
    store.close()
    with TestClient(create_app(settings, make_store(settings.database_url))) as hub:
        offered = hub.get("/v1/policy/bundle", headers=bearer(tokens["host-a"]))
        assert offered.status_code == 200 and offered.json()["serial"] == 6


def knowledge_bundle_bytes(serial: int, knowledge: Dict[str, str]) -> bytes:
    """A well-formed bundle's canonical bytes carrying these knowledge files (file name -> TOML text)."""
    data = PolicyBundle.model_validate_json(bundle_bytes(serial)).model_dump()
    return render_bundle(PolicyBundle.model_validate({**data, "knowledge": knowledge}))


def test_a_push_whose_knowledge_table_is_malformed_is_422_naming_file_and_field(hub: TestClient, admin_token: str,
                                                                                tokens: Dict[str, str]) -> None:
    """A signed bundle carrying a TheRock table with a bad row (or a table under another table's file name) is
    refused by the agent's own knowledge parser before anything is stored: 422 naming the file and the field,
    audited as a refused push without a serial; the same bundle with the shipped table is stored."""
    shipped = (Path(__file__).resolve().parents[2] / "policies/knowledge/therock-releases.toml").read_text()
    bad = knowledge_bundle_bytes(3, {"therock-releases.toml": shipped.replace('release = "10.1"', 'release = "10"')})
    refused(push(hub, admin_token, bad), 422, "invalid_bundle",
            "not a policy bundle: knowledge -> therock-releases.toml: row -> 4 -> release: '10' is not a MAJOR.MINOR "
            "series (the bundle claims serial 3)")
    swapped = knowledge_bundle_bytes(3, {"dcgm-exporter.toml": shipped})
    refused(push(hub, admin_token, swapped), 422, "invalid_bundle",
            "knowledge -> dcgm-exporter.toml: table: 'therock-releases' is not the table a file named "
            "dcgm-exporter.toml holds")
    reader = bearer(tokens["ops"])
    assert hub.get("/v1/policy/bundles", headers=reader).json()["count"] == 0
    entries = hub.get("/v1/audit", headers=reader).json()["entries"]
    assert [(e["action"], e["serial"]) for e in entries] == [("push_refused", None)] * 2
    assert any("knowledge -> therock-releases.toml: row -> 4 -> release" in e["detail"] for e in entries)
    assert push(hub, admin_token, knowledge_bundle_bytes(3, {"therock-releases.toml": shipped})).status_code == 201
