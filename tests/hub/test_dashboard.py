"""The dashboard's pages over a seeded fleet (TestClient): access, counts, filters, escaping, the host page."""

from __future__ import annotations

import re
from typing import Any, Dict, Iterator

import pytest
from fastapi.testclient import TestClient

from agent.hub.app import create_app
from agent.hub.dashboard.session import COOKIE_NAME, SessionSigner
from agent.hub.settings import HubSettings
from agent.hub.store import make_store
from agent.report.events import Heartbeat, RollbackCoverage
from tests.hub.conftest import READER, bearer
from tests.hub.factories import ROCM_62, batch_json, event
from tests.hub.fleet_seed import EXPECTED, HOSTILE_HOSTNAME, HOSTILE_VERSION, NOW, REGRESSED_HEALTH, seed

PAGES = ("/ui/", "/ui/pairings", "/ui/hosts/gpu-bad-01", "/ui/?q=gpu")


@pytest.fixture
def seeded(settings: HubSettings) -> HubSettings:
    seed(settings.database_url)
    return settings


@pytest.fixture
def ui(seeded: HubSettings) -> Iterator[TestClient]:
    with TestClient(create_app(seeded, make_store(seeded.database_url), clock=lambda: NOW)) as client:
        yield client


def login(client: TestClient, token: str) -> None:
    answer = client.post("/ui/login", data={"token": token, "next": "/ui/"}, follow_redirects=False)
    assert answer.status_code == 303, answer.text


def host_rows(html: str) -> list:
    return re.findall(r'<tr class="host" data-host-id="([^"]*)"', html)


def count(html: str, ident: str) -> int:
    found = re.search(rf'id="{ident}">(\d+)<', html)
    assert found, ident
    return int(found.group(1))


def test_every_page_wants_a_login_and_shows_no_fleet_data(ui: TestClient) -> None:
    """Without a session or a reader token each page redirects to the login form, which shows no fleet data."""
    for path in PAGES:
        answer = ui.get(path, follow_redirects=False)
        assert answer.status_code == 303 and answer.headers["location"].startswith("/ui/login?next="), path
        page = ui.get(path)
        assert "Reader token" in page.text
        assert not [h for h in ("gpu-ok-01", "gpu-regressed-01", "violating", "6.2.0") if h in page.text]


def test_a_wrong_token_or_a_host_token_does_not_log_in(ui: TestClient, tokens: Dict[str, str]) -> None:
    """A made-up token gets 401 and no cookie; a host token is refused too."""
    for token, problem in (("gg1.0123456789abcdef.nope", "invalid reader token"),
                           (tokens["host-a"], "a host token cannot open the dashboard")):
        answer = ui.post("/ui/login", data={"token": token}, follow_redirects=False)
        assert answer.status_code == 401 and problem in answer.text
        assert COOKIE_NAME not in answer.headers.get("set-cookie", "")
    assert ui.get("/ui/", follow_redirects=False).status_code == 303


def test_login_sets_a_strict_httponly_session_and_logout_ends_it(ui: TestClient, tokens: Dict[str, str]) -> None:
    """The cookie is HttpOnly and SameSite=Strict and holds no token; after logout the pages want a login again."""
    answer = ui.post("/ui/login", data={"token": tokens[READER], "next": "/ui/pairings"}, follow_redirects=False)
    cookie = answer.headers["set-cookie"]
    assert answer.headers["location"] == "/ui/pairings"
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie and tokens[READER].split(".")[2] not in cookie
    assert ui.get("/ui/", follow_redirects=False).status_code == 200
    ui.post("/ui/logout")
    assert ui.get("/ui/", follow_redirects=False).status_code == 303


def test_login_never_redirects_off_the_dashboard(ui: TestClient, tokens: Dict[str, str]) -> None:
    """``next`` pointing at another site is replaced by the fleet page."""
    for target in ("https://evil.example/", "//evil.example/", "/v1/hosts"):
        answer = ui.post("/ui/login", data={"token": tokens[READER], "next": target}, follow_redirects=False)
        assert answer.headers["location"] == "/ui/"


def test_a_reader_token_as_bearer_opens_the_pages_without_a_session(ui: TestClient, tokens: Dict[str, str]) -> None:
    """Scripts may send the reader token on each request; a host token gets the login redirect."""
    assert ui.get("/ui/", headers=bearer(tokens[READER]), follow_redirects=False).status_code == 200
    assert ui.get("/ui/", headers=bearer(tokens["host-a"]), follow_redirects=False).status_code == 303


def test_a_forged_or_expired_session_is_refused(seeded: HubSettings) -> None:
    """A cookie with a changed name or time fails its signature; an expired one is refused."""
    store = make_store(seeded.database_url)
    store.open()
    now = [1_000_000.0]
    signer = SessionSigner(store, 60, now=lambda: now[0])
    cookie = signer.issue("ops")
    assert signer.reader_of(cookie) == "ops"
    version, expires, name, mac = cookie.split(".")
    assert signer.reader_of(".".join([version, str(int(expires) + 3600), name, mac])) is None
    assert signer.reader_of(".".join([version, expires, "YWRtaW4", mac])) is None
    now[0] += 61
    assert signer.reader_of(cookie) is None
    assert SessionSigner(store, 60, now=lambda: 1_000_000.0).reader_of(cookie) == "ops"  # key shared via the db
    store.close()


def test_the_overview_counts_the_fleet(ui: TestClient, tokens: Dict[str, str]) -> None:
    """Hosts, compliant, violating, unknown and stale as seeded; the violating host is listed as violating."""
    login(ui, tokens[READER])
    html = ui.get("/ui/").text
    assert {k: count(html, f"count-{k.replace('host_count', 'hosts')}") for k in EXPECTED} == EXPECTED
    assert len(host_rows(html)) == EXPECTED["host_count"]
    row = re.search(r'<tr class="host" data-host-id="gpu-bad-01">.*?</tr>', html)
    assert row and "violating" in row.group(0)
    stale = re.search(r'<tr class="host" data-host-id="gpu-stale-01">.*?</tr>', html)
    assert stale and 'class="badge bad stale"' in stale.group(0)


@pytest.mark.parametrize("query, hosts", [
    ("q=bad", ["gpu-bad-01"]),
    ("q=DC2", ["gpu-regressed-01"]),
    ("q=100%25", []),
    ("compliance=violating", ["gpu-bad-01"]),
    ("compliance=unknown", ["gpu-new-01", "gpu-odd-01"]),
    ("stale=yes", ["gpu-stale-01"]),
    ("kernel=6.1.0-25-amd64", ["gpu-regressed-01"]),
    ("driver=550.90.07&cuda=12.4", ["gpu-regressed-01"]),
    ("rocm=6.3.1", ["gpu-bad-01"]),
    ("health=cpu_fallback", ["gpu-regressed-01"]),
    ("q=gpu-ok&compliance=compliant&stale=no", ["gpu-ok-01", "gpu-ok-02", "gpu-ok-03"]),
])
def test_filters_narrow_the_host_list(ui: TestClient, tokens: Dict[str, str], query: str, hosts: list) -> None:
    """Each filter (query parameter) leaves only the matching hosts; the summary says how many."""
    login(ui, tokens[READER])
    html = ui.get(f"/ui/?{query}").text
    assert host_rows(html) == hosts
    assert f"{len(hosts)} matching host" in html


def test_a_bad_filter_value_is_a_400_page(ui: TestClient, tokens: Dict[str, str]) -> None:
    """An unknown compliance value names the parameter and its choices."""
    login(ui, tokens[READER])
    answer = ui.get("/ui/?compliance=maybe")
    assert answer.status_code == 400 and "compliance: must be one of compliant, violating, unknown" in answer.text
    assert ui.get("/ui/hosts/nobody").status_code == 404


def test_pages_split_a_large_fleet(settings: HubSettings, tokens: Dict[str, str]) -> None:
    """120 hosts: 50 on page 1, 20 on page 3, with next/previous links that keep the filter."""
    store = make_store(settings.database_url)
    store.open()
    store.ingest([[event(f"node-{n:03d}", "heartbeat", at=NOW, pairing=ROCM_62) for n in range(120)]], NOW)
    store.close()
    with TestClient(create_app(settings, make_store(settings.database_url), clock=lambda: NOW)) as client:
        login(client, tokens[READER])
        first = client.get("/ui/?q=node").text
        third = client.get("/ui/?q=node&page=3").text
    assert host_rows(first)[:2] == ["node-000", "node-001"] and len(host_rows(first)) == 50
    assert host_rows(third)[-1] == "node-119" and len(host_rows(third)) == 20
    assert 'href="/ui/?q=node&amp;page=2"' in first and "page 3 of 3" in third


def test_agent_text_is_escaped_everywhere(ui: TestClient, tokens: Dict[str, str]) -> None:
    """A hostname and a version with markup show as text, never as elements; the CSP allows no script."""
    login(ui, tokens[READER])
    for path in ("/ui/", "/ui/pairings", "/ui/hosts/gpu-odd-01"):
        answer = ui.get(path)
        assert "<img" not in answer.text and "<b>bold" not in answer.text, path
        assert "default-src 'none'" in answer.headers["content-security-policy"]
        assert "script-src" not in answer.headers["content-security-policy"]
    host = ui.get("/ui/hosts/gpu-odd-01").text
    assert "evil&lt;b&gt;bold&lt;/b&gt;&amp;amp;" in host and "&lt;img src=x onerror=alert(1)&gt;" in host
    assert HOSTILE_HOSTNAME not in host and HOSTILE_VERSION not in host


def test_the_host_page_shows_snapshot_timeline_and_plot(ui: TestClient, tokens: Dict[str, str]) -> None:
    """The regressed host: its pairing, a newest-first drift timeline, and one plot point per heartbeat."""
    login(ui, tokens[READER])
    html = ui.get("/ui/hosts/gpu-regressed-01").text
    assert "550.90.07" in html and "NVIDIA H100 80GB HBM3" in html
    timeline = re.search(r'<ol class="timeline" id="drift">(.*?)</ol>', html)
    assert timeline
    assert re.findall(r'data-kind="([a-z_]+)"', timeline.group(1)) == ["cpu_fallback", "health_regression",
                                                                      "snapshot_changed"]
    assert "packages/nvidia-driver: 535.183.01 \u2192 550.90.07" in timeline.group(1)
    assert html.count('<circle class="point"') == len(REGRESSED_HEALTH)
    assert html.count('<line class="regression"') == 1
    heartbeats = ui.get("/ui/hosts/gpu-regressed-01?kind=heartbeat").text
    events = re.search(r'<ol class="timeline" id="events">(.*?)</ol>', heartbeats)
    assert events and events.group(1).count('data-kind="heartbeat"') == len(REGRESSED_HEALTH)


def test_the_pairings_page_groups_hosts(ui: TestClient, tokens: Dict[str, str]) -> None:
    """Four hosts share ROCm 6.2.0 (one of them stale), one runs 6.3.1 and is violating."""
    login(ui, tokens[READER])
    html = ui.get("/ui/pairings").text
    rows = re.findall(r'<tr class="pairing">(.*?)</tr>', html)
    assert len(rows) == 4
    assert '<td class="n">4</td>' in rows[0] and "6.2.0" in rows[0]
    newer = [r for r in rows if "6.3.1" in r]
    assert newer and '<td class="n">1</td><td>0</td><td>1</td>' in newer[0]


def test_an_open_fleet_api_opens_the_dashboard(seeded: HubSettings) -> None:
    """fleet_api_requires_token = false: the pages answer without a login, like the JSON API."""
    open_settings = seeded.model_copy(update={"fleet_api_requires_token": False})
    with TestClient(create_app(open_settings, make_store(seeded.database_url))) as client:
        assert client.get("/ui/", follow_redirects=False).status_code == 200


def test_dashboard_routes_stay_out_of_the_openapi_spec(ui: TestClient) -> None:
    """The spec (fuzzed by schemathesis) documents the JSON API only."""
    paths = ui.get("/openapi.json").json()["paths"]
    assert not [p for p in paths if p.startswith("/ui") or p == "/metrics"]



def test_the_cookie_is_secure_behind_a_tls_proxy(ui: TestClient, tokens: Dict[str, str]) -> None:
    """X-Forwarded-Proto: https (a TLS-terminating proxy) marks the session cookie Secure; plain http does not."""
    plain = ui.post("/ui/login", data={"token": tokens[READER]}, follow_redirects=False)
    proxied = ui.post("/ui/login", data={"token": tokens[READER]}, headers={"X-Forwarded-Proto": "https"},
                      follow_redirects=False)
    assert "Secure" not in plain.headers["set-cookie"] and "Secure" in proxied.headers["set-cookie"]


def test_a_host_id_with_a_slash_has_its_page(settings: HubSettings, tokens: Dict[str, str]) -> None:
    """Host ids are free text: one with '/' and spaces gets a working link and page."""
    overview, page = _pages_of_one_host(settings, tokens, "rack 4/gpu-9", ROCM_62, "/ui/",
                                        "/ui/hosts/rack%204%2Fgpu-9")
    assert 'href="/ui/hosts/rack%204%2Fgpu-9"' in overview.text
    assert page.status_code == 200 and "<h1>rack 4/gpu-9" in page.text


def _pages_of_one_host(settings: HubSettings, tokens: Dict[str, str], host: str, pairing: Any, *paths: str) -> list:
    """The answers to ``paths`` of a hub that has one heartbeat of ``host`` with ``pairing``, read as a reader."""
    store = make_store(settings.database_url)
    store.open()
    store.ingest([[event(host, "heartbeat", at=NOW, pairing=pairing)]], NOW)
    store.close()
    with TestClient(create_app(settings, make_store(settings.database_url), clock=lambda: NOW)) as client:
        login(client, tokens[READER])
        return [client.get(path) for path in paths]


def test_the_overview_shows_dead_alert_deliveries(seeded: HubSettings, tokens: Dict[str, str]) -> None:
    """With a webhook configured, the overview counts its deliveries by state, a dead one marked."""
    from agent.hub.alert_settings import AlertWebhook
    from agent.hub.alerts import AlertQueue

    hook = AlertWebhook(name="ops-chat", url="http://127.0.0.1:9/")
    store = make_store(seeded.database_url)
    store.open()
    queue = AlertQueue(store, [hook])
    queue.open()
    queue.enqueue([event("gpu-bad-01", "cpu_fallback").model_copy(update={"severity": "critical"})], NOW)
    queue.settle(queue.claim(NOW, 60)[0], NOW, "HTTP 500", max_attempts=1, retry_in_seconds=1)
    store.close()
    with TestClient(create_app(seeded.model_copy(update={"alert_webhooks": [hook]}),
                               make_store(seeded.database_url), clock=lambda: NOW)) as client:
        login(client, tokens[READER])
        line = re.search(r'<p id="alert-webhooks">.*?</p>', client.get("/ui/").text)
    assert line and "ops-chat: 0 pending, 0 delivered" in line.group(0)
    assert '<span class="badge bad dead">1 dead</span>' in line.group(0)
    with TestClient(create_app(seeded, make_store(seeded.database_url), clock=lambda: NOW)) as client:
        login(client, tokens[READER])
        assert 'id="alert-webhooks"' not in client.get("/ui/").text


def test_the_host_page_shows_the_rollback_coverage_of_the_newest_heartbeat(ui: TestClient,
                                                                         tokens: Dict[str, str]) -> None:
    """A host whose newest heartbeat says 31 of 33 guarded packages restorable: an 'incomplete' badge, the count,
    the sources and the two packages no file was kept for; a host that never reported one shows a dash."""
    coverage = RollbackCoverage(guarded=33, restorable=31, by_source={"rebuilt": 30, "archive cache": 1},
                                not_restorable=["cuda-cudart-13-0", "cuda-nvrtc-13-0"])
    beat = event("host-a", at=NOW).model_copy(update={"payload": Heartbeat(
        agent_version="0.1.0", uptime_seconds=1.0, rollback_coverage=coverage)})
    assert ui.post("/v1/events", content=batch_json([beat]), headers=bearer(tokens["host-a"])).status_code == 200
    login(ui, tokens[READER])
    html = ui.get("/ui/hosts/host-a").text
    assert '<span class="badge bad" id="rollback-coverage">incomplete</span> 31/33 guarded packages restorable' in html
    assert "(1 archive cache, 30 rebuilt)" in html and "not restorable: cuda-cudart-13-0, cuda-nvrtc-13-0" in html
    assert '<span class="badge unk" id="rollback-coverage">' in ui.get("/ui/hosts/gpu-regressed-01").text


def test_dashboard_text_escapes_terminal_controls_as_well_as_html() -> None:
    """e() writes ESC, BEL and CR from a node's report out as visible escapes, after escaping HTML."""
    from agent.hub.dashboard.render import e

    assert e("<b>\x1b[2J\x1b]52;c;eA==\x07\r") == "&lt;b&gt;\\x1b[2J\\x1b]52;c;eA==\\x07\\r"


def test_the_host_page_shows_every_rocm_release_of_a_mixed_host(settings: HubSettings, tokens: Dict[str, str]) -> None:
    """A classic 6.4.1 + TheRock 7.13 host's page lists both releases with the packages carrying them."""
    mixed = ROCM_62.model_copy(update={"rocm": "6.4.1-83", "rocm_releases": "7.13.0 (amdrocm-base7.13), "
                                                                             "6.4.1 (rocm-core)"})
    (answer,) = _pages_of_one_host(settings, tokens, "gpu-mixed-01", mixed, "/ui/hosts/gpu-mixed-01")
    page = answer.text
    assert "<tr><th>ROCm releases installed</th><td>7.13.0 (amdrocm-base7.13), 6.4.1 (rocm-core)</td></tr>" in page


def test_the_host_page_names_the_active_rocm_tree(settings: HubSettings, tokens: Dict[str, str]) -> None:
    """A host with TheRock 7.14 and 10.0 side by side shows the tree update-alternatives points at."""
    both = ROCM_62.model_copy(update={"rocm": "10.0.0", "rocm_active_tree": "/opt/rocm/core-10.0",
                                      "rocm_releases": "7.14.0 (amdrocm-base7.14), 10.0.0 (amdrocm-base10.0)"})
    (answer,) = _pages_of_one_host(settings, tokens, "gpu-rock-01", both, "/ui/hosts/gpu-rock-01")
    assert "<tr><th>ROCm active tree</th><td>/opt/rocm/core-10.0</td></tr>" in answer.text
