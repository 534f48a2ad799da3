"""Known-bad versions (issue 43): a deny list signed by the fleet-wide policy role, placed on a real hub, taken at
the host's next fetch whatever a rollout holds back, refused by the apt hook, flagged where already installed,
written as native pins; a deny list with bad signatures, a role for other hosts or a lower serial is refused with
its kind and changes nothing."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any, Dict, Iterator, List

import pytest
import requests

from agent.bundle.deny import DENY_FORMAT, DenyList, parse_deny, render_deny
from agent.errors import BundleRefused
from agent.guard.hotpath import decision as exits
from agent.guard.pin_records import pin_records
from agent.host import Host
from agent.hub.tokens import add_token
from agent.policy.compiled import read_compiled
from agent.report.events import Heartbeat
from agent.status.assess import assess
from agent.status.facts import read_policy
from tests.bundle.roots import sign_by
from tests.bundle.test_attacks import Fleet
from tests.bundle.test_install import POLICY, Site, run
from tests.bundle.test_roles import Trust
from tests.guard.apt.test_hook import HEAD, line, run_hook
from tests.hub.factories import batch_json, event
from tests.status.test_assess import healthy

pytestmark = pytest.mark.slow  # a real hub process

VIM_BAD = {"id": "vim-crash", "packages": ["vim"], "versions": ">= 2:9.0.1378-3, << 2:9.0.1378-5",
           "reason": "crashes on start", "source_url": "https://example.org/advisories/vim-1378-3",
           "added": "2026-12-01"}
# amdgpu-dkms 1:6.8.5.60202-2041575 is installed on the Site (tests/guard/apt/test_hook.py STATUS).
AMDGPU_RECALL = {"id": "amdgpu-recall", "packages": ["amdgpu-dkms"], "versions": "= 1:6.8.5.60202-2041575",
                 "reason": "firmware hang under load", "source_url": "https://example.org/advisories/amdgpu-6.8.5",
                 "added": "2026-12-02"}
TO_VIM_3 = HEAD + line("vim", "2:9.0.1378-2", "2:9.0.1378-3")
TO_VIM_5 = HEAD + line("vim", "2:9.0.1378-2", "2:9.0.1378-5")


def deny_document(serial: int, entries: List[Dict[str, Any]]) -> bytes:
    """The canonical bytes of a deny list."""
    return render_deny(DenyList.model_validate({"format": DENY_FORMAT, "serial": serial,
                                                "issued_at": "2026-12-05T00:00:00Z", "entries": entries}))


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
    """Serial 2 in force; one key of the two the fleet role needs (threshold), the key of a role for other hosts
    (scope), a well-signed list changed after signing (signature), serial 1 (rollback) and serial 2 with other
    entries (rollback): each refused with its kind in the fetch's line and the state; the compiled policy, the
    list in force and the hook's refusal stay."""
    trust = fleet.trust
    place(fleet.hub_roots, deny_document(2, [VIM_BAD]), [trust.p1, trust.p2])
    assert fleet.fetch().trust == ""
    compiled, in_force = fleet.site.compiled.read_bytes(), (fleet.site.state / "policy-bundle/deny.json").read_bytes()
    good = deny_document(3, [AMDGPU_RECALL])
    if attack == "1-of-2":
        place(fleet.hub_roots, good, [trust.p1])
    elif attack == "another scope":
        place(fleet.hub_roots, good, [trust.p3])
    elif attack == "other bytes":
        path = place(fleet.hub_roots, good, [trust.p1, trust.p2])
        path.write_bytes(deny_document(3, []))
    elif attack == "lower serial":
        place(fleet.hub_roots, deny_document(1, [AMDGPU_RECALL]), [trust.p1, trust.p2])
    else:
        place(fleet.hub_roots, deny_document(2, [AMDGPU_RECALL]), [trust.p1, trust.p2])
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
    (lambda d: d["entries"][0].update(added="yesterday"), "is not a date"),
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
