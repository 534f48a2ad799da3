"""Signed policy bundles under real apt and dpkg: with ``policy_source = "bundle"`` a bundle installed by
``gpuguard policy install`` is what the hook enforces; each bad bundle (tampered, unknown key, older serial, out of
scope, does not compile) is refused with its line and the hook refuses the same upgrade before and after, dpkg's
status unchanged. gpgv runs as the agent runs it (the Host runner, on the machine, with the trusted keyrings under
the root): the keys are in the chroot's /etc/gpuguard/keys."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Iterator

import pytest

from agent.bundle.state import read_bundle_state
from tests.bundle.keys import Signer
from tests.bundle.test_install import Site, refusals, run
from tests.guard.apt.chroot.harness import AMDGPU_63, ROCM_63, TEST_POLICY, Chroot

pytestmark = pytest.mark.timeout(900)

# The chroot's test policy with its ROCm 6.3 pairing taken out: only the bundle forbids the move to 6.3.
BUNDLE_POLICY = TEST_POLICY.replace('name = "chroot-test"', 'name = "bundle-6.2"').split("[[amd.pairing]]\nname = "
                                                                                         '"rocm-6.3"')[0]
TO_63 = ("install", f"amdgpu-dkms={AMDGPU_63}", f"rocm-core={ROCM_63}", f"rocm-hip-runtime={ROCM_63}")


class ChrootSite(Site):
    """tests/bundle's Site over the chroot: its keys directory, its state, a config choosing the bundle source."""

    def __init__(self, tmp_path: Path, chroot: Chroot) -> None:  # noqa: D107 - Site's fields, the chroot's root
        self.tmp = tmp_path
        self.root = chroot.root
        self.config = tmp_path / "agent.toml"
        self.config.write_text('[agent]\nstate_dir = "/var/lib/gpuguard"\nhost_id = "node-1"\n'
                               'labels = { rack = "a7" }\n[guard]\npolicy_source = "bundle"\n')
        self.signer = Signer(tmp_path, "ops")
        self.signer.export(self.root / "etc/gpuguard/keys/ops.gpg")
        self.policy_dir = tmp_path / "policy.d"
        self.policy_dir.mkdir()
        self.state = chroot.state_dir
        self.compiled = self.state / "policy.compiled.json"


@pytest.fixture
def site(chroot: Chroot, tmp_path: Path) -> Iterator[ChrootSite]:
    made = ChrootSite(tmp_path, chroot)
    yield made
    made.signer.close()
    shutil.rmtree(chroot.root / "etc/gpuguard/keys", ignore_errors=True)  # the chroot fixture resets the state


def refused_by_hook(chroot: Chroot) -> str:
    """Try the move to 6.3 through apt; the hook must refuse it with nothing installed. Returns apt's output."""
    before = chroot.status_bytes()
    result = chroot.apt(*TO_63)
    assert result.returncode != 0, result.stdout + result.stderr
    assert "REFUSED (amd.pairing)" in result.stdout + result.stderr, result.stdout + result.stderr
    assert chroot.status_bytes() == before
    return result.stdout + result.stderr


def test_a_signed_bundle_is_enforced_and_every_bad_one_is_refused(chroot: Chroot, site: ChrootSite) -> None:
    """The installed bundle makes the hook refuse the move to 6.3 (the local policy has a 6.3 pairing); tampered,
    unknown key, older serial, out of scope and not compiling are each refused (exit 17, their line) and the hook
    refuses the same move, dpkg's status byte for byte the same, before and after each."""
    assert chroot.apt(*TO_63, "--simulate").returncode == 0  # apt can make the move: only the hook stops it
    code, out, err = site.install(site.bundle(10, BUNDLE_POLICY, "--host-id", "node-*", "--os", "debian-12"))
    assert code == 0, err
    assert out.startswith(f"installed policy bundle serial 10, policy 'bundle-6.2', key {site.signer.fingerprint}")
    compiled = json.loads(site.compiled.read_text())
    assert compiled["sources"][0]["path"].endswith("policy-bundle/policy.d/10-site.toml")
    before = site.compiled.read_bytes()
    refused_by_hook(chroot)

    for kind, reason, bundle in refusals(site):
        status = chroot.status_bytes()
        code, out, err = site.install(bundle)
        assert code == 17 and out == "", (reason, out, err)
        assert err.startswith(f"gpuguard: error: {bundle}: refused ({kind}): {reason}") and err.count("\n") == 1, err
        assert site.compiled.read_bytes() == before, reason
        assert chroot.status_bytes() == status
        refused_by_hook(chroot)
        state = read_bundle_state(str(site.state / "policy-bundle/state.json"))
        assert state.serial == 10 and state.refused is not None and state.refused.reason.startswith(reason)
        assert state.refused.kind == kind

    _, out, err = run("policy", "explain", "--root", str(chroot.root), "--config", str(site.config))
    assert out.splitlines()[0] == f"policy source: bundle serial 10 from file, key {site.signer.fingerprint}", err
