"""Roles and thresholds under a root (agent/bundle/roles.py, root.py) with real gpg keys and gpgv: a bundle is
enforced only with its role's threshold of distinct valid signatures for this host's scope, it expires, and a new
root taken through a threshold of the old and the new root keys rotates a leaked key out and resets its floor."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import List, Optional

from agent.bundle.format import MAX_SERIAL
from agent.bundle.state import read_bundle_state
from agent.config import parse_settings
from agent.host import Host
from agent.status.assess import assess
from agent.status.facts import read_policy
from tests.bundle.keys import Signer
from tests.bundle.roots import role, sign_by, write_root
from tests.bundle.test_install import PERMISSIVE, POLICY, Site, run
from tests.status.test_assess import healthy

ALIVE = ("--all", "--expires-days", "30")


class Trust:
    """A Site whose host trusts root version 1: root keys r1+r2 (2-of-2), policy role ``fleet`` p1+p2 (2-of-2) for
    every host, role ``rack-b7`` p3 (1-of-1) for label rack=b7 (the site is rack a7), freshness key f1."""

    def __init__(self, tmp_path: Path, place_first_root: bool = True) -> None:
        self.site = Site(tmp_path)
        self.dir = tmp_path / "roots"
        self.dir.mkdir()
        self.r1, self.r2, self.p1, self.p2, self.p3, self.f1 = (
            Signer(tmp_path, name) for name in ("r1", "r2", "p1", "p2", "p3", "f1"))
        self.first = self.root(1, [self.r1, self.r2], [self.p1, self.p2], [self.r1, self.r2])
        if place_first_root:
            keys = self.site.root / "etc/gpuguard/keys"
            (keys / "root.json").write_bytes(self.first.read_bytes())
            (keys / "root.json.sig").write_bytes(Path(str(self.first) + ".sig").read_bytes())

    def root(self, version: int, root_keys: List[Signer], fleet: List[Signer], signed_by: List[Signer],
             expires: str = "2099-01-01T00:00:00Z") -> Path:
        """Root ``version`` with these root keys and fleet keys (2-of-n), signed by ``signed_by``."""
        everyone = {s.fingerprint: s for s in [*root_keys, *fleet, self.p3, self.f1]}
        path = write_root(self.dir / f"{version}.root.json", version, root_keys, len(root_keys),
                          [role("fleet", fleet, min(2, len(fleet))),
                           role("rack-b7", [self.p3], 1, {"labels": {"rack": "b7"}})],
                          [self.f1], list(everyone.values()), expires)
        sign_by(path, signed_by)
        return path

    def bundle(self, serial: int, signers: List[Signer], policy: str = POLICY, *options: str) -> Path:
        """A bundle of ``policy`` signed by each of ``signers``."""
        target = self.site.bundle(serial, policy, *(options or ALIVE), sign=False, name=f"b-{serial}-{len(signers)}"
                                                                                        f"-{signers[0].home.name}.json")
        sign_by(target, signers)
        return target

    def refused(self, bundle: Path) -> Optional[str]:
        """Install ``bundle``: None when it went in, else the refusal's kind (the compiled policy checked unchanged)."""
        before = self.site.compiled.read_bytes() if self.site.compiled.exists() else None
        code, _, err = self.site.install(bundle)
        if code == 0:
            return None
        assert code == 17 and err.count("\n") == 1, err
        assert (self.site.compiled.read_bytes() if self.site.compiled.exists() else None) == before
        state = read_bundle_state(str(self.site.state / "policy-bundle/state.json"))
        assert state.refused is not None
        return state.refused.kind

    def trust(self, *roots: Path) -> tuple:
        return run("policy", "trust-root", *map(str, roots), "--root", str(self.site.root), "--config",
                   str(self.site.config))




def test_a_bundle_needs_its_roles_threshold_of_distinct_keys(tmp_path: Path) -> None:
    """1-of-2 signatures where 2 are required is refused as threshold; the same key twice counts once; 2-of-2
    installs and the state names the role and the keys that vouched."""
    trust = Trust(tmp_path)
    assert trust.refused(trust.bundle(1, [trust.p1, trust.p2])) is None
    state = read_bundle_state(str(trust.site.state / "policy-bundle/state.json"))
    assert state.role == "fleet" and state.signers == tuple(sorted((trust.p1.fingerprint, trust.p2.fingerprint)))
    assert trust.site.hook_refuses()
    assert trust.refused(trust.bundle(2, [trust.p1], PERMISSIVE)) == "threshold"
    assert trust.refused(trust.bundle(3, [trust.p1, trust.p1], PERMISSIVE)) == "threshold"
    assert trust.site.hook_refuses()


def test_keys_outside_the_hosts_roles_are_refused(tmp_path: Path) -> None:
    """A key of a role for other hosts is refused as scope; a key only in the keyrings directory (no role) is
    refused as signature; the policy in force keeps guarding."""
    trust = Trust(tmp_path)
    assert trust.refused(trust.bundle(1, [trust.p1, trust.p2])) is None
    assert trust.refused(trust.bundle(2, [trust.p3], PERMISSIVE)) == "scope"
    assert trust.refused(trust.bundle(3, [trust.site.signer], PERMISSIVE)) == "signature"
    assert trust.refused(trust.bundle(4, [trust.f1], PERMISSIVE)) == "signature"
    assert trust.site.hook_refuses()


def test_expiry_is_required_refused_when_past_and_attention_in_force(tmp_path: Path) -> None:
    """Under a root a bundle without expires is refused (format), one past it (expired); the bundle in force that
    expires keeps guarding and status says so."""
    trust = Trust(tmp_path)
    assert trust.refused(trust.bundle(1, [trust.p1, trust.p2], POLICY, "--all")) == "format"
    assert trust.refused(trust.bundle(2, [trust.p1, trust.p2])) is None
    facts = read_policy(Host.for_root(str(trust.site.root)), parse_settings(trust.site.config.read_text()).guard,
                        "/var/lib/gpuguard")
    assert facts.bundle_expires is not None
    now = facts.bundle_expires - dt.timedelta(days=1)
    assert next(c for c in assess(healthy(policy=facts), now).checks if c.name == "policy").state == "ok"
    later = next(c for c in assess(healthy(policy=facts), facts.bundle_expires).checks if c.name == "policy")
    assert later.state == "warn" and "expired at" in later.summary and "still enforced" in later.summary
    late = trust.site.bundle(3, PERMISSIVE, sign=False, name="late.json")
    late.write_bytes(late.read_bytes().replace(b'"format":', b'"expires":"2020-01-01T00:00:00Z","format":'))
    sign_by(late, [trust.p1, trust.p2])
    assert trust.refused(late) == "expired"
    assert trust.site.hook_refuses()


def test_trust_root_bootstraps_then_walks_one_version_at_a_time(tmp_path: Path) -> None:
    """``policy trust-root`` takes a first root signed by its own threshold; the next version needs a threshold of
    the old and of the new root keys; a lower, equal or skipping version is refused with its kind."""
    trust = Trust(tmp_path, place_first_root=False)
    code, out, err = trust.trust(trust.first)
    assert code == 0 and out.startswith("trusted root version 1"), err
    r3 = Signer(tmp_path, "r3")
    only_new = trust.root(2, [trust.r1, r3], [trust.p1, trust.p2], [r3])
    code, _, err = trust.trust(only_new)
    assert code == 17 and "signatures the trusted version 1's root keys must make" in err, err
    half_old = trust.root(2, [trust.r1, r3], [trust.p1, trust.p2], [trust.r1, r3])
    code, _, err = trust.trust(half_old)
    assert code == 17 and "1 of the 2 signatures the trusted version 1's" in err, err
    good = trust.root(2, [trust.r1, r3], [trust.p1, trust.p2], [trust.r1, trust.r2, r3])
    skipping = trust.root(4, [trust.r1, r3], [trust.p1, trust.p2], [trust.r1, trust.r2, r3])
    assert trust.trust(skipping)[0] == 17
    code, out, err = trust.trust(good)
    assert code == 0 and out.startswith("trusted root version 2"), err
    code, _, err = trust.trust(trust.first)
    assert code == 17 and "root version 1 is not above version 2 trusted" in err


def test_an_expired_root_refuses_every_bundle(tmp_path: Path) -> None:
    """A root past its expires vouches for nothing: the bundle is refused as expired."""
    trust = Trust(tmp_path, place_first_root=False)
    old = trust.root(1, [trust.r1, trust.r2], [trust.p1, trust.p2], [trust.r1, trust.r2],
                     expires="2020-01-01T00:00:00Z")
    code, _, err = trust.trust(old)
    assert code == 17 and "expired" in err
    assert trust.refused(trust.bundle(1, [trust.p1, trust.p2])) == "expired"


def test_rotating_a_leaked_key_out_resets_the_floor_it_set(tmp_path: Path) -> None:
    """Fast-forward by a role of one leaked key (serial 2^63-1) blocks every later bundle (rollback); the next root,
    signed by the old and new root keys, drops the key, and a bundle by the new key installs at serial 2."""
    trust = Trust(tmp_path, place_first_root=False)
    one = write_root(trust.dir / "1.root.json", 1, [trust.r1, trust.r2], 2,
                     [role("fleet", [trust.p1], 1)], [trust.f1],
                     [trust.r1, trust.r2, trust.p1, trust.p2, trust.f1])
    sign_by(one, [trust.r1, trust.r2])
    assert trust.trust(one)[0] == 0
    assert trust.refused(trust.bundle(MAX_SERIAL, [trust.p1], PERMISSIVE)) is None
    assert trust.refused(trust.bundle(2, [trust.p1])) == "rollback"
    two = write_root(trust.dir / "2.root.json", 2, [trust.r1, trust.r2], 2,
                     [role("fleet", [trust.p2], 1)], [trust.f1],
                     [trust.r1, trust.r2, trust.p1, trust.p2, trust.f1])
    sign_by(two, [trust.r1, trust.r2])
    assert trust.trust(two)[0] == 0
    assert trust.refused(trust.bundle(3, [trust.p1])) == "signature"
    assert trust.refused(trust.bundle(2, [trust.p2])) is None
    assert trust.site.hook_refuses()
    assert read_bundle_state(str(trust.site.state / "policy-bundle/state.json")).serial == 2


def test_a_first_root_others_may_write_is_not_trusted(tmp_path: Path) -> None:
    """A root.json in the keys directory that anyone may write (who writes it chooses every key) is refused, and
    no root is kept; made safe, it is taken."""
    trust = Trust(tmp_path)
    first = trust.site.root / "etc/gpuguard/keys/root.json"
    first.chmod(0o666)
    code, _, err = trust.site.install(trust.bundle(1, [trust.p1, trust.p2]))
    assert code == 17 and "may be written by others than root (mode 0666" in err, err
    assert not (trust.site.state / "policy-bundle/root.json").exists()
    first.chmod(0o644)
    assert trust.refused(tmp_path / "b-1-2-gnupg-p1.json") is None
