"""The hub's staged-rollout notice on the agent: made one bounded printable line, kept in the bundle state by the
policy fetch (a missing notice clears it), shown by the apt hook's refusal, naming the maintenance hand-off."""

from __future__ import annotations

import base64
import http.server
import json
import os
import threading
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Tuple

import pytest

from agent.bundle.rollout import MAX_NOTICE_CHARS, admission, clean_notice, handoff_reason
from agent.bundle.state import read_bundle_state
from agent.config import parse_settings
from agent.daemon_jobs.policy_fetch import fetch_and_install
from agent.guard.hotpath import decision as exits
from agent.host import Host
from tests.bundle.test_install import BREAKING, POLICY, Site
from tests.guard.apt.test_hook import run_hook

WAITING = "rollout r2-1a2b3c: waiting for stage 1 (0/2 canaries passed, soak ends 01:01 UTC)"

Answer = Tuple[int, Dict[str, str], bytes]


@pytest.mark.parametrize(("sent", "kept"), [
    (None, None),
    ("  ", None),
    (WAITING, WAITING),
    ("rollout r1-aa: paused (\x1b[2Jby\u202ealice)", "rollout r1-aa: paused (\\x1b[2Jby\\u202ealice)"),
    ("x" * 1000, "x" * (MAX_NOTICE_CHARS - 3) + "..."),
])
def test_a_notice_is_kept_as_one_printable_bounded_line(sent: Optional[str], kept: Optional[str]) -> None:
    """Control and bidi characters are escaped, blanks are no notice, and a long one is cut to the bound."""
    assert clean_notice(sent) == kept


@pytest.mark.parametrize(("notice", "reason"), [
    ("rollout r43-1a2b3c: admitted at stage 2", "rollout r43-1a2b3c stage 2"),
    ("rollout r43-1a2b3c: admitted at stage 0", "rollout r43-1a2b3c stage 0"),
    (WAITING, "policy bundle serial 7"),
    ("rollout r43: admitted at stage 2 (forged tail)", "policy bundle serial 7"),
    (None, "policy bundle serial 7"),
])
def test_the_handoff_reason_names_an_admitting_rollout(notice: Optional[str], reason: str) -> None:
    """Only a notice that says this host was admitted names the rollout and stage; anything else names the serial."""
    assert handoff_reason(notice, 7) == reason
    assert (admission(notice) is not None) == reason.startswith("rollout")


class FakeHub:
    """A stdlib HTTP server on 127.0.0.1 answering GET /v1/policy/bundle with the queued answers, in order."""

    def __init__(self) -> None:
        self.answers: List[Answer] = []
        self.seen: List[Dict[str, str]] = []
        hub = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                hub.seen.append(dict(self.headers))
                status, headers, body = hub.answers.pop(0)
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                if status == 200:
                    self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if status == 200:
                    self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


@pytest.fixture
def fake_hub() -> Iterator[FakeHub]:
    hub = FakeHub()
    yield hub
    hub.close()


def offer_body(bundle: Path, serial: int, notice: Optional[str]) -> bytes:
    """The hub's 200 body for a signed bundle file, with the rollout field."""
    return json.dumps({"serial": serial, "bundle": base64.b64encode(bundle.read_bytes()).decode(),
                       "signature": base64.b64encode(bundle.with_name(bundle.name + ".sig").read_bytes()).decode(),
                       "rollout": notice}).encode()


def test_the_fetch_keeps_the_newest_notice_and_the_hook_shows_it(fake_hub: FakeHub, tmp_path: Path) -> None:
    """200 with a notice -> installed and kept; the hook's refusal adds the line; 304 with another notice replaces
    it (escaped); a failed fetch keeps it; 304 without one clears it and the refusal no longer has the line."""
    site = Site(tmp_path)
    token = tmp_path / "host.token"
    token.write_text("secret-host-token\n")
    os.chmod(token, 0o600)
    site.config.write_text(site.config.read_text() + f'[report]\nendpoint_url = "{fake_hub.url}"\n'
                                                     f'token_file = "{token}"\n')
    settings = parse_settings(site.config.read_text())
    host = Host.for_root(str(site.root))
    state_file = str(site.state / "policy-bundle/state.json")

    fake_hub.answers.append((200, {"ETag": '"bundle-1"', "X-Gpuguard-Rollout": WAITING},
                             offer_body(site.bundle(1, POLICY), 1, WAITING)))
    result = fetch_and_install(host, settings, "node-1")
    assert (result.outcome, result.serial, result.rollout) == ("installed", 1, WAITING)
    state = read_bundle_state(state_file)
    assert state.serial == 1 and state.rollout == WAITING and state.rollout_at is not None
    code, out = run_hook(site.root, BREAKING)
    assert code == exits.EXIT_REFUSED and f"gpuguard: {WAITING}\n" in out
    assert out.index("REFUSED (amd.pairing)") < out.index(WAITING) < out.index("nothing was changed")

    halted = "rollout r2-1a2b3c: halted (1 of 2 canaries failed: gpu-07\x1b[2J)"
    fake_hub.answers.append((304, {"ETag": '"bundle-1"', "X-Gpuguard-Rollout": halted}, b""))
    result = fetch_and_install(host, settings, "node-1")
    assert result.outcome == "unchanged" and fake_hub.seen[-1]["If-None-Match"] == '"bundle-1"'
    assert read_bundle_state(state_file).rollout == "rollout r2-1a2b3c: halted (1 of 2 canaries failed: gpu-07" \
                                                    "\\x1b[2J)"
    assert "\x1b" not in run_hook(site.root, BREAKING)[1]

    fake_hub.answers.append((500, {}, b""))
    assert fetch_and_install(host, settings, "node-1").outcome == "failed"
    assert read_bundle_state(state_file).rollout is not None  # nothing heard: the notice before stands

    fake_hub.answers.append((304, {"ETag": '"bundle-1"'}, b""))
    assert fetch_and_install(host, settings, "node-1").outcome == "unchanged"
    state = read_bundle_state(state_file)
    assert state.rollout is None and state.rollout_at is None and state.serial == 1
    code, out = run_hook(site.root, BREAKING)
    assert code == exits.EXIT_REFUSED and "rollout" not in out


def test_a_damaged_state_file_never_changes_the_hooks_decision(tmp_path: Path) -> None:
    """The notice is advice: a bundle state that is not JSON gives no line, and the hook still refuses."""
    site = Site(tmp_path)
    assert site.install(site.bundle(1, POLICY))[0] == 0
    (site.state / "policy-bundle/state.json").write_text("{not json")
    code, out = run_hook(site.root, BREAKING)
    assert code == exits.EXIT_REFUSED and "rollout" not in out


def test_status_and_explain_show_the_notice(tmp_path: Path) -> None:
    """``gpuguard status``'s policy row and ``policy explain`` (text and JSON) carry the kept notice; without one
    they do not mention a rollout."""
    from agent.bundle.install import BundleInstaller
    from agent.status.assess import assess
    from agent.status.facts import read_policy
    from tests.bundle.test_install import run
    from tests.status.test_assess import healthy

    site = Site(tmp_path)
    assert site.install(site.bundle(1, POLICY))[0] == 0
    settings = parse_settings(site.config.read_text())
    host = Host.for_root(str(site.root))

    def row() -> str:
        facts = read_policy(host, settings.guard, settings.agent.state_dir)
        check = next(c for c in assess(healthy(policy=facts)).checks if c.name == "policy")
        assert check.state == "ok"
        return check.summary

    explain = ("policy", "explain", "--root", str(site.root), "--config", str(site.config))
    assert "rollout" not in row() and "rollout" not in run(*explain)[1]
    BundleInstaller(host, settings.guard, settings.agent.state_dir).record_rollout(WAITING)
    assert row().endswith(f"; {WAITING}") and "serial 1" in row()
    code, out, _ = run(*explain)
    assert out.splitlines()[1] == f"staged rollout: {WAITING}"
    assert json.loads(run(*explain, "--json")[1])["rollout"] == WAITING


def test_an_admitted_hosts_handoff_names_the_rollout(fake_hub: FakeHub, tmp_path: Path) -> None:
    """The fetch child installs the bundle a rollout admitted this host to: the hold's reason is "rollout R stage
    0" and the NFD labels say maintenance=true with the rollout id."""
    from agent.config import load_settings
    from agent.daemon_jobs.children import PolicyFetchInChild
    from tests.daemon.test_jobs import make_runtime

    features = "etc/kubernetes/node-feature-discovery/features.d"
    site = Site(tmp_path)
    token = tmp_path / "host.token"
    token.write_text("secret-host-token\n")
    os.chmod(token, 0o600)
    site.config.write_text(site.config.read_text() + f'[report]\nendpoint_url = "{fake_hub.url}"\n'
                                                     f'token_file = "{token}"\n'
                                                     f'nfd_features_file = "/{features}/gpuguard"\n'
                                                     '[integrations]\nscheduler = "kubernetes"\n')
    (site.root / features).mkdir(parents=True)
    admitted = "rollout r2-1a2b3c: admitted at stage 0"
    fake_hub.answers.append((200, {"ETag": '"bundle-2"', "X-Gpuguard-Rollout": admitted},
                             offer_body(site.bundle(2, POLICY), 2, admitted)))
    rt = make_runtime(tmp_path, Host.for_root(str(site.root)), load_settings(str(site.config)))
    asked: List[str] = []
    PolicyFetchInChild(rt, str(site.config), asked.append).run()
    assert asked == ["policy_bundle_installed"]
    assert json.loads((site.state / "maintenance.json").read_text())["reason"] == "rollout r2-1a2b3c stage 0"
    labels = (site.root / features / "gpuguard-maintenance").read_text().splitlines()
    assert labels[:3] == ["gpuguard.io/maintenance=true", "gpuguard.io/maintenance-reason=rollout_r2-1a2b3c_stage_0",
                          "gpuguard.io/maintenance-rollout=r2-1a2b3c"]
    assert read_bundle_state(str(site.state / "policy-bundle/state.json")).rollout == admitted
