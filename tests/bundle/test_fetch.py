"""The daemon's policy fetch against a real hub on 127.0.0.1: a pushed bundle is installed, an unchanged one costs
a 304, a bad one is refused (recorded for the heartbeat), and a hub outage changes nothing on the host."""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path
from typing import Any, List, Tuple

import pytest

from agent.bundle.fetch import fetch_offer, parse_offer
from agent.bundle.state import read_bundle_state
from agent.config import parse_settings
from agent.daemon_jobs.policy_fetch import fetch_and_install
from agent.host import Host
from agent.hub.tokens import add_token
from tests.bundle.keys import Signer
from tests.bundle.test_install import PERMISSIVE, POLICY, Site, run
from tests.hub.process import HubProcess
from tests.hub.test_cli_hub_policy import hub  # noqa: F401 - the real hub fixture

pytestmark = pytest.mark.slow  # a real hub process


@pytest.mark.parametrize(("body", "problem"), [
    (b"[]", "not a JSON object"),
    (b'{"serial": 0, "bundle": "", "signature": ""}', r"serial: not a whole number in 1\.\."),
    (b'{"serial": true, "bundle": "", "signature": ""}', r"serial: not a whole number in 1\.\."),
    (b'{"serial": 18446744073709551616, "bundle": "", "signature": ""}', r"serial: not a whole number in 1\.\."),
    (b'{"serial": 1, "serial": 2, "bundle": "", "signature": ""}', "duplicate key 'serial'"),
    (b'{"serial": 1, "bundle": "!!", "signature": ""}', "bundle: not base64"),
    (b'{"serial": 1, "bundle": "", "signature": 3}', "signature: not a string"),
    (b"\xff", "not JSON"),
])
def test_a_malformed_offer_is_one_line(body: bytes, problem: str) -> None:
    """What is not the contract's 200 body is refused with one line naming the field."""
    with pytest.raises(ValueError, match=problem):
        parse_offer(body)


def test_an_offer_decodes() -> None:
    """The contract's body gives the serial and the bundle and signature bytes."""
    body = json.dumps({"serial": 7, "bundle": base64.b64encode(b"B").decode(),
                       "signature": base64.b64encode(b"S").decode()}).encode()
    assert parse_offer(body) == (7, b"B", b"S")


def token(hub: HubProcess, tmp_path: Path, role: str, subject: str) -> Path:  # noqa: F811
    """A token of ``role`` for ``subject`` in a 0600 file."""
    path = tmp_path / f"{role}-{subject}.token"
    path.write_text(add_token(str(hub.tokens_file), role, subject) + "\n")  # type: ignore[arg-type, attr-defined]
    os.chmod(path, 0o600)
    return path


def hub_site(hub: HubProcess, tmp_path: Path) -> Tuple[Site, Path, Path]:  # noqa: F811
    """A Site whose agent reports to ``hub`` as node-1: the site, its host token file and an admin token file."""
    site = Site(tmp_path)
    site.signer.export(hub.keys_dir / "site.gpg")  # type: ignore[attr-defined]  # the hub trusts the site's key
    host_token = token(hub, tmp_path, "host", "node-1")
    admin = token(hub, tmp_path, "admin", "alice")
    site.config.write_text(site.config.read_text() + f'[report]\nendpoint_url = "{hub.url}"\n'
                                                     f'token_file = "{host_token}"\n')
    return site, host_token, admin


def test_fetch_installs_then_304_then_refuses_then_survives_an_outage(hub: HubProcess,  # noqa: F811
                                                                      tmp_path: Path) -> None:
    """Push 1 -> installed and enforced; again -> unchanged (304); push 2 by an unknown key -> refused and recorded,
    1 still in force; hub stopped -> failed, nothing changed."""
    site, host_token, admin = hub_site(hub, tmp_path)
    settings = parse_settings(site.config.read_text())
    host = Host.for_root(str(site.root))
    assert fetch_and_install(host, settings, "node-1").outcome == "none"  # 204: nothing pushed yet

    first = site.bundle(1, POLICY)
    code, out, err = run("hub", "policy", "push", str(first), "--hub", hub.url, "--token-file", str(admin))
    assert code == 0, out + err
    result = fetch_and_install(host, settings, "node-1")
    assert (result.outcome, result.serial, result.detail) == ("installed", 1, "compiled")
    assert site.hook_refuses()
    state = read_bundle_state(str(site.state / "policy-bundle/state.json"))
    assert (state.serial, state.source, state.fingerprint) == (1, "hub", site.signer.fingerprint)
    offer = fetch_offer(hub.url, host_token.read_text().strip(), None, 1, (3.0, 3.0))
    assert offer.status == "unchanged"
    assert fetch_and_install(host, settings, "node-1").outcome == "unchanged"

    stranger = Signer(tmp_path, "mallory")
    stranger.export(hub.keys_dir / "mallory.gpg")  # type: ignore[attr-defined]  # the hub's keys, not the host's
    second = site.bundle(2, PERMISSIVE, sign=False)
    stranger.sign(second)
    assert run("hub", "policy", "push", str(second), "--hub", hub.url, "--token-file", str(admin))[0] == 0
    before = site.compiled.read_bytes()
    result = fetch_and_install(host, settings, "node-1")
    assert (result.outcome, result.serial, result.kind) == ("refused", None, "signature")  # the claim: not kept
    assert "which no trusted keyring holds" in result.detail
    assert site.compiled.read_bytes() == before and site.hook_refuses()
    state = read_bundle_state(str(site.state / "policy-bundle/state.json"))
    assert state.serial == 1 and state.refusal_pending and state.refused is not None
    assert (state.refused.serial, state.refused.kind) == (None, "signature")

    hub.stop()
    result = fetch_and_install(host, settings, "node-1")
    assert result.outcome == "failed" and "ConnectionError" in result.detail
    assert site.compiled.read_bytes() == before and site.hook_refuses()
    assert read_bundle_state(str(site.state / "policy-bundle/state.json")).serial == 1


def test_a_host_outside_the_scope_is_offered_nothing(hub: HubProcess, tmp_path: Path) -> None:  # noqa: F811
    """A bundle for another host id is not offered (204): the host keeps what it has and records no refusal."""
    site, host_token, admin = hub_site(hub, tmp_path)
    bundle = site.bundle(1, PERMISSIVE, "--host-id", "node-2")
    assert run("hub", "policy", "push", str(bundle), "--hub", hub.url, "--token-file", str(admin))[0] == 0
    settings = parse_settings(site.config.read_text())
    assert fetch_and_install(Host.for_root(str(site.root)), settings, "node-1").outcome == "none"
    assert not (site.state / "policy-bundle/state.json").exists()


def test_the_daemon_fetches_in_a_job_child(hub: HubProcess, tmp_path: Path) -> None:  # noqa: F811
    """PolicyFetchInChild runs ``gpuguard _job policy_fetch``: the pushed bundle is installed under the host root
    and the guard check and heartbeat are asked to run."""
    from agent.config import load_settings
    from agent.daemon_jobs.children import PolicyFetchInChild
    from tests.daemon.test_jobs import make_runtime

    site, host_token, admin = hub_site(hub, tmp_path)
    bundle = site.bundle(3, POLICY, "--host-id", "node-1")
    assert run("hub", "policy", "push", str(bundle), "--hub", hub.url, "--token-file", str(admin))[0] == 0
    host = Host.for_root(str(site.root))
    rt = make_runtime(tmp_path, host, load_settings(str(site.config)))
    asked: List[str] = []
    PolicyFetchInChild(rt, str(site.config), asked.append).run()
    assert asked == ["policy_bundle_installed"]
    assert read_bundle_state(str(site.state / "policy-bundle/state.json")).serial == 3 and site.hook_refuses()
    PolicyFetchInChild(rt, str(site.config), asked.append).run()
    assert asked == ["policy_bundle_installed"]  # 304: nothing to do


def test_an_older_offer_after_a_withdrawal_is_not_a_refusal(hub: HubProcess, tmp_path: Path) -> None:  # noqa: F811
    """Serial 2 installed then withdrawn: the hub offers 1 again, which the host keeps out without gpgv, without a
    refusal in its state and without asking the guard and heartbeat to run, at every interval."""
    from agent.config import load_settings
    from agent.daemon_jobs.children import PolicyFetchInChild
    from tests.daemon.test_jobs import make_runtime

    site, _, admin = hub_site(hub, tmp_path)
    for serial in (1, 2):
        bundle = site.bundle(serial, POLICY if serial == 2 else PERMISSIVE)
        assert run("hub", "policy", "push", str(bundle), "--hub", hub.url, "--token-file", str(admin))[0] == 0
    host = Host.for_root(str(site.root))
    rt = make_runtime(tmp_path, host, load_settings(str(site.config)))
    asked: List[str] = []
    PolicyFetchInChild(rt, str(site.config), asked.append, in_child=False).run()
    assert asked == ["policy_bundle_installed"]
    assert run("hub", "policy", "withdraw", "2", "--hub", hub.url, "--token-file", str(admin))[0] == 0
    result = fetch_and_install(host, parse_settings(site.config.read_text()), "node-1")
    assert (result.outcome, result.serial) == ("unchanged", 2)
    assert result.detail == "the hub offers serial 1, below serial 2 in force"
    PolicyFetchInChild(rt, str(site.config), asked.append, in_child=False).run()
    assert asked == ["policy_bundle_installed"]
    state = read_bundle_state(str(site.state / "policy-bundle/state.json"))
    assert (state.serial, state.refused) == (2, None) and site.hook_refuses()


def policy_check(site: Site) -> Any:
    """``gpuguard status``'s policy check for the site, as assess makes it."""
    from agent.status.assess import assess
    from agent.status.facts import read_policy
    from tests.status.test_assess import healthy

    facts = read_policy(Host.for_root(str(site.root)), parse_settings(site.config.read_text()).guard,
                        "/var/lib/gpuguard")
    return next(c for c in assess(healthy(policy=facts)).checks if c.name == "policy")


def test_a_host_above_every_serial_the_hub_offers_is_attention(hub: HubProcess, tmp_path: Path) -> None:  # noqa: F811
    """A host that took serial 2**63-1 (a fast-forward by a trusted key) while the hub offers 5: status warns that
    the serial in force is above every serial offered, since the first such answer; a 304 for the serial in force
    does not."""

    site, host_token, admin = hub_site(hub, tmp_path)
    settings = parse_settings(site.config.read_text())
    host = Host.for_root(str(site.root))
    pushed = site.bundle(5, POLICY)
    assert run("hub", "policy", "push", str(pushed), "--hub", hub.url, "--token-file", str(admin))[0] == 0
    assert fetch_and_install(host, settings, "node-1").outcome == "installed"
    assert fetch_and_install(host, settings, "node-1").outcome == "unchanged"  # 304
    assert policy_check(site).state == "ok"

    assert site.install(site.bundle(2**63 - 1, POLICY))[0] == 0  # the fast-forward, signed by a trusted key
    result = fetch_and_install(host, settings, "node-1")
    assert (result.outcome, result.serial) == ("unchanged", 2**63 - 1)
    state = read_bundle_state(str(site.state / "policy-bundle/state.json"))
    assert state.hub_below is not None and state.hub_below.offered_serial == 5
    first = state.hub_below.since
    fetch_and_install(host, settings, "node-1")
    again = read_bundle_state(str(site.state / "policy-bundle/state.json")).hub_below
    assert again is not None and again.since == first
    check: Any = policy_check(site)
    assert check.state == "warn" and "above every serial the hub offers (serial 5 since " in check.summary, check
