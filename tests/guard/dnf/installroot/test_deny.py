"""Known-bad versions under real dnf and rpm (issue 43): a deny list signed by the fleet-wide policy role arrives
from a real hub at the next fetch; the dnf plugin refuses the denied version with the entry's reason and source,
the rpm database unchanged; the installed build it denies is flagged; ``gpuguard pin apply`` writes it as a
versionlock exclude, so dnf itself no longer offers it."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest

from agent.daemon_jobs.policy_fetch import fetch_and_install
from tests.bundle.test_attacks import Fleet
from tests.bundle.test_deny import amdgpu_recall, deny_document, hello_bad, place
from tests.guard.deny_fleet import deny_fleet
from tests.guard.dnf.installroot.harness import AMDGPU_62, HELLO_10, HELLO_11, Installroot
from tests.guard.dnf.installroot.rollback_support import agent_config, cli, dnf_vl, enable_versionlock, host_for

pytestmark = pytest.mark.timeout(600)

HELLO_BAD = hello_bad(HELLO_11)
AMDGPU_RECALL = amdgpu_recall(AMDGPU_62)


@pytest.fixture
def fleet(installroot: Installroot, tmp_path: Path) -> Iterator[Fleet]:
    """The installroot trusting root version 1 (tests/bundle's Trust), its local policy in force, reporting to a
    real hub whose roots directory will hold the deny list."""
    with deny_fleet(tmp_path, installroot) as made:
        yield made


def test_a_deny_list_from_a_real_hub_is_refused_by_real_dnf_and_locked_out(installroot: Installroot,
                                                                           fleet: Fleet) -> None:
    """After the next fetch dnf's plugin refuses hello-fake 1.1-1 naming the entry, its reason and source (rpm's
    database unchanged), the installed amdgpu-dkms build is flagged, and after ``pin apply`` a versionlock exclude
    keeps dnf itself (gpuguard's plugin off) from offering it."""
    trust = fleet.trust
    place(fleet.hub_roots, deny_document(1, [HELLO_BAD, AMDGPU_RECALL]), [trust.p1, trust.p2])
    result = fetch_and_install(host_for(installroot), fleet.settings, "node-1")
    assert result.trust == "", result
    before = installroot.installed()
    refused = installroot.dnf("upgrade", "hello-fake")
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert (f"REFUSED (denied.hello-bad): hello-fake {HELLO_10} -> {HELLO_11}: hello-fake {HELLO_11} is a known-bad "
            f"version: deny entry 'hello-bad' (deny list serial 1, added 2026-12-03): corrupts output "
            f"(https://example.org/advisories/hello-1.1-1)") in refused.stderr, refused.stderr
    assert installroot.installed() == before
    assert fleet.state().denied_installed == (f"amdgpu-dkms {AMDGPU_62}: denied.amdgpu-recall",)

    conf = enable_versionlock(installroot)
    code, out = cli(installroot, "pin", "apply", config=agent_config(installroot))
    assert code == 0, out
    locklist = (installroot.root / "etc/dnf/plugins/versionlock.list").read_text()
    assert f"!hello-fake-0:{HELLO_11}.*" in locklist, locklist
    upgraded = dnf_vl(installroot, conf, "-y", "upgrade", "hello-fake")
    assert upgraded.returncode == 0, upgraded.stdout + upgraded.stderr
    assert installroot.installed()["hello-fake"] == HELLO_10
