"""TUF's attack list against a host under a root, with real gpg keys, gpgv and a real hub on 127.0.0.1 (its online
freshness key and its roots directory set), reached through a man in the middle the test controls: each attack is
refused with its own kind (or, for a freeze, made visible as attention) and the compiled policy stays byte for
byte what it was."""

from __future__ import annotations

import base64
import datetime as dt
import json
import os
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Callable, Dict, Iterator, Optional, Tuple

import pytest
import requests

from agent.bundle.channel import bounded_get
from agent.bundle.format import MAX_SERIAL
from agent.bundle.state import BundleState, read_bundle_state
from agent.config import Settings, parse_settings
from agent.daemon_jobs.policy_fetch import fetch_and_install
from agent.daemon_jobs.protocol import PolicyFetchResult
from agent.host import Host
from agent.hub.tokens import add_token
from agent.status.assess import assess
from agent.status.facts import read_policy
from agent.wire import BUNDLE_PATH, FRESHNESS_PATH, ROOT_PATH
from tests.bundle.roots import role, sign_by, write_root
from tests.bundle.test_install import PERMISSIVE, POLICY, run
from tests.bundle.test_roles import Trust
from tests.hub.process import HubProcess, write_config
from tests.status.test_assess import healthy

pytestmark = pytest.mark.slow  # a real hub process

Answer = Callable[[BaseHTTPRequestHandler], None]


class Middle:
    """A server on 127.0.0.1 between the host and the hub: each path answers as set in ``answers`` (a handler
    function), else the hub's own answer is passed on."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.answers: Dict[str, Answer] = {}
        middle = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                answer = middle.answers.get(self.path.split("?")[0])
                if answer is not None:
                    answer(self)
                    return
                headers = {k: v for k, v in self.headers.items() if k.lower() in ("authorization",
                                                                                    "if-none-match")}
                reply = requests.get(middle.upstream + self.path, headers=headers, timeout=30)
                self.send_response(reply.status_code)
                self.send_header("Content-Length", str(len(reply.content)))
                self.end_headers()
                self.wfile.write(reply.content)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def fixed(status: int, body: bytes = b"") -> Answer:
    """Always this status and body."""
    def answer(handler: BaseHTTPRequestHandler) -> None:
        handler.send_response(status)
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        handler.wfile.write(body)
    return answer


def endless(handler: BaseHTTPRequestHandler) -> None:
    """200 and bytes until the client goes away."""
    handler.send_response(200)
    handler.end_headers()
    try:
        while True:
            handler.wfile.write(b" " * 65536)
    except OSError:
        pass


def slow(handler: BaseHTTPRequestHandler) -> None:
    """200 and one byte a second, for at most a minute."""
    handler.send_response(200)
    handler.end_headers()
    try:
        for _ in range(60):
            handler.wfile.write(b" ")
            handler.wfile.flush()
            time.sleep(1)
    except OSError:
        pass


def offer_of(serial: int, bundle: Path) -> Answer:
    """A 200 offer of ``bundle`` (and its .sig) as serial ``serial``."""
    body = json.dumps({"serial": serial, "bundle": base64.b64encode(bundle.read_bytes()).decode(),
                       "signature": base64.b64encode(Path(f"{bundle}.sig").read_bytes()).decode()}).encode()
    return fixed(200, body)


class Fleet:
    """A Trust site reporting to a real hub (roots in ``hub_roots``, freshness signed by key f1) through a Middle."""

    def __init__(self, tmp_path: Path, trust: Trust) -> None:
        self.trust = trust
        self.site = trust.site
        self.hub_roots = tmp_path / "hub-roots"
        self.hub_roots.mkdir()
        # The hub holds every root from the first: it checks pushes against the newest one.
        for suffix in ("", ".sig"):
            (self.hub_roots / f"1.root.json{suffix}").write_bytes(Path(f"{trust.first}{suffix}").read_bytes())
        tokens = tmp_path / "tokens.json"
        config = write_config(tmp_path / "hub.toml", listen_host="127.0.0.1", listen_port=0,
                              database_url=f"sqlite:///{tmp_path}/hub.db", tokens_file=tokens,
                              tokens_reload_seconds=0, shutdown_timeout_seconds=5, root_dir=self.hub_roots,
                              freshness_gnupg_home=trust.f1.home, freshness_key=trust.f1.fingerprint,
                              freshness_hours=24)
        self.hub = HubProcess(config).start()
        self.admin = self._token(tmp_path, tokens, "admin", "alice")
        host_token = self._token(tmp_path, tokens, "host", "node-1")
        self.host_token = host_token.read_text().strip()
        self.middle = Middle(self.hub.url)
        self.site.config.write_text(self.site.config.read_text() + f'[report]\nendpoint_url = "{self.middle.url}"\n'
                                                                   f'token_file = "{host_token}"\n')
        self.settings: Settings = parse_settings(self.site.config.read_text())

    @staticmethod
    def _token(tmp_path: Path, tokens: Path, kind: str, subject: str) -> Path:
        path = tmp_path / f"{kind}-{subject}.token"
        path.write_text(add_token(str(tokens), kind, subject) + "\n")
        os.chmod(path, 0o600)
        return path

    def push(self, bundle: Path) -> None:
        code, out, err = run("hub", "policy", "push", str(bundle), "--hub", self.hub.url, "--token-file",
                             str(self.admin))
        assert code == 0, out + err

    def withdraw(self, serial: int) -> None:
        code, out, err = run("hub", "policy", "withdraw", str(serial), "--hub", self.hub.url, "--token-file",
                             str(self.admin))
        assert code == 0, out + err

    def fetch(self, clock: Optional[Callable[[], dt.datetime]] = None) -> PolicyFetchResult:
        host = Host.for_root(str(self.site.root))
        if clock is not None:
            host = Host(root=host.root, load_module=host.load_module, clock=clock)
        return fetch_and_install(host, self.settings, "node-1")

    def state(self) -> BundleState:
        return read_bundle_state(str(self.site.state / "policy-bundle/state.json"))

    def close(self) -> None:
        self.middle.close()
        self.hub.stop()
        self.trust.f1.close()


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Fleet]:
    """Root version 1 trusted; serial 1 (fleet role, 2-of-2) pushed, fetched and in force."""
    trust = Trust(tmp_path)
    made = Fleet(tmp_path, trust)
    try:
        made.push(trust.bundle(1, [trust.p1, trust.p2]))
        result = made.fetch()
        assert (result.outcome, result.serial, result.trust) == ("installed", 1, ""), result
        assert made.site.hook_refuses()
        yield made
    finally:
        made.close()


def refused_kind(fleet: Fleet, offer: Answer) -> Tuple[Optional[str], str]:
    """Offer through the middle; the refusal's kind and reason, the compiled policy checked unchanged."""
    before = fleet.site.compiled.read_bytes()
    fleet.middle.answers[BUNDLE_PATH] = offer
    result = fleet.fetch()
    assert fleet.site.compiled.read_bytes() == before and fleet.site.hook_refuses()
    assert result.outcome == "refused", result
    refusal = fleet.state().refused
    assert refusal is not None and fleet.state().serial == 1
    return refusal.kind, refusal.reason


def test_a_freeze_is_attention_and_past_the_window_the_old_statement_is_refused(fleet: Fleet) -> None:
    """A middle answering 304 forever while the signed statement names serial 2: attention (freshness) in the
    state and the heartbeat; past the statement's expiry, the replayed old statement is refused (freshness)."""
    trust = fleet.trust
    fleet.push(trust.bundle(2, [trust.p1, trust.p2], PERMISSIVE))
    before = fleet.site.compiled.read_bytes()
    fleet.middle.answers[BUNDLE_PATH] = fixed(304)
    assert fleet.fetch().outcome == "unchanged"
    state = fleet.state()
    now = dt.datetime.now(dt.timezone.utc)
    assert state.serial == 1 and state.stale(now) == "the hub's freshness statement names serial 2, not taken here"
    assert state.attention(now) == ("freshness",)
    facts = read_policy(Host.for_root(str(fleet.site.root)), fleet.settings.guard, "/var/lib/gpuguard")
    check = next(c for c in assess(healthy(policy=facts), now).checks if c.name == "policy")
    assert check.state == "warn" and check.summary.endswith("names serial 2, not taken here: still enforced")
    captured = requests.get(fleet.hub.url + FRESHNESS_PATH, timeout=30,
                            headers={"Authorization": f"Bearer {fleet.host_token}"}).content
    fleet.middle.answers[FRESHNESS_PATH] = fixed(200, captured)
    later = now + dt.timedelta(hours=25)
    result = fleet.fetch(clock=lambda: later)
    assert result.outcome == "unchanged" and "freshness statement expired at" in result.trust
    assert result.trust.endswith("[freshness]")
    assert fleet.state().attention(later) == ("freshness",)
    assert fleet.site.compiled.read_bytes() == before and fleet.site.hook_refuses()


def test_a_withdrawn_bundle_replayed_to_a_host_that_never_took_it_is_refused(fleet: Fleet) -> None:
    """Serial 2 pushed and withdrawn before this host took it; the middle offers it anyway: refused (freshness),
    because the withdrawal is in the hub's signed statement."""
    trust = fleet.trust
    second = trust.bundle(2, [trust.p1, trust.p2], PERMISSIVE)
    fleet.push(second)
    fleet.withdraw(2)
    kind, reason = refused_kind(fleet, offer_of(2, second))
    assert kind == "freshness" and "withdrawn" in reason


def test_rollback_is_refused(fleet: Fleet) -> None:
    """Serial 3 in force; serial 2, validly signed, is refused (rollback), by the fetch and by hand."""
    trust = fleet.trust
    older = trust.bundle(2, [trust.p1, trust.p2], PERMISSIVE)
    fleet.push(trust.bundle(3, [trust.p1, trust.p2]))
    assert fleet.fetch().outcome == "installed"
    before = fleet.site.compiled.read_bytes()
    fleet.middle.answers[BUNDLE_PATH] = offer_of(3, older)  # claims 3, is 2
    assert fleet.fetch().outcome == "refused" and fleet.state().refused.kind == "rollback"  # type: ignore[union-attr]
    assert trust.refused(older) == "rollback"
    assert fleet.site.compiled.read_bytes() == before and fleet.site.hook_refuses()


@pytest.mark.parametrize("attack", ["another scope", "1-of-2", "other bytes"])
def test_wrong_signers_and_wrong_bytes_are_refused(fleet: Fleet, attack: str) -> None:
    """A bundle by the key of a role for other hosts (scope), by one of the two keys needed (threshold), and a
    well-signed bundle whose bytes were changed after (signature)."""
    trust = fleet.trust
    if attack == "another scope":
        bundle, kind = trust.bundle(2, [trust.p3], PERMISSIVE), "scope"
    elif attack == "1-of-2":
        bundle, kind = trust.bundle(2, [trust.p2], PERMISSIVE), "threshold"
    else:
        bundle, kind = trust.bundle(2, [trust.p1, trust.p2], POLICY), "signature"
        bundle.write_bytes(bundle.read_bytes().replace(b"rocm-6.2", b"rocm-6.3"))
    assert refused_kind(fleet, offer_of(2, bundle))[0] == kind


def test_an_expired_root_taken_through_the_channel_refuses_every_bundle(fleet: Fleet) -> None:
    """The hub serves root 2, validly signed but expired: the walk says so (expired) and a good bundle is then
    refused as expired; the policy in force keeps guarding."""
    trust = fleet.trust
    trust.dir = fleet.hub_roots
    trust.root(2, [trust.r1, trust.r2], [trust.p1, trust.p2], [trust.r1, trust.r2], expires="2020-01-01T00:00:00Z")
    fleet.push(trust.bundle(2, [trust.p1, trust.p2], PERMISSIVE))
    before = fleet.site.compiled.read_bytes()
    result = fleet.fetch()
    assert "root version 2 expired" in result.trust and result.outcome == "refused"
    assert fleet.state().refused.kind == "expired"  # type: ignore[union-attr]
    assert fleet.site.compiled.read_bytes() == before and fleet.site.hook_refuses()


def test_fast_forward_by_one_leaked_key_then_recovery_by_rotation_through_the_channel(tmp_path: Path) -> None:
    """Under a 1-of-1 fleet role, the leaked key's serial 2^63-1 installs and holds every honest serial off; the
    hub then holds root 2 (signed by the root keys) that rotates the key out, and takes the honest bundle only under
    it (the hub checks pushes against its newest root): the next fetch walks root 2, the floor is reset, the honest
    serial 2 installs, and the leaked key is refused afterwards, by the hub (422) and by the host (signature)."""
    trust = Trust(tmp_path, place_first_root=False)
    one = write_root(trust.dir / "1.root.json", 1, [trust.r1, trust.r2], 2, [role("fleet", [trust.p1], 1)],
                     [trust.f1], [trust.r1, trust.r2, trust.p1, trust.p2, trust.f1])
    sign_by(one, [trust.r1, trust.r2])
    assert trust.trust(one)[0] == 0
    fleet = Fleet(tmp_path, trust)
    try:
        for suffix in ("", ".sig"):
            (fleet.hub_roots / f"1.root.json{suffix}").write_bytes(Path(f"{one}{suffix}").read_bytes())
        assert trust.refused(trust.bundle(MAX_SERIAL, [trust.p1], PERMISSIVE)) is None
        honest = trust.bundle(2, [trust.p2])
        code, out, err = run("hub", "policy", "push", str(honest), "--hub", fleet.hub.url, "--token-file",
                             str(fleet.admin))
        assert code != 0 and "no policy role of root version 1" in out + err  # p2 is no key of root 1
        two = write_root(fleet.hub_roots / "2.root.json", 2, [trust.r1, trust.r2], 2,
                         [role("fleet", [trust.p2], 1)], [trust.f1],
                         [trust.r1, trust.r2, trust.p1, trust.p2, trust.f1])
        sign_by(two, [trust.r1, trust.r2])
        fleet.push(honest)
        result = fleet.fetch()
        assert (result.outcome, result.serial, result.trust) == ("installed", 2, ""), result
        assert fleet.site.hook_refuses()
        leaked = trust.bundle(3, [trust.p1], PERMISSIVE)
        code, out, err = run("hub", "policy", "push", str(leaked), "--hub", fleet.hub.url, "--token-file",
                             str(fleet.admin))
        assert code != 0 and "signature" in out + err
        assert trust.refused(leaked) == "signature"
    finally:
        fleet.close()


def test_endless_and_slow_answers_change_nothing(fleet: Fleet) -> None:
    """An endless offer or statement is cut at its bound, a slow one at its deadline: the fetch fails in one line,
    and nothing trusted or enforced changes."""
    before, state = fleet.site.compiled.read_bytes(), fleet.state()
    fleet.middle.answers[FRESHNESS_PATH] = endless
    fleet.middle.answers[BUNDLE_PATH] = endless
    result = fleet.fetch()
    assert result.outcome == "failed" and "larger than allowed" in result.trust, result
    fleet.middle.answers[ROOT_PATH] = slow
    with pytest.raises(Exception, match="did not end in time|no answer within"):
        bounded_get(fleet.middle.url + ROOT_PATH + "?version=2", fleet.host_token, None, (5.0, 5.0), 1 << 20,
                    deadline_seconds=3.0)
    assert fleet.site.compiled.read_bytes() == before and fleet.site.hook_refuses()
    assert fleet.state().serial == state.serial and fleet.state().freshness_issued_at == state.freshness_issued_at
