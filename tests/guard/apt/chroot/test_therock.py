"""ROCm built with TheRock under real apt and dpkg: a repository with two TheRock releases (7.13 and 10.0, meta
packages over versioned packages at exact = dependencies). On a TheRock host the snapshot reports the release,
`policy freeze` pins it, the upgrade of the meta packages to 10.0 and the removal of the base package are refused
with nothing changed, a second release side by side is judged, a classic 6.2 + TheRock 7.13 host is judged as
the sum of both, and a dpkg -i bypass to 10.0 is rolled back."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, Iterator, List

import pytest

from tests.guard.apt.chroot.conftest import gpuguard
from tests.guard.apt.chroot.harness import ROCM_62, ROCM_63, Chroot, FakePackage
from tests.guard.therock_packages import RELEASES, release_packages

pytestmark = pytest.mark.timeout(900)

V713, V10 = RELEASES["7.13"], RELEASES["10.0"]


def _debs(arch: str) -> List[FakePackage]:
    out = []
    for release, version in RELEASES.items():
        for pkg in release_packages(release):
            out.append(FakePackage(pkg.name, version, arch, ", ".join(f"{d} (= {version})" for d in pkg.depends)
                                   or None, files=pkg.files))
    return out


@pytest.fixture(scope="module")
def rock_repo(chroot_session: Chroot, tmp_path_factory: pytest.TempPathFactory) -> Iterator[List[Path]]:
    """Both TheRock releases added to the session repository for this module, taken out after it."""
    with chroot_session.packages_in_repo(_debs(chroot_session.native_arch),
                                         tmp_path_factory.mktemp("therock-debs")) as debs:
        yield debs


def _rocm(chroot: Chroot) -> Dict[str, str]:
    """Every ROCm package dpkg has in any present state, classic and TheRock."""
    return {name: version for name, version in chroot.present().items() if name.startswith(("rocm", "amdrocm"))}


@pytest.fixture
def rock(chroot: Chroot, rock_repo: List[Path]) -> Iterator[Chroot]:
    """The chroot with its test policy out of the way (its pairings would be alternatives to a frozen one); every
    amdrocm package purged and the policy files put back after the test."""
    policy_dir = chroot.root / "etc/gpuguard/policy.d"
    (policy_dir / "10-test.toml").unlink()
    try:
        yield chroot
    finally:
        names = [n for n in _rocm(chroot) if n.startswith("amdrocm")]
        if names:
            chroot.run("dpkg", "--purge", "--force-depends", *names, check=True)
        for extra in policy_dir.glob("*.toml"):
            extra.unlink()


def _freeze(chroot: Chroot) -> str:
    target = chroot.root / "etc/gpuguard/policy.d/50-freeze.toml"
    code, out = gpuguard(chroot, "policy", "freeze", "--output", str(target))
    assert code == 0, out
    code, out = gpuguard(chroot, "policy", "compile")
    assert code == 0, out
    return target.read_text()


def _refused(chroot: Chroot, rule: str, *args: str) -> None:
    before, packages = chroot.status_bytes(), _rocm(chroot)
    result = chroot.apt(*args)
    assert result.returncode == 100, (args, result.stdout + result.stderr)
    assert f"gpuguard: REFUSED ({rule})" in result.stderr, (args, result.stderr)
    assert chroot.status_bytes() == before and _rocm(chroot) == packages


def test_a_therock_host_is_reported_frozen_and_kept_on_its_release(rock: Chroot) -> None:
    """TheRock 7.13 alone: the snapshot reports it (tree, version file, libamd_smi.so.27, the pairing's
    releases), freeze pins 7.13.0; the meta packages' upgrade to 10.0, 10.0 side by side and removing
    amdrocm-base7.13 are refused with nothing changed; a policy that allows both releases side by side lets 10.0 in."""
    gone = rock.apt("remove", "rocm-hip-runtime", "rocm-core", hook=False)
    assert gone.returncode == 0, gone.stdout + gone.stderr
    got = rock.apt("install", f"amdrocm={V713}", f"amdrocm-core={V713}", f"amdrocm-core-sdk={V713}",
                   f"amdrocm-base={V713}", hook=False)
    assert got.returncode == 0, got.stdout + got.stderr
    assert _rocm(rock)["amdrocm-base7.13"] == V713 and "rocm-core" not in _rocm(rock)

    code, out = gpuguard(rock, "snapshot", "--json")
    assert code == 0, out
    snap = json.loads(out)
    assert snap["rocm"]["data"]["installs"] == [{"amd_smi_soname": "libamd_smi.so.27", "path": "/opt/rocm/core-7.13",
                                                 "version": "7.13.0"}]
    assert snap["rocm"]["data"]["version"] == "7.13.0"
    assert snap["dpkg"]["data"]["packages"]["amdrocm-core-sdk7.13"]["version"] == V713

    text = _freeze(rock)
    assert 'rocm = "7.13.0"  # ROCm release (amdrocm-base 7.13.0-1, amdrocm-base7.13 7.13.0-1)' in text
    assert '  "amdrocm-core-sdk7.13",  # installed 7.13.0-1' in text
    code, out = gpuguard(rock, "policy", "explain")
    assert code == 0 and out.splitlines()[-1] == "current state: compliant", out

    _refused(rock, "amd.pairing", "install", "amdrocm-core-sdk", "amdrocm-base", "amdrocm-core", "amdrocm")
    _refused(rock, "amd.pairing", "install", "amdrocm-core-sdk10.0")
    _refused(rock, "frozen", "remove", "amdrocm-base7.13")

    both = rock.root / "etc/gpuguard/policy.d/50-freeze.toml"
    both.write_text('[policy]\nname = "two"\n[amd]\nside_by_side = true\n[[amd.pairing]]\nname = "7.13+10.0"\n'
                    'amdgpu = "any"\nrocm = ["7.13.*", "10.0.*"]\n')
    code, out = gpuguard(rock, "policy", "compile")
    assert code == 0, out
    allowed = rock.apt("install", "amdrocm-core-sdk10.0")
    assert allowed.returncode == 0, allowed.stdout + allowed.stderr
    assert _rocm(rock)["amdrocm-base10.0"] == V10 and _rocm(rock)["amdrocm-base7.13"] == V713
    code, out = gpuguard(rock, "snapshot", "--json")
    assert [i["path"] for i in json.loads(out)["rocm"]["data"]["installs"]] == ["/opt/rocm/core-7.13",
                                                                               "/opt/rocm/core-10.0"]


def test_a_mixed_classic_and_therock_host_is_judged_as_the_sum(rock: Chroot) -> None:
    """Classic ROCm 6.2 (the baseline) beside TheRock 7.13: freeze pins both releases side by side; moving the
    classic stack to 6.3 or TheRock to 10.0 is refused with nothing changed."""
    got = rock.apt("install", f"amdrocm-core-sdk={V713}", f"amdrocm-base={V713}", hook=False)
    assert got.returncode == 0, got.stdout + got.stderr
    assert _rocm(rock)["rocm-core"] == ROCM_62 and _rocm(rock)["amdrocm-base7.13"] == V713
    text = _freeze(rock)
    assert 'rocm = ["6.2.2", "7.13.0"]' in text and "side_by_side = true" in text
    _refused(rock, "amd.pairing", "install", f"rocm-core={ROCM_63}", f"rocm-hip-runtime={ROCM_63}")
    _refused(rock, "amd.pairing", "install", "amdrocm-core-sdk", "amdrocm-base")


def test_a_dpkg_i_bypass_to_10_0_is_rolled_back(rock: Chroot) -> None:
    """On the mixed host frozen with action = rollback, dpkg -i --force-depends of amdrocm-base10.0 skips apt's
    hook; the watcher sees the broken pairing and removes it: the ROCm packages are as before."""
    got = rock.apt("install", f"amdrocm-core-sdk={V713}", f"amdrocm-base={V713}", hook=False)
    assert got.returncode == 0, got.stdout + got.stderr
    frozen = rock.root / "etc/gpuguard/policy.d/50-freeze.toml"
    _freeze(rock)
    frozen.write_text(frozen.read_text().replace('\naction = "block"', '\naction = "rollback"', 1))
    code, out = gpuguard(rock, "policy", "compile")
    assert code == 0, out
    (rock.state_dir / "known-good.json").unlink()  # TheRock went in without the hook: record the host as frozen
    assert _watch(rock).status == "recorded"
    before = _rocm(rock)
    deb = next(p for p in _debs(rock.native_arch) if p.name == "amdrocm-base10.0")
    forced = rock.run("dpkg", "-i", "--force-depends", f"/srv/repo/pool/{deb.file_name}")
    assert forced.returncode == 0, forced.stdout + forced.stderr
    assert _rocm(rock)["amdrocm-base10.0"] == V10
    result = _watch(rock)
    assert result.status == "rolled_back", result.summary()
    assert "amd.pairing" in {v.rule for v in result.violations}
    assert _rocm(rock) == before
    assert _watch(rock).status == "compliant"


def _watch(chroot: Chroot):
    """One run of the rollback watcher over the chroot (no snapshot)."""
    from agent.config import Settings
    from agent.host import Host
    from tests.guard.wiring import check

    return check(Host.for_root(str(chroot.root)), Settings(), snapshot=lambda host: None)
