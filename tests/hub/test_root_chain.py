"""The hub judges pushed bundles by the newest root its roots directory vouches for: each version is believed only
when a threshold of the version before it signed it (the walk every host makes), so a root file dropped into the
directory, or one after a gap, never decides which keys may sign policy (real gpg keys and gpgv)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Iterator

import pytest

from agent.errors import BundleRefused
from agent.hub.trust import RootChain, root_or_keys_check
from tests.bundle.keys import Signer
from tests.bundle.roots import role, sign_by, write_root
from tests.bundle.test_roles import Trust


class Roots:
    """Root version 1 of a Trust in a hub's roots directory, a stranger key x, and the check the hub runs."""

    def __init__(self, tmp_path: Path) -> None:
        self.trust = Trust(tmp_path, place_first_root=False)
        self.x = Signer(tmp_path, "x")
        self.dir = tmp_path / "hub-roots"
        self.dir.mkdir()
        for suffix in ("", ".sig"):
            shutil.copyfile(f"{self.trust.first}{suffix}", self.dir / f"1.root.json{suffix}")
        (tmp_path / "keys").mkdir()
        self.check = root_or_keys_check(str(self.dir), str(tmp_path / "keys"))

    def root(self, version: int, root_keys: list, signed_by: list) -> Path:
        """Root ``version`` in the hub's directory whose only policy role is x (1-of-1), signed by ``signed_by``."""
        t = self.trust
        path = write_root(self.dir / f"{version}.root.json", version, root_keys, 1, [role("fleet", [self.x], 1)],
                          [t.f1], [*root_keys, self.x, t.f1, t.r1, t.r2])
        sign_by(path, signed_by)
        return path

    def verdict(self, signers: list) -> str:
        """The hub's answer to a push of a bundle signed by ``signers``: what vouched, or ``refused: KIND``."""
        bundle = self.trust.bundle(7, signers)
        try:
            return self.check(bundle.read_bytes(), Path(f"{bundle}.sig").read_bytes())
        except BundleRefused as exc:
            return f"refused: {exc.kind}"


@pytest.fixture
def roots(tmp_path: Path) -> Iterator[Roots]:
    yield Roots(tmp_path)


def test_a_root_not_signed_by_the_version_before_is_not_believed(roots: Roots) -> None:
    """Root 2 signed only by its own (stranger) root key: pushes are still judged by root 1, so x's bundle is
    refused and p1+p2's is taken; once root 1's keys sign root 2, x's bundle is taken under version 2."""
    t = roots.trust
    roots.root(2, [roots.x], [roots.x])
    assert roots.verdict([roots.x]) == "refused: signature"
    assert roots.verdict([t.p1, t.p2]) == "policy role fleet of root version 1"
    path = roots.root(2, [roots.x], [roots.x, t.r1, t.r2])
    os.utime(path, ns=(1, 1))  # a new stamp however fast the rewrite was
    assert roots.verdict([roots.x]) == "policy role fleet of root version 2"
    assert roots.verdict([t.p1, t.p2]) == "refused: signature"


def test_a_gap_ends_the_chain(roots: Roots) -> None:
    """Root 3 beside root 1 (no version 2), signed by root 1's keys: not believed, root 1 judges."""
    t = roots.trust
    roots.root(3, [t.r1, t.r2], [t.r1, t.r2])
    assert RootChain(str(roots.dir)).newest().version == 1  # type: ignore[union-attr]
    assert roots.verdict([roots.x]) == "refused: signature"


def test_a_first_root_without_its_own_threshold_refuses_every_push(roots: Roots) -> None:
    """A first root that lacks its root keys' threshold (one of two signatures) vouches for nothing: every push is
    refused, never judged by keys the operators did not sign."""
    t = roots.trust
    sign_by(roots.dir / "1.root.json", [t.r1])
    assert roots.verdict([t.p1, t.p2]) == "refused: signature"
