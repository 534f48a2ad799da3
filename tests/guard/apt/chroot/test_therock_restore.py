"""TheRock restored right under real apt and dpkg (issue 40): a repository with TheRock 7.14 and 10.0 shaped as AMD
ships them (versioned packages at exact = dependencies inside a release, the generic metas ``amdrocm``,
``amdrocm-core``, ``amdrocm-core-sdk``, ``amdrocm-base``, per-target metas in both published forms). A forced newer
build of one library that no repository offers is rolled back exactly; a dependency-broken set is never recorded
as known-good; ``pin apply`` keeps a pinned 7.14 host where it is through upgrade and full-upgrade."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, Iterator, List, Optional

import pytest

from agent.config import Settings
from agent.guard.rollback.core import GuardResult
from agent.host import Host
from tests.guard.apt.chroot.conftest import gpuguard
from tests.guard.apt.chroot.harness import Chroot, FakePackage, build_deb
from tests.guard.wiring import check

pytestmark = pytest.mark.timeout(900)

RELEASES = {"7.14": "7.14.0-1", "10.0": "10.0.0-4"}
TARGET = "gfx94x"
# versioned component -> the components of its release it depends on (exactly this build)
COMPONENTS = (("sysdeps", ()), ("base", ("sysdeps",)), ("runtime", ("base",)), ("amdsmi", ("base",)),
              ("blas", ("base", "runtime")), ("core", ("base", "runtime", "amdsmi", "blas")), ("core-sdk", ("core",)))
FORCED_BLAS = "7.14.0-2"  # a newer build of amdrocm-blas7.14 that no repository offers


def release_debs(release: str, version: str, arch: str) -> List[FakePackage]:
    """One TheRock release: versioned packages under /opt/rocm/core-X.Y at exact = dependencies, the per-target
    metas (``amdrocm7.14-gfx94x``, ``amdrocm-core-sdk7.14-gfx94x``), and the generic and per-architecture metas
    without the release in their names (``amdrocm``, ``amdrocm-gfx94x``), each at the exact build."""
    prefix = f"/opt/rocm/core-{release}"
    files = {"base": ((f"{prefix}/.info/version", version.split("-")[0] + "\n"),),
             "amdsmi": ((f"{prefix}/lib/libamd_smi.so.27", "fake libamd_smi\n"),),
             "blas": ((f"{prefix}/lib/librocblas.so.5", f"fake rocblas {version}\n"),)}

    def exact(*names: str) -> str:
        return ", ".join(f"{n} (= {version})" for n in names)

    out = [FakePackage(f"amdrocm-{c}{release}", version, arch, exact(*(f"amdrocm-{d}{release}" for d in deps)) or None,
                       files=files.get(c, ())) for c, deps in COMPONENTS]
    out += [FakePackage(f"amdrocm{release}-{TARGET}", version, arch, exact(f"amdrocm-core{release}")),
            FakePackage(f"amdrocm-core-sdk{release}-{TARGET}", version, arch, exact(f"amdrocm-core-sdk{release}")),
            FakePackage("amdrocm-base", version, arch, exact(f"amdrocm-base{release}")),
            FakePackage("amdrocm-core", version, arch, exact(f"amdrocm-core{release}")),
            FakePackage("amdrocm-core-sdk", version, arch, exact(f"amdrocm-core-sdk{release}")),
            FakePackage("amdrocm", version, arch, exact("amdrocm-core")),
            FakePackage(f"amdrocm-{TARGET}", version, arch, exact(f"amdrocm{release}-{TARGET}"))]
    return out


def all_debs(arch: str) -> List[FakePackage]:
    return [p for release, version in RELEASES.items() for p in release_debs(release, version, arch)]


@pytest.fixture(scope="module")
def rock_repo(chroot_session: Chroot, tmp_path_factory: pytest.TempPathFactory) -> Iterator[List[Path]]:
    """Both releases in the session repository for this module, taken out after it."""
    with chroot_session.packages_in_repo(all_debs(chroot_session.native_arch),
                                         tmp_path_factory.mktemp("therock-restore-debs")) as debs:
        yield debs


def amdrocm(chroot: Chroot) -> Dict[str, str]:
    """Every amdrocm package dpkg has in any present state."""
    return {n: v for n, v in chroot.present().items() if n.startswith("amdrocm")}


@pytest.fixture
def host714(chroot: Chroot, rock_repo: List[Path]) -> Iterator[Chroot]:
    """A TheRock-only 7.14 host (the classic test stack removed), frozen by ``policy freeze`` and recorded as
    known-good; every amdrocm package purged and the policy files put back after the test."""
    policy_dir = chroot.root / "etc/gpuguard/policy.d"
    (policy_dir / "10-test.toml").unlink()
    try:
        gone = chroot.apt("remove", "rocm-hip-runtime", "rocm-core", hook=False)
        assert gone.returncode == 0, gone.stdout + gone.stderr
        v = RELEASES["7.14"]
        got = chroot.apt("install", f"amdrocm={v}", f"amdrocm-core={v}", f"amdrocm-core-sdk={v}", f"amdrocm-base={v}",
                         f"amdrocm-{TARGET}={v}", f"amdrocm-core-sdk7.14-{TARGET}", hook=False)
        assert got.returncode == 0, got.stdout + got.stderr
        target = policy_dir / "50-freeze.toml"
        code, out = gpuguard(chroot, "policy", "freeze", "--output", str(target))
        assert code == 0, out
        code, out = gpuguard(chroot, "policy", "compile")
        assert code == 0, out
        (chroot.state_dir / "known-good.json").unlink()  # TheRock went in without the hook: record it now
        assert watch(chroot).status == "recorded"
        assert_clean(chroot)
        yield chroot
    finally:
        names = list(amdrocm(chroot))
        if names:
            chroot.run("dpkg", "--purge", "--force-depends", *names, check=True)
        for extra in policy_dir.glob("*.toml"):
            extra.unlink()


def watch(chroot: Chroot, settings: Optional[Settings] = None) -> GuardResult:
    """One run of the rollback watcher over the chroot (no snapshot), as the daemon's guard tick runs it."""
    return check(Host.for_root(str(chroot.root)), settings or Settings(), snapshot=lambda host: None)


def assert_clean(chroot: Chroot) -> None:
    audit = chroot.run("dpkg", "--audit")
    assert audit.returncode == 0 and not audit.stdout.strip(), audit.stdout
    checked = chroot.run("apt-get", "-o", "Dir::Cache::pkgcache=", "-o", "Dir::Cache::srcpkgcache=", "check")
    assert checked.returncode == 0, checked.stdout + checked.stderr


def force_newer_blas(chroot: Chroot, tmp_path: Path) -> None:
    """dpkg -i --force-depends of a newer amdrocm-blas7.14 build that is in no repository: the metas' exact
    dependencies on the 7.14.0-1 build are broken."""
    pkg = FakePackage("amdrocm-blas7.14", FORCED_BLAS, chroot.native_arch,
                      f"amdrocm-base7.14 (= {RELEASES['7.14']}), amdrocm-runtime7.14 (= {RELEASES['7.14']})",
                      files=(("/opt/rocm/core-7.14/lib/librocblas.so.5", "fake rocblas hotfix\n"),))
    deb = build_deb(pkg, chroot.root / "var/tmp", tmp_path)
    try:
        forced = chroot.run("dpkg", "-i", "--force-depends", f"/var/tmp/{deb.name}")
        assert forced.returncode == 0, forced.stdout + forced.stderr
    finally:
        deb.unlink()
    assert amdrocm(chroot)["amdrocm-blas7.14"] == FORCED_BLAS
    broken = chroot.run("apt-get", "-o", "Dir::Cache::pkgcache=", "check")
    assert broken.returncode != 0, broken.stdout  # the metas' exact dependencies are unmet


def events(chroot: Chroot) -> List[dict]:
    path = chroot.state_dir / "guard-events.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_a_forced_newer_library_build_is_rolled_back_exactly(host714: Chroot, tmp_path: Path) -> None:
    """dpkg -i --force-depends of a newer amdrocm-blas7.14 build no repository offers: gpuguard guard rollback
    restores the known-good build from its kept .deb (exit 0), dpkg --audit is empty and apt-get check clean, the
    dependencies_broken event says it was rolled back, and the next check is compliant."""
    before = amdrocm(host714)
    force_newer_blas(host714, tmp_path)
    code, out = gpuguard(host714, "guard", "rollback")
    assert code == 0 and "guard: rolled_back" in out, out
    assert amdrocm(host714) == before
    assert_clean(host714)
    kinds = [e for e in events(host714) if e["kind"] in ("dependencies_broken", "rollback")]
    assert [e["kind"] for e in kinds[-2:]] == ["dependencies_broken", "rollback"]
    assert kinds[-2]["action"] == "rollback" and kinds[-2]["to_versions"] == {"amdrocm-blas7.14": FORCED_BLAS}
    assert kinds[-1]["succeeded"] is True and kinds[-1]["to_versions"] == {"amdrocm-blas7.14": RELEASES["7.14"]}
    assert not (host714.state_dir / "rollback-authorization.json").exists()
    assert watch(host714).status == "compliant"


def test_a_dependency_broken_set_is_never_recorded_as_known_good(host714: Chroot, tmp_path: Path) -> None:
    """With rollback off, the forced build is not rolled back and not recorded, by the guard tick or by gpuguard
    guard rollback (exit 10): known-good.json stays byte-identical and a typed dependencies_broken event (action
    reported) is the last guard event, which gpuguard status shows as attention."""
    from agent.guard.settings import GuardSettings
    from agent.status.assess import assess
    from agent.status.facts import read_guard
    from tests.status.test_assess import healthy

    known_good = (host714.state_dir / "known-good.json").read_bytes()
    force_newer_blas(host714, tmp_path)
    result = watch(host714, Settings(guard=GuardSettings(rollback_enabled=False)))
    assert result.status == "inconsistent" and "not recorded as known-good" in result.detail, result.summary()
    assert (host714.state_dir / "known-good.json").read_bytes() == known_good
    assert amdrocm(host714)["amdrocm-blas7.14"] == FORCED_BLAS
    last = events(host714)[-1]
    assert last["kind"] == "dependencies_broken" and last["action"] == "reported"
    assert last["from_versions"] == {"amdrocm-blas7.14": RELEASES["7.14"]}
    guard = read_guard(str(host714.state_dir / "guard-events.jsonl"))
    checks = {c.name: c for c in assess(healthy(guard=guard)).checks}
    assert checks["guard"].state == "warn" and "dependencies broken" in checks["guard"].summary
    # The dry run plans the way back without changing anything.
    code, out = gpuguard(host714, "guard", "rollback", "--dry-run")
    assert code == 0 and "guard: planned" in out and "amdrocm-blas7.14" in out, out
    assert (host714.state_dir / "known-good.json").read_bytes() == known_good


PAIRED_714 = """\
[policy]
name = "therock-7.14"
action = "block"

[amd]
[[amd.pairing]]
name = "7.14"
amdgpu = "any"
rocm = "7.14.*"
"""


def test_pins_keep_a_pinned_7_14_host_through_upgrade_and_full_upgrade(host714: Chroot) -> None:
    """With 10.0 published and a 7.14 pairing policy, gpuguard pin apply pins the whole 10.0 family away (the
    generic amdrocm and per-architecture metas, the versioned release packages): apt-get upgrade and full-upgrade
    without the hook change nothing and remove nothing."""
    (host714.root / "etc/gpuguard/policy.d/50-freeze.toml").write_text(PAIRED_714)
    code, out = gpuguard(host714, "pin", "apply")
    assert code == 0, out
    pref = (host714.root / "etc/apt/preferences.d/gpuguard-forbidden.pref").read_text()
    ten = RELEASES["10.0"]
    for name in ("amdrocm", "amdrocm-core", "amdrocm-core-sdk", "amdrocm-base", f"amdrocm-{TARGET}",
                 "amdrocm-core10.0", "amdrocm-base10.0", "amdrocm-blas10.0", f"amdrocm10.0-{TARGET}",
                 f"amdrocm-core-sdk10.0-{TARGET}"):
        assert f"Package: {name}\nPin: version {ten}\nPin-Priority: -1\n" in pref, name
    before, status = amdrocm(host714), host714.status_bytes()
    for command in ("upgrade", "full-upgrade"):
        ran = host714.apt(command, hook=False)
        assert ran.returncode == 0, ran.stdout + ran.stderr
        assert "0 upgraded, 0 newly installed, 0 to remove" in ran.stdout, ran.stdout
        assert amdrocm(host714) == before and host714.status_bytes() == status
