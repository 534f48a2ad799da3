"""Bake time under real apt and dpkg (issue 43): with a ``[[bake]]`` rule of 7 days on hello-fake, the version the
signed deny list dates 2 days ago is refused by the hook with its age and the day it is allowed; a later list
dating it 10 days ago lets the same install through."""

from __future__ import annotations

import datetime as dt

from tests.bundle.test_attacks import Fleet
from tests.bundle.test_deny import dated_list, place
from tests.guard.apt.chroot.conftest import gpuguard
from tests.guard.apt.chroot.harness import Chroot
from tests.guard.apt.chroot.test_deny import fleet  # noqa: F401 - the fixture
from tests.policy.families.test_bake import days_ago

BAKE = '[[bake]]\nname = "hello"\nfamily = "gpu_stack"\npackages = ["hello-fake"]\nmin_age_days = 7\n'


def test_a_version_younger_than_its_bake_time_is_refused_by_real_apt(chroot: Chroot, fleet: Fleet) -> None:  # noqa: F811
    """2 days old: refused, naming its date, age and the day it is allowed, dpkg's status unchanged; 10 days old
    (a newer list): installed."""
    bake = chroot.root / "etc/gpuguard/policy.d/50-bake.toml"
    bake.write_text(BAKE)
    try:
        code, out = gpuguard(chroot, "policy", "compile")
        assert code == 0, out
        trust = fleet.trust
        place(fleet.hub_roots, dated_list(1, "hello-fake", "1.0-1", days_ago(2)), [trust.p1, trust.p2])
        assert fleet.fetch().trust == ""
        before = chroot.status_bytes()
        refused = chroot.apt("install", "hello-fake")
        output = refused.stdout + refused.stderr
        allowed = (dt.date.fromisoformat(days_ago(2)) + dt.timedelta(days=7)).isoformat()
        assert refused.returncode != 0, output
        assert (f"REFUSED (bake.hello): hello-fake (not installed) -> 1.0-1: hello-fake 1.0-1 was published "
                f"{days_ago(2)}, 2 days ago: rule 'hello' asks 7 days of bake time, so it is allowed from "
                f"{allowed}") in output, output
        assert chroot.status_bytes() == before
        place(fleet.hub_roots, dated_list(2, "hello-fake", "1.0-1", days_ago(10)), [trust.p1, trust.p2])
        assert fleet.fetch().trust == ""
        installed = chroot.apt("install", "hello-fake")
        assert installed.returncode == 0, installed.stdout + installed.stderr
        assert chroot.installed()["hello-fake"] == "1.0-1"
    finally:
        bake.unlink()
