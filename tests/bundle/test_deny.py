"""Known-bad versions (issue 43): a deny list signed by the fleet-wide policy role, placed on (or pushed to) a real
hub, taken at the host's next fetch whatever a rollout holds back, refused by the apt hook, flagged where already
installed, written as native pins; a deny list with bad signatures, a role for other hosts or a lower serial is
refused with its kind and changes nothing, at the hub's push and at the host; a list the hub holds back is named
by its freshness statement; ``policy deny install`` takes one without a hub."""

from __future__ import annotations

import base64
import datetime as dt
import json
from pathlib import Path
from typing import Any, Dict, Iterator, List, Tuple

import pytest
import requests

from agent.bundle.deny import DENY_FORMAT, DenyList, parse_deny, render_deny
from agent.bundle.freshness import make_statement, parse_statement, render_statement
from agent.bundle.state import read_bundle_state
from agent.errors import BundleRefused
from agent.guard.hotpath import decision as exits
from agent.guard.pin_records import pin_records
from agent.host import Host
from agent.hub.tokens import add_token
from agent.policy.compiled import read_compiled
from agent.report.events import Heartbeat
from agent.status.assess import assess
from agent.status.facts import read_policy
from agent.wire import DENY_PATH
from tests.bundle.keys import Signer
from tests.bundle.roots import sign_by
from tests.bundle.test_attacks import Fleet, fixed
from tests.bundle.test_install import POLICY, Site, run
from tests.bundle.test_roles import Trust
from tests.guard.apt.test_hook import HEAD, line, run_hook
from tests.hub.factories import batch_json, event
from tests.status.test_assess import healthy

pytestmark = pytest.mark.slow  # a real hub process

VIM_BAD = {"id": "vim-crash", "packages": ["vim"], "versions": ">= 2:9.0.1378-3, << 2:9.0.1378-5",
           "reason": "crashes on start", "source_url": "https://example.org/advisories/vim-1378-3",
           "added": "2026-12-01"}
TO_VIM_3 = HEAD + line("vim", "2:9.0.1378-2", "2:9.0.1378-3")
TO_VIM_5 = HEAD + line("vim", "2:9.0.1378-2", "2:9.0.1378-5")


def hello_bad(version: str) -> Dict[str, Any]:
    """The deny entry ``hello-bad``: hello-fake VERSION, with its reason and advisory."""
    return {"id": "hello-bad", "packages": ["hello-fake"], "versions": f"= {version}", "reason": "corrupts output",
            "source_url": f"https://example.org/advisories/hello-{version}", "added": "2026-12-03"}


def amdgpu_recall(version: str) -> Dict[str, Any]:
    """The deny entry ``amdgpu-recall``: the installed amdgpu-dkms build VERSION, which the state flags."""
    return {"id": "amdgpu-recall", "packages": ["amdgpu-dkms"], "versions": f"= {version}",
            "reason": "firmware hang under load", "source_url": "https://example.org/advisories/amdgpu-6.8.5",
            "added": "2026-12-02"}


def deny_document(serial: int, entries: List[Dict[str, Any]]) -> bytes:
    """The canonical bytes of a deny list."""
    return render_deny(DenyList.model_validate({"format": DENY_FORMAT, "serial": serial,
                                                "issued_at": "2026-12-05T00:00:00Z", "entries": entries}))


# amdgpu-dkms 1:6.8.5.60202-2041575 is installed on the Site (tests/guard/apt/test_hook.py STATUS).
AMDGPU_RECALL = amdgpu_recall("1:6.8.5.60202-2041575")


def dated_list(serial: int, package: str, version: str, date: str) -> bytes:
    """A deny list with no entries that dates one version (the date bake time counts from)."""
    return render_deny(DenyList.model_validate({
        "format": DENY_FORMAT, "serial": serial, "issued_at": "2026-12-05T00:00:00Z",
        "published": [{"package": package, "version": version, "date": date}]}))


def place(directory: Path, data: bytes, signers: List[Any]) -> Path:
    """Put ``data`` as deny.json in the hub's roots directory, signed by each of ``signers``."""
    path = directory / "deny.json"
    path.write_bytes(data)
    sign_by(path, signers)
    return path


def signed(directory: Path, data: bytes, signers: List[Any], name: str = "deny-made.json") -> Tuple[Path, bytes]:
    """``data`` written as ``name`` in ``directory`` with its signatures by each of ``signers`` beside it: (the
    file, the signatures)."""
    path = directory / name
    path.write_bytes(data)
    return path, sign_by(path, signers).read_bytes()


def serve_through_middle(fleet: Fleet, data: bytes, signature: bytes) -> None:
    """The host's deny list request answered with ``data`` and ``signature`` (a hub broken into: the real hub
    serves only what verifies)."""
    body = json.dumps({"deny": base64.b64encode(data).decode(), "signature": base64.b64encode(signature).decode()})
    fleet.middle.answers[DENY_PATH] = fixed(200, body.encode())


def push_deny(fleet: Fleet, path: Path) -> Tuple[int, str, str]:
    """``gpuguard hub deny push PATH`` (signatures at PATH.sig) with the admin token."""
    return run("hub", "deny", "push", str(path), "--hub", fleet.hub.url, "--token-file", str(fleet.admin))


def audit_actions(fleet: Fleet) -> List[Tuple[str, str]]:
    """The hub's audit trail as (action, detail), newest first."""
    answer = requests.get(f"{fleet.hub.url}/v1/audit", timeout=10,
                          headers={"Authorization": f"Bearer {fleet.admin.read_text().strip()}"})
    assert answer.status_code == 200, answer.text
    return [(entry["action"], entry["detail"]) for entry in answer.json()["entries"]]


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Fleet]:
    """Root version 1 trusted; serial 1 (fleet role, 2-of-2) pushed, fetched and in force; no deny list yet."""
    trust = Trust(tmp_path)
    made = Fleet(tmp_path, trust)
    try:
        made.push(trust.bundle(1, [trust.p1, trust.p2]))
        assert made.fetch().outcome == "installed"
        yield made
    finally:
        made.close()


def test_a_deny_list_from_the_hub_is_refused_by_the_hook_and_flags_a_host_already_on_it(fleet: Fleet) -> None:
    """Placed on the hub, the list is taken at the next fetch (no new bundle, no rollout): the hook refuses vim
    2:9.0.1378-3 naming the entry, its reason and source, lets -5 through; the installed amdgpu-dkms it denies is
    attention in the state (the heartbeat's ``denied`` word) and in status."""
    trust = fleet.trust
    assert run_hook(fleet.site.root, TO_VIM_3)[0] == exits.EXIT_ALLOW
    place(fleet.hub_roots, deny_document(1, [VIM_BAD, AMDGPU_RECALL]), [trust.p1, trust.p2])
    result = fleet.fetch()
    assert (result.outcome, result.trust) == ("unchanged", ""), result
    code, out = run_hook(fleet.site.root, TO_VIM_3)
    assert code == exits.EXIT_REFUSED, out
    assert ("REFUSED (denied.vim-crash): vim 2:9.0.1378-2 -> 2:9.0.1378-3: vim 2:9.0.1378-3 is a known-bad version: "
            "deny entry 'vim-crash' (deny list serial 1, added 2026-12-01): crashes on start "
            "(https://example.org/advisories/vim-1378-3)") in out
    assert "the host already violates the policy (denied.amdgpu-recall)" in out
    assert run_hook(fleet.site.root, TO_VIM_5)[0] == exits.EXIT_ALLOW
    assert fleet.site.hook_refuses()  # the bundle's own rules still hold
    state = fleet.state()
    assert state.deny_serial == 1 and state.deny_refused is None
    assert state.denied_installed == ("amdgpu-dkms 1:6.8.5.60202-2041575: denied.amdgpu-recall",)
    now = dt.datetime.now(dt.timezone.utc)
    assert state.attention(now) == ("denied",)
    facts = read_policy(Host.for_root(str(fleet.site.root)), fleet.settings.guard, "/var/lib/gpuguard")
    check = next(c for c in assess(healthy(policy=facts), now).checks if c.name == "policy")
    assert check.state == "warn" and "known-bad version installed (deny list serial 1): amdgpu-dkms" in check.summary


def test_a_recompile_keeps_the_deny_list_and_pins_keep_the_denied_builds_out(fleet: Fleet) -> None:
    """A new bundle compiled after the list was taken still carries its entries; the pin records keep the denied
    builds out (priority -1, apt preferences and dnf/zypper excludes alike), never the installed build."""
    trust = fleet.trust
    place(fleet.hub_roots, deny_document(1, [VIM_BAD]), [trust.p1, trust.p2])
    assert fleet.fetch().trust == ""
    fleet.push(trust.bundle(2, [trust.p1, trust.p2]))
    assert fleet.fetch().outcome == "installed"
    policy = read_compiled(str(fleet.site.compiled))
    assert [entry["id"] for entry in policy.rules("denied")] == ["vim-crash"] and "vim" in policy.guarded
    assert run_hook(fleet.site.root, TO_VIM_3)[0] == exits.EXIT_REFUSED
    _, forbidden = pin_records(policy, {"vim": "2:9.0.1378-2"},
                               {"vim": ["2:9.0.1378-2", "2:9.0.1378-3", "2:9.0.1378-4", "2:9.0.1378-5"]},
                               context=None)
    assert [(pin.version, pin.priority) for pin in forbidden] == [("2:9.0.1378-3", -1), ("2:9.0.1378-4", -1)]
    assert forbidden[0].why.startswith("known-bad: deny entry 'vim-crash'")


@pytest.mark.parametrize("attack,kind", [("1-of-2", "threshold"), ("another scope", "scope"),
                                         ("other bytes", "signature"), ("lower serial", "rollback"),
                                         ("same serial, other entries", "rollback")])
def test_a_bad_deny_list_is_refused_with_its_kind_and_changes_nothing(fleet: Fleet, attack: str, kind: str) -> None:
    """Serial 2 in force; served by a hub broken into: one key of the two the fleet role needs (threshold), the key
    of a role for other hosts (scope), a well-signed list changed after signing (signature), serial 1 (rollback)
    and serial 2 with other entries (rollback): each refused with its kind in the fetch's line and the state; the
    compiled policy, the list in force and the hook's refusal stay."""
    trust = fleet.trust
    place(fleet.hub_roots, deny_document(2, [VIM_BAD]), [trust.p1, trust.p2])
    assert fleet.fetch().trust == ""
    compiled, in_force = fleet.site.compiled.read_bytes(), (fleet.site.state / "policy-bundle/deny.json").read_bytes()
    good = deny_document(3, [AMDGPU_RECALL])
    work = fleet.hub_roots.parent
    if attack == "1-of-2":
        data, signature = good, signed(work, good, [trust.p1])[1]
    elif attack == "another scope":
        data, signature = good, signed(work, good, [trust.p3])[1]
    elif attack == "other bytes":
        data, signature = deny_document(3, []), signed(work, good, [trust.p1, trust.p2])[1]
    elif attack == "lower serial":
        data = deny_document(1, [AMDGPU_RECALL])
        signature = signed(work, data, [trust.p1, trust.p2])[1]
    else:
        data = deny_document(2, [AMDGPU_RECALL])
        signature = signed(work, data, [trust.p1, trust.p2])[1]
    serve_through_middle(fleet, data, signature)
    result = fleet.fetch()
    assert result.trust.endswith(f"[{kind}]"), result.trust
    refused = fleet.state().deny_refused
    assert refused is not None and refused.kind == kind
    assert fleet.site.compiled.read_bytes() == compiled
    assert (fleet.site.state / "policy-bundle/deny.json").read_bytes() == in_force
    assert run_hook(fleet.site.root, TO_VIM_3)[0] == exits.EXIT_REFUSED
    assert fleet.state().denied_installed == ()


@pytest.mark.parametrize("change,problem", [
    (lambda d: d["entries"][0].update(versions="any"), "'any' would deny every version"),
    (lambda d: d["entries"][0].update(source_url="ftp://x"), "is not an http(s) URL"),
    (lambda d: d["entries"][0].update(added="yesterday"), "is not a day"),
    (lambda d: d["entries"][0].update(added="20261203"), "is not a day"),
    (lambda d: d.update(issued_at="2026-12-05 00:00"), "is not a UTC time"),
    (lambda d: d["entries"].append(dict(d["entries"][0])), "an id is used twice"),
    (lambda d: d.update(serial=2**63), "serial"),
])
def test_a_malformed_deny_list_is_refused_as_format_in_one_line(change: Any, problem: str) -> None:
    """Each malformed field is a format refusal naming it, never a traceback."""
    document = json.loads(deny_document(1, [VIM_BAD]))
    change(document)
    with pytest.raises(BundleRefused) as caught:
        parse_deny(json.dumps(document).encode(), "deny.json")
    assert caught.value.kind == "format" and problem in caught.value.reason and "\n" not in str(caught.value)


def test_a_deny_list_reaches_a_host_a_staged_rollout_holds_back(fleet: Fleet) -> None:
    """With a rollout of serial 2 running that has not admitted this host (it stays on serial 1), the deny list
    placed on the hub is taken at the next fetch all the same and the hook refuses the denied version."""
    trust = fleet.trust
    now = dt.datetime.now(dt.timezone.utc)
    for other in ("gpu-1", "gpu-2"):  # the hosts the rollout knows; node-1 has sent no heartbeat: never admitted
        token = add_token(str(fleet.admin.parent / "tokens.json"), "host", other)
        beat = event(other, at=now).model_copy(update={"payload": Heartbeat(
            agent_version="1.0", uptime_seconds=1.0, policy_serial=1, last_health_status="pass")})
        answer = requests.post(f"{fleet.hub.url}/v1/events", data=batch_json([beat]), timeout=10,
                               headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
        assert answer.status_code == 200, answer.text
    fleet.push(trust.bundle(2, [trust.p1, trust.p2]))
    code, out, err = run("hub", "rollout", "start", "2", "--batches", "50,100", "--soak-seconds", "0", "--hub",
                         fleet.hub.url, "--token-file", str(fleet.admin))
    assert code == 0, out + err
    place(fleet.hub_roots, deny_document(1, [VIM_BAD]), [trust.p1, trust.p2])
    result = fleet.fetch()
    assert (result.outcome, result.serial, result.trust) == ("unchanged", 1, ""), result
    assert fleet.state().serial == 1 and fleet.state().deny_serial == 1
    assert run_hook(fleet.site.root, TO_VIM_3)[0] == exits.EXIT_REFUSED


def test_a_damaged_deny_list_in_place_stops_a_compile_with_one_line(tmp_path: Path) -> None:
    """A deny.json in the state directory that no longer parses makes ``policy compile`` fail in one line naming
    the file (the compiled policy in place, with the list it was given, keeps guarding), never a traceback."""
    site = Site(tmp_path, source="local")
    policy = tmp_path / "policy.toml"
    policy.write_text(POLICY)
    (site.state / "policy-bundle").mkdir(parents=True)
    (site.state / "policy-bundle/deny.json").write_text('{"format": "gpuguard-deny/1", "serial": "seven"}')
    code, out, err = run("policy", "compile", "--policy", str(policy), "--root", str(site.root), "--config",
                         str(site.config))
    assert code != 0 and out == "" and len(err.splitlines()) == 1, err
    assert "policy-bundle/deny.json" in err and "serial" in err and "Traceback" not in err
    assert not site.compiled.exists()
    site.signer.close()


def test_the_freshness_statement_carries_the_deny_serial_only_when_there_is_one() -> None:
    """A statement of a hub with no deny list renders without the field (the bytes of 0.1.0); with one, the serial
    survives the round trip; a serial of 0 is a format refusal."""
    now = dt.datetime(2026, 12, 6, tzinfo=dt.timezone.utc)
    assert b"deny_serial" not in render_statement(make_statement([], [], now, 24))
    data = render_statement(make_statement([], [], now, 24, deny_serial=3))
    assert parse_statement(data, "statement").deny_serial == 3
    document = json.loads(data)
    document["deny_serial"] = 0
    with pytest.raises(BundleRefused) as caught:
        parse_statement(json.dumps(document).encode(), "statement")
    assert caught.value.kind == "format"


def test_a_deny_list_the_hub_holds_back_is_attention_until_the_host_has_it(fleet: Fleet) -> None:
    """Serial 1 in force; the hub's signed freshness statement names serial 2 while its deny answer is held back
    (204): the host asks for attention (the heartbeat's ``freshness`` word, status naming both serials) and keeps
    guarding with serial 1; once the list comes through, the attention ends."""
    trust = fleet.trust
    first, _ = signed(fleet.hub_roots.parent, deny_document(1, [VIM_BAD]), [trust.p1, trust.p2], "deny-1.json")
    assert push_deny(fleet, first)[0] == 0
    assert fleet.fetch().trust == ""
    now = dt.datetime.now(dt.timezone.utc)
    assert (fleet.state().deny_serial, fleet.state().freshness_deny_serial, fleet.state().attention(now)) == (1, 1, ())
    held = dict(VIM_BAD, id="vim-other", versions="= 2:9.0.1378-5")
    second, _ = signed(fleet.hub_roots.parent, deny_document(2, [VIM_BAD, held]), [trust.p1, trust.p2],
                       "deny-2.json")
    assert push_deny(fleet, second)[0] == 0
    fleet.middle.answers[DENY_PATH] = fixed(204)
    assert fleet.fetch().trust == ""
    state = fleet.state()
    assert (state.deny_serial, state.freshness_deny_serial, state.attention(now)) == (1, 2, ("freshness",))
    facts = read_policy(Host.for_root(str(fleet.site.root)), fleet.settings.guard, "/var/lib/gpuguard")
    check = next(c for c in assess(healthy(policy=facts), now).checks if c.name == "policy")
    assert check.state == "warn" and ("the hub's freshness statement names deny list serial 2, in force here: "
                                      "serial 1") in check.summary, check.summary
    assert run_hook(fleet.site.root, TO_VIM_3)[0] == exits.EXIT_REFUSED and run_hook(fleet.site.root, TO_VIM_5)[0] \
        == exits.EXIT_ALLOW
    del fleet.middle.answers[DENY_PATH]
    assert fleet.fetch().trust == ""
    state = fleet.state()
    assert (state.deny_serial, state.attention(now)) == (2, ())
    assert run_hook(fleet.site.root, TO_VIM_5)[0] == exits.EXIT_REFUSED


def test_an_operator_pushes_a_deny_list_through_the_hub_and_every_host_takes_it(fleet: Fleet) -> None:
    """``gpuguard hub deny push`` with a list the fleet role signed: stored beside the roots, audited with who
    vouched, taken at the host's next fetch; pushing the very same list again changes nothing."""
    trust = fleet.trust
    path, signature = signed(fleet.hub_roots.parent, deny_document(1, [VIM_BAD]), [trust.p1, trust.p2])
    code, out, err = push_deny(fleet, path)
    assert code == 0, out + err
    assert out.startswith("pushed deny list serial 1 (1 entries") and "policy role fleet of root version 1" in out
    assert (fleet.hub_roots / "deny.json").read_bytes() == path.read_bytes()
    assert (fleet.hub_roots / "deny.json.sig").read_bytes() == signature
    action, detail = audit_actions(fleet)[0]
    assert action == "deny_push" and "deny list serial 1" in detail and "policy role fleet" in detail
    assert fleet.fetch().trust == "" and fleet.state().deny_serial == 1
    assert run_hook(fleet.site.root, TO_VIM_3)[0] == exits.EXIT_REFUSED
    code, out, _ = push_deny(fleet, path)
    assert code == 0 and out.startswith("already in place: deny list serial 1")


@pytest.mark.parametrize("attack,answer", [("1-of-2", "(threshold)"), ("another scope", "(scope)"),
                                           ("other bytes", "(signature)"), ("lower serial", "not above serial 2"),
                                           ("not a deny list", "(format)")])
def test_the_hub_refuses_a_bad_deny_list_push_naming_why(fleet: Fleet, attack: str, answer: str) -> None:
    """Serial 2 in place; a push signed by one fleet key (threshold), by the key of a role for other hosts (scope),
    changed after signing (signature), of serial 1 (409), or of a file that is no deny list (format): refused in
    one line naming why, audited as refused, the list in place and what hosts get unchanged."""
    trust = fleet.trust
    work = fleet.hub_roots.parent
    in_place, _ = signed(work, deny_document(2, [VIM_BAD]), [trust.p1, trust.p2], "deny-2.json")
    assert push_deny(fleet, in_place)[0] == 0
    before = (fleet.hub_roots / "deny.json").read_bytes(), (fleet.hub_roots / "deny.json.sig").read_bytes()
    good = deny_document(3, [AMDGPU_RECALL])
    if attack == "1-of-2":
        path, _ = signed(work, good, [trust.p1])
    elif attack == "another scope":
        path, _ = signed(work, good, [trust.p3])
    elif attack == "other bytes":
        path, _ = signed(work, good, [trust.p1, trust.p2])
        path.write_bytes(deny_document(3, []))
    elif attack == "lower serial":
        path, _ = signed(work, deny_document(1, [AMDGPU_RECALL]), [trust.p1, trust.p2])
    else:
        path, _ = signed(work, b'{"format": "gpuguard-bundle/1"}\n', [trust.p1, trust.p2])
    code, out, err = push_deny(fleet, path)
    assert code != 0 and out == "" and len(err.splitlines()) == 1 and answer in err, err
    assert "Traceback" not in err
    action, detail = audit_actions(fleet)[0]
    assert action == "deny_push_refused" and answer in detail, detail
    assert ((fleet.hub_roots / "deny.json").read_bytes(), (fleet.hub_roots / "deny.json.sig").read_bytes()) == before
    assert fleet.fetch().trust == "" and fleet.state().deny_serial == 2


def test_a_list_placed_by_hand_that_does_not_verify_is_never_served(fleet: Fleet) -> None:
    """Serial 1 served; an operator copies a serial 2 signed by one fleet key into the roots directory: the hub
    keeps serving serial 1 (and names it in its freshness statement), so hosts see no refusal and no attention."""
    trust = fleet.trust
    place(fleet.hub_roots, deny_document(1, [VIM_BAD]), [trust.p1, trust.p2])
    assert fleet.fetch().trust == "" and fleet.state().deny_serial == 1
    place(fleet.hub_roots, deny_document(2, [AMDGPU_RECALL]), [trust.p1])
    assert fleet.fetch().trust == ""
    state = fleet.state()
    assert (state.deny_serial, state.freshness_deny_serial, state.deny_refused) == (1, 1, None)
    assert state.attention(dt.datetime.now(dt.timezone.utc)) == ()


def test_policy_deny_install_takes_a_deny_list_without_a_hub(tmp_path: Path) -> None:
    """On a host that trusts root version 1 and reports nowhere: ``policy deny install`` takes a list the fleet role
    signed (the hook refuses its version, the installed one it denies is flagged), again is a no-op, a lower serial
    or one fleet key is exit 17 in one line with its kind; a host trusting no root refuses it."""
    trust = Trust(tmp_path)
    site = trust.site
    assert site.install(trust.bundle(1, [trust.p1, trust.p2]))[0] == 0

    def install(path: Path) -> Tuple[int, str, str]:
        return run("policy", "deny", "install", str(path), "--signature", f"{path}.sig", "--root", str(site.root),
                   "--config", str(site.config))

    listed, _ = signed(tmp_path, deny_document(2, [VIM_BAD, AMDGPU_RECALL]), [trust.p1, trust.p2], "deny-2.json")
    code, out, err = install(listed)
    assert code == 0, out + err
    assert out == ("took deny list serial 2, 2 entries\nknown-bad version installed: amdgpu-dkms "
                   "1:6.8.5.60202-2041575: denied.amdgpu-recall\n")
    assert run_hook(site.root, TO_VIM_3)[0] == exits.EXIT_REFUSED
    state = read_bundle_state(str(site.state / "policy-bundle/state.json"))
    assert state.deny_serial == 2 and state.denied_installed == (
        "amdgpu-dkms 1:6.8.5.60202-2041575: denied.amdgpu-recall",)
    code, out, _ = install(listed)
    assert code == 0 and out.startswith("in force already (nothing changed): deny list serial 2")
    for data, signers, kind in ((deny_document(1, [VIM_BAD]), [trust.p1, trust.p2], "rollback"),
                                (deny_document(3, [VIM_BAD]), [trust.p1], "threshold")):
        path, _ = signed(tmp_path, data, signers, f"deny-{kind}.json")
        code, out, err = install(path)
        assert code == 17 and out == "" and len(err.splitlines()) == 1 and "Traceback" not in err, err
        assert read_bundle_state(str(site.state / "policy-bundle/state.json")).deny_refused.kind == kind  # type: ignore[union-attr]
    (tmp_path / "bare").mkdir()
    bare = Site(tmp_path / "bare")
    code, _, err = run("policy", "deny", "install", str(listed), "--root", str(bare.root), "--config",
                       str(bare.config))
    assert code == 17 and "no trusted root" in err and len(err.splitlines()) == 1, err
    for signer in (site.signer, bare.signer, trust.r1, trust.r2, trust.p1, trust.p2, trust.p3, trust.f1):
        signer.close()


def test_a_list_whose_keys_a_root_rotation_dropped_is_no_longer_served(fleet: Fleet, tmp_path: Path) -> None:
    """Serial 1 served under root version 1; root version 2 (signed by the root keys) gives the fleet role two new
    keys: the hub stops serving the list the old keys signed (503, not the stale list), and a push signed by the
    new keys is served again."""
    trust = fleet.trust
    place(fleet.hub_roots, deny_document(1, [VIM_BAD]), [trust.p1, trust.p2])
    assert fleet.fetch().trust == "" and fleet.state().deny_serial == 1
    new1, new2 = Signer(tmp_path, "n1"), Signer(tmp_path, "n2")
    try:
        second = trust.root(2, [trust.r1, trust.r2], [new1, new2], [trust.r1, trust.r2])
        for suffix in ("", ".sig"):
            (fleet.hub_roots / f"2.root.json{suffix}").write_bytes(Path(f"{second}{suffix}").read_bytes())
        headers = {"Authorization": f"Bearer {fleet.host_token}"}
        answer = requests.get(fleet.hub.url + DENY_PATH, headers=headers, timeout=30)
        assert answer.status_code == 503 and answer.json()["error"] == "deny_unverified", answer.text
        path, _ = signed(fleet.hub_roots.parent, deny_document(2, [VIM_BAD]), [new1, new2], "deny-new.json")
        code, out, err = push_deny(fleet, path)
        assert code == 0 and "of root version 2" in out, out + err
        assert requests.get(fleet.hub.url + DENY_PATH, headers=headers, timeout=30).status_code == 200
        assert fleet.fetch().trust == "" and fleet.state().deny_serial == 2
    finally:
        new1.close()
        new2.close()
