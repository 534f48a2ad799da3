"""Bake time under real dnf and rpm (issue 43): with a ``[[bake]]`` rule of 7 days on hello-fake, the update the
signed deny list dates 2 days ago is refused by the dnf plugin with its age and the day it is allowed; a later
list dating it 10 days ago lets the same upgrade through."""

from __future__ import annotations

import datetime as dt

from agent.daemon_jobs.policy_fetch import fetch_and_install
from tests.bundle.test_attacks import Fleet
from tests.bundle.test_deny import dated_list, place
from tests.guard.dnf.installroot.conftest import compile_policy
from tests.guard.dnf.installroot.harness import HELLO_10, HELLO_11, Installroot
from tests.guard.dnf.installroot.rollback_support import host_for
from tests.guard.dnf.installroot.test_deny import fleet  # noqa: F401 - the fixture
from tests.policy.families.test_bake import days_ago

BAKE = '[[bake]]\nname = "hello"\nfamily = "gpu_stack"\npackages = ["hello-fake"]\nmin_age_days = 7\n'


def test_a_version_younger_than_its_bake_time_is_refused_by_real_dnf(installroot: Installroot,
                                                                     fleet: Fleet) -> None:  # noqa: F811
    """2 days old: refused, naming its date, age and the day it is allowed, rpm's database unchanged; 10 days old
    (a newer list): upgraded."""
    (installroot.root / "etc/gpuguard/policy.d/50-bake.toml").write_text(BAKE)
    compile_policy(installroot)
    trust = fleet.trust
    place(fleet.hub_roots, dated_list(1, "hello-fake", HELLO_11, days_ago(2)), [trust.p1, trust.p2])
    assert fetch_and_install(host_for(installroot), fleet.settings, "node-1").trust == ""
    before = installroot.installed()
    refused = installroot.dnf("upgrade", "hello-fake")
    allowed = (dt.date.fromisoformat(days_ago(2)) + dt.timedelta(days=7)).isoformat()
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert (f"REFUSED (bake.hello): hello-fake {HELLO_10} -> {HELLO_11}: hello-fake {HELLO_11} was published "
            f"{days_ago(2)}, 2 days ago: rule 'hello' asks 7 days of bake time, so it is allowed from "
            f"{allowed}") in refused.stderr, refused.stderr
    assert installroot.installed() == before
    place(fleet.hub_roots, dated_list(2, "hello-fake", HELLO_11, days_ago(10)), [trust.p1, trust.p2])
    assert fetch_and_install(host_for(installroot), fleet.settings, "node-1").trust == ""
    upgraded = installroot.dnf("upgrade", "hello-fake")
    assert upgraded.returncode == 0, upgraded.stdout + upgraded.stderr
    assert installroot.installed()["hello-fake"] == HELLO_11
