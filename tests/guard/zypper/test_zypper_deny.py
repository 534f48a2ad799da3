"""Known-bad versions on a real zypper host (issue 43): a deny list signed by the root's fleet-wide policy role,
carried in and put in force with ``gpuguard policy deny install`` (the air-gapped path), is refused by the zypper
guard naming the entry, and ``gpuguard pin apply`` writes it as a zypper lock that real zypper honours."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Iterator

import pytest

from tests.bundle.roots import sign_by
from tests.bundle.test_deny import deny_document, hello_bad
from tests.bundle.test_roles import Trust
from tests.guard.zypper.conftest import BASELINE, HELLO_11, spec
from tests.guard.zypper.harness import ZypperHost

pytestmark = pytest.mark.timeout(600)

HELLO_BAD = hello_bad(HELLO_11)


def output(result: subprocess.CompletedProcess) -> str:
    return result.stdout + result.stderr


@pytest.fixture
def trusted(host: ZypperHost, tmp_path: Path) -> Iterator[Trust]:
    """The zypper host trusting root version 1 (tests/bundle's Trust: fleet role p1+p2, 2-of-2) as its first root."""
    trust = Trust(tmp_path, place_first_root=False)
    for suffix in ("", ".sig"):
        host.write(f"/etc/gpuguard/keys/root.json{suffix}", "")
        host.path(f"/etc/gpuguard/keys/root.json{suffix}").write_bytes(Path(f"{trust.first}{suffix}").read_bytes())
    try:
        yield trust
    finally:
        for signer in (trust.site.signer, trust.r1, trust.r2, trust.p1, trust.p2, trust.p3, trust.f1):
            signer.close()
        shutil.rmtree(host.path("/etc/gpuguard/keys"), ignore_errors=True)


def test_a_deny_entry_is_refused_by_zypper_and_locked_by_pin_apply(host: ZypperHost, trusted: Trust,
                                                                    tmp_path: Path) -> None:
    """hello-fake 1.1-1 denied: after ``policy deny install`` zypper's install of it is refused naming the entry,
    its reason and source (nothing installed); ``pin apply`` writes its zypper lock, and ``zypper update`` (hook
    and locks together) then moves nothing and refuses nothing."""
    deny = tmp_path / "deny.json"
    deny.write_bytes(deny_document(1, [HELLO_BAD]))
    sign_by(deny, [trusted.p1, trusted.p2])
    host.write("/root/deny.json", "")
    host.path("/root/deny.json").write_bytes(deny.read_bytes())
    host.path("/root/deny.json.sig").write_bytes(Path(f"{deny}.sig").read_bytes())
    taken = host.gpuguard("policy", "deny", "install", "/root/deny.json")
    assert taken.returncode == 0, output(taken)
    assert "took deny list serial 1, 1 entries" in taken.stdout

    refused = host.zypper("install", spec("hello-fake", HELLO_11))
    text = output(refused)
    assert refused.returncode != 0, text
    assert "gpuguard: REFUSED (denied.hello-bad)" in text, text
    assert ("is a known-bad version: deny entry 'hello-bad' (deny list serial 1, added 2026-12-03): corrupts output "
            "(https://example.org/advisories/hello-1.1-1)") in text, text
    assert host.installed() == BASELINE

    pinned = host.gpuguard("pin", "apply")
    assert pinned.returncode == 0, output(pinned)
    locks = host.read("/etc/zypp/locks") or ""
    assert f"version: == {HELLO_11}\nmatch_type: glob\ncase_sensitive: on\nsolvable_name: hello-fake" in locks, locks
    update = host.zypper("update")
    assert update.returncode == 0, output(update)
    assert "REFUSED" not in output(update)
    assert host.installed() == BASELINE
