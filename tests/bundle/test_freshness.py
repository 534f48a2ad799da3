"""The pure parts of roles and freshness: gpgv status lines counted per signature, root and statement parsing,
the role that vouches, and the statement a hub makes."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any, Dict

import pytest

from agent.bundle.format import BundleScope
from agent.bundle.freshness import make_statement, newest_for, parse_statement, render_statement
from agent.bundle.roles import judge_policy, parse_root, parse_signers
from agent.bundle.scope import ScopeFacts
from agent.errors import BundleRefused

A, B, C = "A" * 40, "B" * 40, "C" * 40
NOW = dt.datetime(2026, 12, 6, 12, tzinfo=dt.timezone.utc)


def group(fingerprint: str, *words: str) -> str:
    """gpgv's status lines of one signature: NEWSIG, the given words, VALIDSIG with the primary fingerprint."""
    lines = ["[GNUPG:] NEWSIG", *(f"[GNUPG:] {word} {fingerprint[-16:]}" for word in words)]
    return "\n".join(lines + [f"[GNUPG:] VALIDSIG {fingerprint} 2026-12-06 1 0 4 0 22 8 00 {fingerprint}"]) + "\n"


@pytest.mark.parametrize(("text", "signers"), [
    (group(A, "GOODSIG") + group(B, "GOODSIG"), {A, B}),
    (group(A, "GOODSIG") + group(A, "GOODSIG"), {A}),
    (group(A, "GOODSIG") + group(B, "GOODSIG", "EXPKEYSIG"), {A}),
    (group(A, "GOODSIG", "REVKEYSIG") + group(B, "BADSIG"), set()),
    (group(A, "GOODSIG") + "[GNUPG:] NEWSIG\n[GNUPG:] ERRSIG F113B32955F433B1 22 8 00 1 9 X\n", {A}),
    ("[GNUPG:] NODATA 1\n", set()),
])
def test_good_signatures_are_counted_per_signature(text: str, signers: set) -> None:
    """Only a NEWSIG group with GOODSIG and VALIDSIG and no refusing word counts, each key once."""
    assert parse_signers(text) == frozenset(signers)


def root_document(**changes: Any) -> Dict[str, Any]:
    document: Dict[str, Any] = {
        "format": "gpuguard-root/1", "version": 1, "expires": "2099-01-01T00:00:00Z",
        "keys": {A: "AA==", B: "AA==", C: "AA=="}, "root": {"keys": [A], "threshold": 1},
        "freshness": {"keys": [C], "threshold": 1},
        "policy": [{"name": "fleet", "keys": [A, B], "threshold": 2, "scope": {"all": True}},
                   {"name": "b7", "keys": [B], "threshold": 1, "scope": {"labels": {"rack": "b7"}}}]}
    document.update(changes)
    return document


@pytest.mark.parametrize(("changes", "problem"), [
    ({"policy": [{"name": "x", "keys": [A], "threshold": 2, "scope": {"all": True}}]}, "threshold 2 is more than"),
    ({"freshness": {"keys": [A], "threshold": 1}}, "may sign freshness statements only"),
    ({"keys": {A: "AA=="}}, "is named by a role but not given in keys"),
    ({"expires": "soon"}, "is not a UTC time"),
])
def test_a_bad_root_is_refused_as_format(changes: Dict[str, Any], problem: str) -> None:
    """A threshold no key set can meet, a freshness key that also signs policy, an unknown key, a bad time."""
    with pytest.raises(BundleRefused, match=problem) as caught:
        parse_root(json.dumps(root_document(**changes)).encode(), "root.json")
    assert caught.value.kind == "format"


def test_duplicate_keys_in_a_root_are_refused() -> None:
    """A root naming a key twice in one object is refused, not read last-one-wins."""
    text = json.dumps(root_document()).replace('"version": 1', '"version": 1, "version": 9')
    with pytest.raises(BundleRefused, match="format|duplicate|twice"):
        parse_root(text.encode(), "root.json")


@pytest.mark.parametrize(("signers", "labels", "result"), [
    ({A, B}, {}, "fleet"),
    ({B}, {"rack": "b7"}, "b7"),
    ({B}, {"rack": "a7"}, "scope"),
    ({A}, {}, "threshold"),
    ({C}, {}, "signature"),
])
def test_the_role_that_vouches(signers: set, labels: Dict[str, str], result: str) -> None:
    """The first role whose scope takes the host and whose threshold is met; else the refusal's kind (a role met
    for other hosts is scope before a role of this host short of its threshold)."""
    root = parse_root(json.dumps(root_document()).encode(), "root.json")
    facts = ScopeFacts(host_id="node-1", labels=labels)
    try:
        assert judge_policy(root, frozenset(signers), facts, NOW, "b").name == result
    except BundleRefused as exc:
        assert exc.kind == result


def test_a_role_met_for_other_hosts_is_scope() -> None:
    """The b7 role's key alone on an a7 host: the role is met but speaks for other hosts."""
    root = parse_root(json.dumps(root_document(policy=[
        {"name": "b7", "keys": [B], "threshold": 1, "scope": {"labels": {"rack": "b7"}}}])).encode(), "root.json")
    with pytest.raises(BundleRefused) as caught:
        judge_policy(root, frozenset({B}), ScopeFacts(host_id="n", labels={"rack": "a7"}), NOW, "b")
    assert caught.value.kind == "scope"


def test_the_hubs_statement_names_the_newest_per_scope_and_reads_back() -> None:
    """Newest first in, the newest of each scope out; withdrawn sorted; the host's newest among the scopes that
    take it; the canonical bytes parse back to the same statement."""
    every, b7 = BundleScope(all=True), BundleScope(labels={"rack": "b7"})
    statement = make_statement([(9, b7), (7, every), (5, b7)], [6, 3], NOW, 24)
    assert [(n.serial, n.scope) for n in statement.newest] == [(9, b7), (7, every)]
    assert statement.withdrawn == (3, 6) and statement.expires == "2026-12-07T12:00:00Z"
    assert newest_for(statement, ScopeFacts(host_id="n", labels={"rack": "b7"})) == 9
    assert newest_for(statement, ScopeFacts(host_id="n")) == 7
    assert parse_statement(render_statement(statement), "s") == statement
    with pytest.raises(ValueError, match="at most 168 hours"):
        make_statement([], [], NOW, 200)


@pytest.mark.parametrize(("parse", "document", "problem"), [
    (parse_root, json.dumps(root_document()).replace('"fleet"', '"\\ud800"'), "root -> policy -> 1 -> name: text holds "
                                                                               "U+D800 (a lone surrogate)"),
    (parse_root, json.dumps(root_document(format="gpuguard-root/2")), "not a root: format is not 'gpuguard-root/1'"),
    (parse_root, "\udcff".encode("utf-8", "surrogateescape"), "root is not UTF-8 (byte 0)"),
    (parse_statement, json.dumps({"format": "gpuguard-freshness/1", "issued_at": "2026-12-06T12:00:00Z",
                                  "expires": "2026-12-07T12:00:00Z", "withdrawn": [], "newest": [
                                      {"serial": 1, "scope": {"labels": {"rack": "\ud800"}}}]}),
     "freshness statement -> newest -> 1 -> scope -> labels -> rack: text holds U+D800"),
    (parse_statement, json.dumps({"format": "gpuguard-policy-bundle/1"}),
     "not a freshness statement: format is not 'gpuguard-freshness/1'"),
    (parse_statement, "{" + " " * (1024 * 1024) + "}", "freshness statement is 1048578 bytes, more than 1048576"),
])
def test_a_root_or_statement_that_is_not_clean_strict_json_is_refused_as_format_in_one_line(
        parse: Any, document: str, problem: str) -> None:
    """Roots and freshness statements are read as deny lists are: text UTF-8 cannot encode (a lone surrogate), another
    format, a byte that is not UTF-8 or too many bytes is a format refusal naming what and where, in one line."""
    data = document if isinstance(document, bytes) else document.encode("utf-8", "surrogatepass")
    with pytest.raises(BundleRefused) as caught:
        parse(data, "doc.json")
    assert caught.value.kind == "format" and problem in caught.value.reason, caught.value.reason
    assert "\n" not in str(caught.value)
