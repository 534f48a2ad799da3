"""Nothing a refused answer claims is kept: a junk answer claiming serial 2**64 (or 2**63-1) leaves the host
reporting its installed serial, and a validly signed bundle with text UTF-8 cannot encode, or a key named twice, is
a refusal of kind ``format`` (no traceback) that the state file, ``status`` and the heartbeat carry."""

from __future__ import annotations

import base64
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Iterator

import pytest

from agent.bundle.state import read_bundle_state
from agent.config import load_settings, parse_settings
from agent.daemon_jobs.heartbeat import policy_fields
from agent.daemon_jobs.policy_fetch import fetch_and_install
from agent.host import Host
from agent.report.events import Heartbeat
from agent.status.assess import assess
from agent.status.facts import read_policy
from tests.bundle.test_install import Site
from tests.status.test_assess import healthy


class OfferHub:
    """An HTTP server on 127.0.0.1 that answers every request with one 200 offer body."""

    def __init__(self, body: bytes) -> None:
        offered = body

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - the http.server name
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(offered)))
                self.end_headers()
                self.wfile.write(offered)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(10)


def offer(serial: int, bundle: bytes, signature: bytes) -> bytes:
    return json.dumps({"serial": serial, "bundle": base64.b64encode(bundle).decode(),
                       "signature": base64.b64encode(signature).decode()}).encode()


@pytest.fixture
def served(tmp_path: Path) -> Iterator[object]:
    hubs = []

    def serve(body: bytes) -> OfferHub:
        hubs.append(OfferHub(body))
        return hubs[-1]

    yield serve
    for hub in hubs:
        hub.close()


def reporting_site(tmp_path: Path, url: str) -> Site:
    """A Site with serial 1 installed whose agent fetches from ``url``."""
    site = Site(tmp_path)
    assert site.install(site.bundle(1))[0] == 0
    token = tmp_path / "host.token"
    token.write_text("t0ken\n")
    token.chmod(0o600)
    site.config.write_text(site.config.read_text() + f'[report]\nendpoint_url = "{url}"\ntoken_file = "{token}"\n')
    return site


def heartbeat_policy(site: Site, tmp_path: Path) -> dict:
    """The heartbeat's policy fields as the daemon sends them, checked by the hub's schema."""
    from tests.daemon.test_jobs import make_runtime

    rt = make_runtime(tmp_path, Host.for_root(str(site.root)), load_settings(str(site.config)))
    rt.state_dir = "/var/lib/gpuguard"  # the agent's, under the host root
    fields = policy_fields(rt)
    Heartbeat(agent_version="0", uptime_seconds=1.0, **fields)  # what the hub would refuse raises here
    return fields


@pytest.mark.parametrize("claimed", [2**64, 2**63 - 1])
def test_a_junk_answer_s_claimed_serial_is_never_kept(tmp_path: Path, served: object, claimed: int) -> None:
    """An answer claiming serial 2**64 or 2**63-1 with junk bytes as bundle and signature changes nothing the
    host reports: the heartbeat's serial is the installed one and no claimed serial is recorded or sent."""
    hub = served(offer(claimed, b"junk" * 30, b"\x00" * 120))  # type: ignore[operator]
    site = reporting_site(tmp_path, hub.url)
    before = site.compiled.read_bytes()
    result = fetch_and_install(Host.for_root(str(site.root)), parse_settings(site.config.read_text()), "node-1")
    assert result.outcome in ("failed", "refused") and result.serial is None
    state = read_bundle_state(str(site.state / "policy-bundle/state.json"))
    assert state.serial == 1 and (state.refused is None or state.refused.serial is None)
    fields = heartbeat_policy(site, tmp_path)
    assert fields["policy_serial"] == 1 and fields.get("policy_refused_serial") is None
    assert site.compiled.read_bytes() == before and site.hook_refuses()


def surrogate_bundle(site: Site, serial: int) -> Path:
    """A validly signed bundle whose policy file holds a lone surrogate (``\\ud800``, a JSON escape)."""
    made = site.hand_made(serial, {"10-site.toml": "# MARK\n"})
    made.write_bytes(made.read_bytes().replace(b"MARK", b"\\ud800"))
    site.signer.sign(made)
    return made


def test_a_signed_bundle_with_a_lone_surrogate_is_a_format_refusal(tmp_path: Path) -> None:
    """``policy install`` of a validly signed bundle holding ``\\ud800`` exits 17 with one line naming the kind
    and the field; the state records kind format and ``status`` shows it; the policy in force is kept."""
    site = Site(tmp_path)
    assert site.install(site.bundle(1))[0] == 0
    before = site.compiled.read_bytes()
    code, out, err = site.install(surrogate_bundle(site, 2))
    assert code == 17 and err.count("\n") == 1 and "Traceback" not in err, err
    assert "refused (format): not a policy bundle: policy_files -> 10-site.toml: text holds U+D800" in err, err
    state = read_bundle_state(str(site.state / "policy-bundle/state.json"))
    assert state.serial == 1 and state.refused is not None and state.refused.kind == "format"
    assert state.refused.serial is None
    check = next(c for c in assess(healthy(policy=read_policy(Host.for_root(str(site.root)),
                                                               parse_settings(site.config.read_text()).guard,
                                                               "/var/lib/gpuguard"))).checks if c.name == "policy")
    assert check.state == "warn" and "refused (format): " in check.summary
    assert site.compiled.read_bytes() == before and site.hook_refuses()


def test_the_daemon_records_a_surrogate_bundle_as_a_refusal(tmp_path: Path, served: object) -> None:
    """The fetch child (a real ``gpuguard _job policy_fetch``) offered the surrogate bundle records a format
    refusal (no crash) at every interval, which the heartbeat carries to the hub with its kind."""
    from agent.daemon_jobs.children import PolicyFetchInChild
    from tests.daemon.test_jobs import make_runtime

    site = Site(tmp_path / "maker")
    made = surrogate_bundle(site, 2)
    hub = served(offer(2, made.read_bytes(), made.with_name(made.name + ".sig").read_bytes()))  # type: ignore[operator]
    host_site = reporting_site(tmp_path, hub.url)
    host_site.signer = site.signer
    site.signer.export(host_site.root / "etc/gpuguard/keys/maker.gpg")
    result = fetch_and_install(Host.for_root(str(host_site.root)), parse_settings(host_site.config.read_text()),
                               "node-1")
    assert (result.outcome, result.kind, result.serial) == ("refused", "format", None), result
    rt = make_runtime(tmp_path, Host.for_root(str(host_site.root)), load_settings(str(host_site.config)))
    asked: list = []
    PolicyFetchInChild(rt, str(host_site.config), asked.append).run()
    assert asked == ["policy_bundle_refused"]
    fields = heartbeat_policy(host_site, tmp_path)
    assert (fields["policy_serial"], fields["policy_refused_kind"]) == (1, "format")
    assert "U+D800" in fields["policy_refused_reason"]


def test_a_signed_bundle_naming_a_key_twice_is_refused(tmp_path: Path) -> None:
    """A validly signed bundle whose JSON names ``serial`` twice (a reviewer's tool may show the other value) is a
    format refusal."""
    site = Site(tmp_path)
    made = site.hand_made(3, {"10-site.toml": "# x\n"})
    made.write_bytes(made.read_bytes().replace(b'"serial":3', b'"serial":2,"serial":3'))
    site.signer.sign(made)
    code, _, err = site.install(made)
    assert code == 17 and "refused (format): " in err and "duplicate key 'serial'" in err, err
