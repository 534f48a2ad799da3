"""Known-bad versions under real apt and dpkg (issue 43): a deny list signed by the fleet-wide policy role arrives
from a real hub at the next fetch; the apt hook refuses the denied version with the entry's reason and source,
dpkg's status unchanged; the installed build it denies is flagged; ``gpuguard pin apply`` writes it as
``Pin-Priority: -1`` so apt itself finds no candidate."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest

from tests.bundle.test_attacks import Fleet
from tests.bundle.test_deny import amdgpu_recall, deny_document, hello_bad, place
from tests.guard.apt.chroot.conftest import gpuguard
from tests.guard.apt.chroot.harness import AMDGPU_62, Chroot
from tests.guard.deny_fleet import deny_fleet

pytestmark = pytest.mark.timeout(900)

HELLO_BAD = hello_bad("1.0-1")
AMDGPU_RECALL = amdgpu_recall(AMDGPU_62)


@pytest.fixture
def fleet(chroot: Chroot, tmp_path: Path) -> Iterator[Fleet]:
    """The chroot trusting root version 1 (tests/bundle's Trust), its local policy in force, reporting to a real
    hub whose roots directory will hold the deny list."""
    with deny_fleet(tmp_path, chroot) as made:
        yield made


def test_a_deny_list_from_a_real_hub_is_refused_by_real_apt_and_pinned_natively(chroot: Chroot, fleet: Fleet) -> None:
    """hello-fake 1.0-1 installs before the list; after the next fetch apt's hook refuses it naming the entry,
    its reason and source (dpkg's status byte for byte the same), the installed amdgpu-dkms build is flagged, and
    after ``pin apply`` apt itself (hook off) has no candidate for hello-fake."""
    assert chroot.apt("install", "--simulate", "hello-fake").returncode == 0
    trust = fleet.trust
    place(fleet.hub_roots, deny_document(1, [HELLO_BAD, AMDGPU_RECALL]), [trust.p1, trust.p2])
    result = fleet.fetch()
    assert result.trust == "", result
    before = chroot.status_bytes()
    refused = chroot.apt("install", "hello-fake")
    output = refused.stdout + refused.stderr
    assert refused.returncode != 0, output
    assert ("REFUSED (denied.hello-bad): hello-fake (not installed) -> 1.0-1: hello-fake 1.0-1 is a known-bad "
            "version: deny entry 'hello-bad' (deny list serial 1, added 2026-12-03): corrupts output "
            "(https://example.org/advisories/hello-1.0-1)") in output, output
    assert chroot.status_bytes() == before and "hello-fake" not in chroot.installed()
    assert fleet.state().denied_installed == (f"amdgpu-dkms {AMDGPU_62}: denied.amdgpu-recall",)

    code, out = gpuguard(chroot, "pin", "apply")
    assert code == 0, out
    pins = (chroot.root / "etc/apt/preferences.d/gpuguard-forbidden.pref").read_text()
    assert ("Explanation: gpuguard: known-bad: deny entry 'hello-bad' (deny list serial 1, added 2026-12-03): "
            "corrupts output (https://example.org/advisories/hello-1.0-1)\nPackage: hello-fake\n"
            "Pin: version 1.0-1\nPin-Priority: -1\n") in pins
    unhooked = chroot.apt("install", "hello-fake", hook=False)
    assert unhooked.returncode != 0 and "hello-fake" not in chroot.installed()
    assert "has no installation candidate" in unhooked.stdout + unhooked.stderr


def test_a_denied_version_put_in_place_past_apt_is_flagged_by_the_next_guard_check(chroot: Chroot, fleet: Fleet,
                                                                                    tmp_path: Path) -> None:
    """The list in force (amdgpu-dkms flagged at the fetch); ``dpkg -i`` of the denied hello-fake 1.0-1 goes past
    apt's hook, and the daemon's guard job, run once for that package change, flags it with no fetch in between;
    ``dpkg -r`` of it and the next guard check take the flag away again."""
    from agent.daemon_jobs.guard import GuardJob
    from agent.daemon_jobs.guard_events import GuardEventForwarder
    from agent.host import Host
    from tests.daemon.test_jobs import make_runtime

    trust = fleet.trust
    place(fleet.hub_roots, deny_document(1, [HELLO_BAD, AMDGPU_RECALL]), [trust.p1, trust.p2])
    assert fleet.fetch().trust == ""
    recall = f"amdgpu-dkms {AMDGPU_62}: denied.amdgpu-recall"
    assert fleet.state().denied_installed == (recall,)
    forced = chroot.run("dpkg", "-i", chroot.deb("hello-fake", "1.0-1"))
    assert forced.returncode == 0, forced.stderr
    rt = make_runtime(tmp_path, Host.for_root(str(chroot.root)))
    job = GuardJob(rt, GuardEventForwarder(rt, str(chroot.state_dir / "guard-events.jsonl")).run)
    try:
        job.run("package_change")
        assert fleet.state().denied_installed == (recall, "hello-fake 1.0-1: denied.hello-bad")
        removed = chroot.run("dpkg", "-r", "hello-fake")
        assert removed.returncode == 0, removed.stderr
        job.run("package_change")
        assert fleet.state().denied_installed == (recall,)
    finally:
        rt.outbox.close()
