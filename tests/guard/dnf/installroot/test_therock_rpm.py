"""ROCm built with TheRock under real dnf4 and rpm: a repository of two TheRock releases (7.13 and 10.0: versioned
amdrocm-*X.Y packages at exact ``=`` requires under the amdrocm, amdrocm-core, amdrocm-core-sdk and amdrocm-base meta
packages). The snapshot reports the release, `policy freeze` pins it, the upgrade to 10.0 (meta packages or 10.0
side by side) and the removal of the base package are refused with the rpm database unchanged, an rpm -U bypass is
rolled back, and a classic rocm-core 6.2 beside TheRock 7.13 is judged as the sum of both."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Dict, Iterator, List

import pytest

from tests.guard.dnf.installroot.conftest import compile_policy
from tests.guard.dnf.installroot.harness import AMDGPU_62, KERNEL_427, ROCM_62, FakeRpm, Installroot
from tests.guard.dnf.installroot.rollback_support import back_to_baseline, guard_check, host_for, own_installroot
from tests.guard.therock_packages import RELEASES, release_packages

pytestmark = pytest.mark.timeout(600)


def _evr(release: str) -> str:
    return RELEASES[release].split("-", 1)[0] + "-1.el9"  # rpm Version X.Y.Z; the Release is assumed


def _rpms(release: str) -> List[FakeRpm]:
    evr = _evr(release)
    return [FakeRpm(p.name, evr, "x86_64", requires=", ".join(f"{d} = {evr}" for d in p.depends) or None)
            for p in release_packages(release)]


E713, E10 = _evr("7.13"), _evr("10.0")
BASELINE = {"amdgpu-dkms": AMDGPU_62, **{p.name: p.evr for p in _rpms("7.13")}}
PLACEHOLDER = '[policy]\nname = "placeholder"\n[frozen]\npackages = ["hello-fake"]\n'


def _freeze(root: Installroot) -> str:
    """`gpuguard policy freeze --output` as the only policy file (read through the harness's rpm database), compiled."""
    from agent.cli import main

    policy_dir = root.root / "etc/gpuguard/policy.d"
    for old in policy_dir.glob("*.toml"):
        old.unlink()
    target = policy_dir / "50-freeze.toml"
    out = io.StringIO()
    code = main(["policy", "freeze", "--output", str(target), "--root", str(root.root), "--config",
                 "/nonexistent/agent.toml"], make_host=lambda _root: host_for(root), out=out)
    assert code == 0, out.getvalue()
    compile_policy(root)
    return target.read_text()


@pytest.fixture(scope="module")
def session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Installroot]:
    packages = [*_rpms("7.13"), *_rpms("10.0"), FakeRpm("amdgpu-dkms", AMDGPU_62),
                FakeRpm("rocm-core", ROCM_62, "x86_64"),
                FakeRpm("kernel-core", KERNEL_427, "x86_64", provides="installonlypkg(kernel)")]
    with own_installroot(tmp_path_factory, "therock-rpm", packages, PLACEHOLDER) as root:
        root.dnf("install", "amdgpu-dkms", "kernel-core", *(f"{m}-{E713}" for m in
                                                            ("amdrocm", "amdrocm-core", "amdrocm-core-sdk",
                                                             "amdrocm-base")), plugin=False, check=True)
        assert _versions(root) == BASELINE
        text = _freeze(root)
        assert 'rocm = "7.13.0"' in text, text
        result = guard_check(root)
        assert result.status == "recorded", result.summary()
        root.save(root.root.parent / "baseline")
        yield root


@pytest.fixture
def root(session: Installroot) -> Installroot:
    return back_to_baseline(session)


def _versions(root: Installroot) -> Dict[str, str]:
    return {k: v for k, v in root.installed().items() if k.startswith(("amdrocm", "amdgpu", "rocm"))}


def _refused(root: Installroot, rule: str, *args: str) -> str:
    before, versions = root.rpmdb_bytes(), _versions(root)
    result = root.dnf(*args)
    assert result.returncode == 1, result.stdout + result.stderr
    assert f"gpuguard: REFUSED ({rule})" in result.stderr, result.stderr
    assert _versions(root) == versions and root.rpmdb_bytes() == before
    return result.stderr


def test_the_snapshot_reports_the_therock_release(root: Installroot) -> None:
    """The rpm database's amdrocm-base7.13 gives the pairing its ROCm release, not "no ROCm"."""
    from agent.snapshot.pairing import pairing_of
    from agent.snapshot.take import take_snapshot

    pairing = pairing_of(take_snapshot(host_for(root)))
    assert pairing.rocm_releases == "7.13.0 (amdrocm-base), 7.13.0 (amdrocm-base7.13)"
    assert pairing.amdgpu_dkms_package == AMDGPU_62


def test_the_upgrade_to_10_0_is_refused_with_nothing_changed(root: Installroot) -> None:
    """dnf upgrade of the meta packages (10.0 pulled in beside 7.13) and dnf install of 10.0 side by side are
    refused by the pinned pairing, naming the 10.0 base package."""
    out = _refused(root, "amd.pairing", "upgrade", "amdrocm", "amdrocm-core", "amdrocm-core-sdk", "amdrocm-base")
    assert "amdrocm-base10.0 10.0.0-1.el9 (ROCm 10.0.0)" in out, out
    _refused(root, "amd.pairing", "install", "amdrocm-core-sdk10.0")


def test_removing_the_base_package_is_refused(root: Installroot) -> None:
    """dnf remove amdrocm-base7.13 (and everything requiring it) is refused with nothing changed."""
    _refused(root, "frozen", "remove", "amdrocm-base7.13")


def test_an_rpm_bypass_to_10_0_is_rolled_back(root: Installroot) -> None:
    """rpm -i --nodeps of amdrocm-base10.0 skips dnf and its plugin: under the frozen policy with action = rollback
    the watcher sees the broken pairing and removes what the known-good set does not have."""
    frozen = root.root / "etc/gpuguard/policy.d/50-freeze.toml"
    frozen.write_text(frozen.read_text().replace('\naction = "block"', '\naction = "rollback"', 1))
    compile_policy(root)
    new = next(p for p in _rpms("10.0") if p.name == "amdrocm-base10.0")
    forced = root.rpm("-i", "--nodeps", str(root.repo_dir / new.file_name))
    assert forced.returncode == 0, forced.stderr
    result = guard_check(root)
    assert result.status == "rolled_back", result.summary()
    assert "amd.pairing" in {v.rule for v in result.violations}
    assert _versions(root) == BASELINE
    assert guard_check(root).status == "compliant"


def test_a_mixed_classic_and_therock_host_is_judged_as_the_sum(root: Installroot) -> None:
    """rocm-core 6.2.2 installed beside TheRock 7.13 is refused by the 7.13 pairing; frozen with both, the next
    TheRock release is still refused."""
    _refused(root, "amd.pairing", "install", f"rocm-core-{ROCM_62}")
    added = root.dnf("install", f"rocm-core-{ROCM_62}", plugin=False)
    assert added.returncode == 0, added.stdout + added.stderr
    text = _freeze(root)
    assert 'rocm = ["6.2.2", "7.13.0"]' in text and "side_by_side = true" in text, text
    _refused(root, "amd.pairing", "upgrade", "amdrocm-base", "amdrocm-core-sdk")


def test_a_forced_newer_library_build_is_rolled_back_exactly(root: Installroot, tmp_path: Path) -> None:
    """rpm -U --nodeps of a newer amdrocm-runtime7.13 build that no repository offers (amdrocm-core7.13 requires
    the 7.13.0-1.el9 build exactly): under the frozen policy (action block) the watcher finds the rpm database
    inconsistent, never records it and restores the known-good build; rpm -Va --nofiles is clean after."""
    from tests.guard.dnf.installroot.harness import build_rpm

    newer = FakeRpm("amdrocm-runtime7.13", "7.13.0-2.el9", "x86_64", requires=f"amdrocm-base7.13 = {E713}")
    (tmp_path / "out").mkdir()
    (tmp_path / "work").mkdir()
    built = build_rpm(newer, tmp_path / "out", tmp_path / "work")
    forced = root.rpm("-U", "--nodeps", str(built))
    assert forced.returncode == 0, forced.stderr
    assert root.rpm("-Va", "--nofiles", "--nodigest", "--nosignature").returncode != 0  # amdrocm-core7.13 unmet
    result = guard_check(root)
    assert result.status == "rolled_back", result.summary()
    assert "dependencies_broken" in {v.rule for v in result.violations}
    assert _versions(root) == BASELINE
    verify = root.rpm("-Va", "--nofiles", "--nodigest", "--nosignature")
    assert verify.returncode == 0 and not verify.stdout.strip(), verify.stdout
    assert guard_check(root).status == "compliant"
