"""ROCm and CUDA as Debian packages them, under real apt and dpkg on Debian 13 (trixie): HIP, ROCr, rocBLAS, hsakmt,
the CUDA runtime and cuBLAS from the archive (tests/guard/apt/chroot/trixie.py), frozen by ``gpuguard policy
freeze``; a move to sid's ROCm and a removal of rocBLAS are refused naming the packages, a forced removal of
libcublas12 is restored by ``gpuguard guard rollback`` (and ``policy explain`` says so first), pins keep sid's
builds out."""

from __future__ import annotations

import os
import shutil
import time
from typing import Dict, Iterator

import pytest

from tests import needs
from tests.guard.apt.chroot.conftest import gpuguard
from tests.guard.apt.chroot.harness import Chroot, missing_tools
from tests.guard.apt.chroot.trixie import build_trixie, configure_local_suites, deb_of

pytestmark = pytest.mark.timeout(900)

# What the test host has, as Debian 13 ships it (the versions of 2026-12-06).
STACK = {
    "libamdhip64-5": "5.7.1-6+deb13u1", "libhsa-runtime64-1": "6.1.2-3", "librocblas0": "5.5.1+dfsg-7",
    "libhsakmt1": "6.2.4+ds-1", "libamd-comgr2": "6.0+git20231212.4510c28+dfsg-3+b2",
    "libcudart12": "12.4.127~12.4.1-2", "libcublas12": "12.4.5.8~12.4.1-2", "libcublaslt12": "12.4.5.8~12.4.1-2",
}
SID_ROCM = ("libhsa-runtime64-1", "libamdhip64-6", "librocblas4", "libamd-comgr3", "libroctx64-4")
TIMINGS: Dict[str, float] = {}


def _gpu(chroot: Chroot) -> Dict[str, str]:
    """The GPU packages dpkg has in any present state (a half-installed one counts)."""
    return {n: v for n, v in chroot.present().items() if n in STACK or n in SID_ROCM}


def _assert_clean(chroot: Chroot) -> None:
    audit = chroot.run("dpkg", "--audit")
    assert audit.returncode == 0 and not audit.stdout.strip(), audit.stdout
    check = chroot.run("apt-get", "-o", "Dir::Cache::pkgcache=", "-o", "Dir::Cache::srcpkgcache=", "check")
    assert check.returncode == 0, check.stdout + check.stderr


@pytest.fixture(scope="module")
def trixie_session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Chroot]:
    """Debian 13 with Debian's ROCm and CUDA libraries installed (before gpuguard, as an operator had them), frozen
    into the only policy file, compiled, and recorded as known-good."""
    if os.geteuid() != 0:
        needs.unavailable("trixie chroot tests", "they must run as root (debootstrap, chroot, mount)")
    missing = missing_tools()
    if missing:
        needs.unavailable("trixie chroot tests", f"missing tools: {', '.join(missing)}")
    base = tmp_path_factory.mktemp("trixie")
    started = time.monotonic()
    TIMINGS.update(build_trixie(base / "root", base / "work", use_cache=not needs.IN_CI))
    chroot = Chroot(base / "root")
    try:
        chroot.mount()
        configure_local_suites(chroot)
        chroot.install_gpuguard()
        policy_dir = chroot.root / "etc/gpuguard/policy.d"
        (policy_dir / "10-test.toml").unlink()  # the bookworm harness's AMD pairings: this host is frozen instead
        installed = chroot.apt("install", *(f"{n}={v}" for n, v in STACK.items()), hook=False)
        assert installed.returncode == 0, installed.stdout + installed.stderr
        assert _gpu(chroot) == STACK
        frozen = policy_dir / "50-freeze.toml"
        code, out = gpuguard(chroot, "policy", "freeze", "--output", str(frozen))
        assert code == 0, out
        # the operator's one edit: what bypasses apt is undone, not only reported; set in the [frozen] table itself,
        # not appended: freeze writes [containers] after it
        text = frozen.read_text()
        header = text.index("\n[frozen]")
        line_end = text.index("\n", header + 1)
        frozen.write_text(text[:line_end + 1] + 'action = "rollback"\n' + text[line_end + 1:])
        code, out = gpuguard(chroot, "policy", "compile")
        assert code == 0, out
        code, out = gpuguard(chroot, "guard", "rollback")
        assert code == 0 and "recorded" in out, out
        shutil.copytree(chroot.state_dir, base / "baseline-state")
        TIMINGS["setup_seconds"] = round(time.monotonic() - started, 1)
        print(f"\ntrixie chroot ready: {TIMINGS}")
        yield chroot
    finally:
        chroot.release(base)


@pytest.fixture
def trixie(trixie_session: Chroot) -> Chroot:
    """The session root back at the frozen stack: packages, gpuguard state, no pins."""
    c = trixie_session
    for pref in (c.root / "etc/apt/preferences.d").glob("gpuguard-*"):
        pref.unlink()
    shutil.rmtree(c.state_dir, ignore_errors=True)
    shutil.copytree(c.root.parent / "baseline-state", c.state_dir)
    c.run("dpkg", "--configure", "-a")
    extra = [n for n in _gpu(c) if n not in STACK]
    if extra:
        c.run("dpkg", "--purge", "--force-depends", *extra, check=True)
    moved = [n for n, v in STACK.items() if _gpu(c).get(n) != v]
    if moved:
        c.run("dpkg", "-i", *(deb_of(c, "trixie", n) for n in moved), check=True)
    assert _gpu(c) == STACK
    return c


def test_freeze_covers_every_gpu_package(trixie: Chroot) -> None:
    """The frozen policy names every ROCm and CUDA library at its installed build and reads Debian's CUDA 12.4.1."""
    text = (trixie.root / "etc/gpuguard/policy.d/50-freeze.toml").read_text()
    for name, version in STACK.items():
        assert f'  "{name}",  # installed {version}' in text, name
    assert 'cuda = "12.4.1"' in text, text
    assert "ROCm as the distribution packages it" in text and "No GPU driver was found" not in text, text
    code, out = gpuguard(trixie, "policy", "explain")
    assert code == 0 and out.splitlines()[-1] == "current state: compliant", out


@pytest.mark.parametrize("package", ["libhsa-runtime64-1", "librocblas4"])
def test_a_move_to_sids_rocm_is_refused_naming_hip_rocr_and_rocblas(trixie: Chroot, package: str) -> None:
    """`apt-get install -t sid` of ROCr (whose sid build Breaks libamdhip64-5) or of sid's rocBLAS would replace
    HIP and rocBLAS: apt exits 100 before dpkg runs, every moved package is named, nothing changed."""
    before = trixie.status_bytes()
    plan = trixie.apt("install", "-s", "-t", "sid", package, hook=False)
    assert "Remv libamdhip64-5" in plan.stdout and "Remv librocblas0" in plan.stdout, plan.stdout
    result = trixie.apt("install", "-t", "sid", package)
    assert result.returncode == 100, result.stdout + result.stderr
    for name in ("libhsa-runtime64-1", "libamdhip64-5", "librocblas0"):
        assert f"{name} is frozen" in result.stderr, (name, result.stderr)
    assert "gpuguard: REFUSED (frozen)" in result.stderr, result.stderr
    assert trixie.status_bytes() == before


def test_removing_librocblas0_is_refused(trixie: Chroot) -> None:
    """`apt-get remove librocblas0`: refused by the frozen rule, the status file byte-identical."""
    before = trixie.status_bytes()
    result = trixie.apt("remove", "librocblas0")
    assert result.returncode == 100, result.stdout + result.stderr
    assert "gpuguard: REFUSED (frozen)" in result.stderr and "librocblas0 is frozen" in result.stderr, result.stderr
    assert trixie.status_bytes() == before


def test_a_forced_libcublas12_removal_is_restored(trixie: Chroot) -> None:
    """`dpkg -r --force-depends libcublas12` bypasses apt; `policy explain` says the state violates the policy,
    and `gpuguard guard rollback` installs the known-good build again: dpkg --audit empty, apt-get check clean."""
    forced = trixie.run("dpkg", "-r", "--force-depends", "libcublas12")
    assert forced.returncode == 0, forced.stderr
    assert "libcublas12" not in _gpu(trixie)
    code, out = gpuguard(trixie, "policy", "explain")
    assert code == 10 and "current state: 1 violation(s)" in out, out
    assert "frozen [rollback]: libcublas12 is frozen" in out, out
    assert "libcublas12 12.4.5.8~12.4.1-2 -> (removed)" in out, out
    code, out = gpuguard(trixie, "guard", "rollback")
    assert code == 0 and "rolled back" in out.replace("_", " "), out
    assert _gpu(trixie) == STACK
    _assert_clean(trixie)
    code, out = gpuguard(trixie, "guard", "rollback")
    assert "compliant" in out, out


def test_pins_keep_sids_builds_out(trixie: Chroot) -> None:
    """After `gpuguard pin apply`, even `apt-get install -t sid libhsa-runtime64-1` keeps trixie's build: the pins
    hold every frozen library, and nothing moves (apt exits 0 with nothing to do)."""
    code, out = gpuguard(trixie, "pin", "apply")
    assert code == 0, out
    policy = trixie.run("apt-cache", "policy", "libhsa-runtime64-1").stdout
    assert "Candidate: 6.1.2-3" in policy, policy
    result = trixie.apt("install", "-t", "sid", "libhsa-runtime64-1")
    assert result.returncode == 0, result.stdout + result.stderr
    assert _gpu(trixie) == STACK
    upgraded = trixie.apt("full-upgrade", "-t", "sid")
    assert upgraded.returncode == 0, upgraded.stdout + upgraded.stderr
    assert _gpu(trixie) == STACK


def test_a_forced_sid_rocr_is_rolled_back(trixie: Chroot) -> None:
    """`dpkg -i --force-depends --force-breaks` of sid's ROCr 6.4.3 (which Breaks libamdhip64-5) leaves apt-get
    check broken; `guard rollback` puts trixie's 6.1.2-3 back and the dependencies are whole again."""
    forced = trixie.run("dpkg", "-i", "--force-depends", "--force-breaks", deb_of(trixie, "sid", "libhsa-runtime64-1"))
    assert forced.returncode == 0, forced.stdout + forced.stderr
    assert _gpu(trixie)["libhsa-runtime64-1"] == "6.4.3+dfsg-5"
    assert trixie.run("apt-get", "-o", "Dir::Cache::pkgcache=", "check").returncode != 0
    code, out = gpuguard(trixie, "policy", "explain")
    assert code == 10 and "libhsa-runtime64-1 is frozen" in out, out
    code, out = gpuguard(trixie, "guard", "rollback")
    assert code == 0 and "rolled back" in out.replace("_", " "), out
    assert _gpu(trixie) == STACK
    _assert_clean(trixie)
