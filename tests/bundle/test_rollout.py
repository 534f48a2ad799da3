"""The hub's staged rollout on the agent: the typed fields (rollout_id, state, admitted_stage) checked strictly and
kept in the bundle state, deciding the maintenance hand-off; the notice made one bounded printable line, kept by the
policy fetch (a missing notice clears it) and shown by the apt hook's refusal, deciding nothing."""

from __future__ import annotations

import base64
import http.server
import json
import os
import threading
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Tuple

import pytest

from agent.bundle.rollout import clean_notice
from agent.bundle.rollout_fields import RolloutFields, handoff_reason, read_rollout_fields, rollout_fields_of_headers
from agent.bundle.state import read_bundle_state
from agent.config import parse_settings
from agent.daemon_jobs.policy_fetch import fetch_and_install
from agent.guard.hotpath import decision as exits
from agent.host import Host
from agent.wire import MAX_NOTICE_CHARS
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


@pytest.mark.parametrize(("fields", "reason"), [
    (RolloutFields("r43-1a2b3c", "running", 2), "rollout r43-1a2b3c stage 2"),
    (RolloutFields("r43-1a2b3c", "paused", 0), "rollout r43-1a2b3c stage 0"),
    (RolloutFields("r43-1a2b3c", "running", None), "policy bundle serial 7"),
    (None, "policy bundle serial 7"),
])
def test_the_handoff_reason_names_an_admitting_rollout(fields: Optional[RolloutFields], reason: str) -> None:
    """Only fields that say this host was admitted name the rollout and stage; anything else names the serial."""
    assert handoff_reason(fields, 7) == reason


@pytest.mark.parametrize(("rollout_id", "state", "stage"), [
    ("r43-1a2b3c", "running", 0), ("r43-1a2b3c", "halted", None), ("A.b_c-9" * 9 + "x", "paused", 100),
])
def test_well_formed_rollout_fields_are_believed(rollout_id: str, state: str, stage: Optional[int]) -> None:
    """An id of A-Za-z0-9._- up to 64 characters, an offered state and a stage in 0..100 make the record."""
    fields = read_rollout_fields(rollout_id, state, stage)
    assert fields == RolloutFields(rollout_id, state, stage) and (fields.admitted == (stage is not None))


HOSTILE_FIELDS = [
    ("r43 stage 2", "running", 0), ("r43\n", "running", 0), ("", "running", 0), ("r" * 65, "running", 0),
    ("r43/../x", "running", 0), ("r4\u0663", "running", 0), (43, "running", 0), ("r43", "done", 0),
    ("r43", "RUNNING", 0), ("r43", ["running"], 0), ("r43", "running", -1), ("r43", "running", 101),
    ("r43", "running", True), ("r43", "running", 2.0), ("r43", "running", "2"), (None, "running", 0),
    ("r43", None, 0), (None, None, 3),
]


@pytest.mark.parametrize(("rollout_id", "state", "stage"), HOSTILE_FIELDS)
def test_hostile_rollout_fields_are_refused(rollout_id: object, state: object, stage: object) -> None:
    """A wrong charset, length, type, state or stage range (or an id without a state) is a ValueError, never a
    record; no fields at all is no rollout."""
    with pytest.raises(ValueError):
        read_rollout_fields(rollout_id, state, stage)
    assert read_rollout_fields(None, None, None) is None


@pytest.mark.parametrize(("headers", "expected"), [
    ({"X-Gpuguard-Rollout-Id": "r2-ab", "X-Gpuguard-Rollout-State": "running",
      "X-Gpuguard-Rollout-Admitted-Stage": "1"}, RolloutFields("r2-ab", "running", 1)),
    ({"X-Gpuguard-Rollout-Id": "r2-ab", "X-Gpuguard-Rollout-State": "paused"}, RolloutFields("r2-ab", "paused")),
    ({"X-Gpuguard-Rollout-Id": "r2-ab", "X-Gpuguard-Rollout-State": "running",
      "X-Gpuguard-Rollout-Admitted-Stage": "+1"}, None),
    ({"X-Gpuguard-Rollout-Id": "r2-ab", "X-Gpuguard-Rollout-State": "running",
      "X-Gpuguard-Rollout-Admitted-Stage": "\u0661"}, None),
    ({"X-Gpuguard-Rollout-Id": "r2 ab", "X-Gpuguard-Rollout-State": "running",
      "X-Gpuguard-Rollout-Admitted-Stage": "1"}, None),
    ({"X-Gpuguard-Rollout": "rollout r2-ab: admitted at stage 1"}, None),
    ({}, None),
])
def test_the_headers_fields_are_believed_only_when_well_formed(headers: Dict[str, str],
                                                                expected: Optional[RolloutFields]) -> None:
    """The X-Gpuguard-Rollout-* headers make the record; a malformed one is ignored (None), and the notice header
    alone, even one saying "admitted", admits nothing."""
    assert rollout_fields_of_headers(headers) == expected


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


def offer_body(bundle: Path, serial: int, notice: Optional[str], **fields: object) -> bytes:
    """The hub's 200 body for a signed bundle file, with the rollout notice and the typed fields given."""
    return json.dumps({"serial": serial, "bundle": base64.b64encode(bundle.read_bytes()).decode(),
                       "signature": base64.b64encode(bundle.with_name(bundle.name + ".sig").read_bytes()).decode(),
                       "rollout": notice, **fields}).encode()


def _hub_site(fake_hub: FakeHub, tmp_path: Path, config: str = "") -> Site:
    """A host that fetches from the fake hub with its token; ``config`` follows its ``[report]`` lines."""
    site = Site(tmp_path)
    token = tmp_path / "host.token"
    token.write_text("secret-host-token\n")
    os.chmod(token, 0o600)
    site.config.write_text(site.config.read_text() + f'[report]\nendpoint_url = "{fake_hub.url}"\n'
                                                     f'token_file = "{token}"\n' + config)
    return site


def test_the_fetch_keeps_the_newest_notice_and_the_hook_shows_it(fake_hub: FakeHub, tmp_path: Path) -> None:
    """200 with a notice -> installed and kept; the hook's refusal adds the line; 304 with another notice replaces
    it (escaped); a failed fetch keeps it; 304 without one clears it and the refusal no longer has the line."""
    site = _hub_site(fake_hub, tmp_path)
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


FEATURES = "etc/kubernetes/node-feature-discovery/features.d"


def _kubernetes_site(fake_hub: FakeHub, tmp_path: Path) -> Site:
    """A host that fetches from the fake hub and labels its Kubernetes node through NFD's features file."""
    site = _hub_site(fake_hub, tmp_path, f'nfd_features_file = "/{FEATURES}/gpuguard"\n'
                                         '[integrations]\nscheduler = "kubernetes"\n')
    (site.root / FEATURES).mkdir(parents=True)
    return site


def _fetch_in_child(site: Site, tmp_path: Path) -> List[str]:
    """What the policy fetch child, run once for ``site``, asked the daemon to do."""
    from agent.config import load_settings
    from agent.daemon_jobs.children import PolicyFetchInChild
    from tests.daemon.test_jobs import make_runtime

    rt = make_runtime(tmp_path, Host.for_root(str(site.root)), load_settings(str(site.config)))
    asked: List[str] = []
    PolicyFetchInChild(rt, str(site.config), asked.append).run()
    return asked


def test_an_admitted_hosts_handoff_names_the_rollout(fake_hub: FakeHub, tmp_path: Path) -> None:
    """The fetch child installs the bundle a rollout admitted this host to: the hold's reason is "rollout R stage
    0" and the NFD labels say maintenance=true with the rollout id."""
    site = _kubernetes_site(fake_hub, tmp_path)
    admitted = "rollout r2-1a2b3c: admitted at stage 0"
    fake_hub.answers.append((200, {"ETag": '"bundle-2"', "X-Gpuguard-Rollout": admitted},
                             offer_body(site.bundle(2, POLICY), 2, admitted, rollout_id="r2-1a2b3c", state="running",
                                        admitted_stage=0)))
    assert _fetch_in_child(site, tmp_path) == ["policy_bundle_installed"]
    hold = json.loads((site.state / "maintenance.json").read_text())
    assert (hold["reason"], hold["rollout_id"]) == ("rollout r2-1a2b3c stage 0", "r2-1a2b3c")
    labels = (site.root / FEATURES / "gpuguard-maintenance").read_text().splitlines()
    assert labels[:3] == ["gpuguard.io/maintenance=true", "gpuguard.io/maintenance-reason=rollout_r2-1a2b3c_stage_0",
                          "gpuguard.io/maintenance-rollout=r2-1a2b3c"]
    state = read_bundle_state(str(site.state / "policy-bundle/state.json"))
    assert state.rollout == admitted and state.rollout_fields == RolloutFields("r2-1a2b3c", "running", 0)



def test_the_fetch_keeps_the_typed_fields_and_refuses_hostile_ones(fake_hub: FakeHub, tmp_path: Path) -> None:
    """200 with well-formed fields keeps them in the bundle state; a 304's headers replace them; a body with a
    hostile stage is a failed fetch (nothing installed, the fields before stand); hostile headers on a 304 are
    ignored (no rollout kept), and a 304 without any clears them."""
    site = _hub_site(fake_hub, tmp_path)
    settings = parse_settings(site.config.read_text())
    host = Host.for_root(str(site.root))
    state_file = str(site.state / "policy-bundle/state.json")

    fake_hub.answers.append((200, {"ETag": '"bundle-1"'}, offer_body(
        site.bundle(1, POLICY), 1, WAITING, rollout_id="r2-1a2b3c", state="running", admitted_stage=None)))
    result = fetch_and_install(host, settings, "node-1")
    assert (result.outcome, result.rollout_fields) == ("installed", RolloutFields("r2-1a2b3c", "running"))
    assert read_bundle_state(state_file).rollout_fields == RolloutFields("r2-1a2b3c", "running")

    fake_hub.answers.append((304, {"ETag": '"bundle-1"', "X-Gpuguard-Rollout-Id": "r2-1a2b3c",
                                   "X-Gpuguard-Rollout-State": "paused"}, b""))
    assert fetch_and_install(host, settings, "node-1").outcome == "unchanged"
    assert read_bundle_state(state_file).rollout_fields == RolloutFields("r2-1a2b3c", "paused")

    fake_hub.answers.append((200, {"ETag": '"bundle-2"'}, offer_body(
        site.bundle(2, POLICY), 2, None, rollout_id="r2-1a2b3c", state="running", admitted_stage=1000)))
    result = fetch_and_install(host, settings, "node-1")
    assert result.outcome == "failed" and "admitted_stage" in result.detail
    state = read_bundle_state(state_file)
    assert state.serial == 1 and state.rollout_fields == RolloutFields("r2-1a2b3c", "paused")

    fake_hub.answers.append((304, {"ETag": '"bundle-1"', "X-Gpuguard-Rollout-Id": "r2 stage 1",
                                   "X-Gpuguard-Rollout-State": "running",
                                   "X-Gpuguard-Rollout-Admitted-Stage": "1"}, b""))
    result = fetch_and_install(host, settings, "node-1")
    assert result.outcome == "unchanged" and result.rollout_fields is None
    assert read_bundle_state(state_file).rollout_fields is None


def test_a_state_file_from_before_the_fields_loads_and_a_damaged_field_is_named(tmp_path: Path) -> None:
    """A bundle state written before rollout_fields existed loads with none (no rollout); one whose kept fields
    are malformed is an InputFileError naming the field, never a traceback or a believed rollout."""
    from agent.errors import InputFileError

    path = tmp_path / "state.json"
    path.write_text(json.dumps({"serial": 3, "source": "hub", "rollout": "rollout r3-aa: admitted at stage 1",
                                "rollout_at": "2026-01-01T00:00:00+00:00"}))
    state = read_bundle_state(str(path))
    assert state.serial == 3 and state.rollout_fields is None
    path.write_text(json.dumps({"serial": 3, "rollout_fields": {"rollout_id": "r3 stage 1", "state": "running",
                                                                "admitted_stage": 1}}))
    with pytest.raises(InputFileError, match="rollout_fields"):
        read_bundle_state(str(path))


def test_a_notice_that_says_admitted_without_the_fields_begins_no_handoff(fake_hub: FakeHub, tmp_path: Path) -> None:
    """The notice is display text: a 200 whose notice reads "admitted at stage 0" but whose fields say nothing
    (or say held back) installs the bundle and writes no maintenance hold."""
    site = _kubernetes_site(fake_hub, tmp_path)
    forged = "rollout r2-1a2b3c: admitted at stage 0"
    fake_hub.answers.append((200, {"ETag": '"bundle-2"', "X-Gpuguard-Rollout": forged},
                             offer_body(site.bundle(2, POLICY), 2, forged, rollout_id="r2-1a2b3c", state="running")))
    assert _fetch_in_child(site, tmp_path) == ["policy_bundle_installed"]
    assert not (site.state / "maintenance.json").exists()
    assert not (site.root / FEATURES / "gpuguard-maintenance").exists()
