"""A RHEL-9-like kernel set (kernel, kernel-core, kernel-modules-core, kernel-modules, kernel-modules-extra of one
build, tied by ``kernel-uname-r``) under real dnf4 and versionlock: after `gpuguard pin apply`, a routine
`dnf upgrade` (best=True, as RHEL 9's dnf.conf sets it) exits 0 and moves no kernel package."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Iterator, List

import pytest

from tests import needs
from tests.guard.dnf.installroot.conftest import compile_policy
from tests.guard.dnf.installroot.harness import FakeRpm, Installroot, build_repo, missing_tools, run
from tests.guard.dnf.installroot.rollback_support import agent_config, cli, enable_versionlock

pytestmark = pytest.mark.timeout(600)

OLD, NEW = "5.14.0-427.40.1.el9_4", "5.14.0-427.42.1.el9_4"
FAMILY = ("kernel-core", "kernel-modules-core", "kernel-modules", "kernel-modules-extra", "kernel")
POLICY = """\
[policy]
name = "rhel9-kernel"
[kernel]
allow = ["5.14.0-427.40.*"]
"""


def _kernel_rpms(evr: str) -> List[FakeRpm]:
    uname = f"kernel-uname-r = {evr}.x86_64"
    return [
        FakeRpm("kernel-core", evr, "x86_64", provides=f"installonlypkg(kernel), {uname}"),
        FakeRpm("kernel-modules-core", evr, "x86_64", provides="installonlypkg(kernel-module)",
                requires=f"kernel-uname-r = {evr}.x86_64"),
        FakeRpm("kernel-modules", evr, "x86_64", provides="installonlypkg(kernel-module)",
                requires=f"kernel-uname-r = {evr}.x86_64, kernel-modules-core = {evr}"),
        FakeRpm("kernel-modules-extra", evr, "x86_64", provides="installonlypkg(kernel-module)",
                requires=f"kernel-uname-r = {evr}.x86_64"),
        FakeRpm("kernel", evr, "x86_64", provides="installonlypkg(kernel)",
                requires=f"kernel-core = {evr}, kernel-modules = {evr}, kernel-modules-core = {evr}"),
    ]


@pytest.fixture(scope="module")
def rhel9(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Installroot]:
    """Its own repository and installroot (the session one has no kernel-modules): the 40.1 kernel installed,
    42.1 offered, and a harmless package with an update."""
    missing = missing_tools()
    if missing:
        needs.unavailable("installroot tests", f"missing: {', '.join(missing)}")
    base = tmp_path_factory.mktemp("rhel9-kernels")
    packages = [*_kernel_rpms(OLD), *_kernel_rpms(NEW), FakeRpm("hello-fake", "1.0-1"), FakeRpm("hello-fake", "1.1-1")]
    repo = build_repo(base / "repo", base / "rpmbuild", packages)
    root = Installroot(base / "root", repo, base / "work")
    root.install_gpuguard(POLICY)
    compile_policy(root)
    root.dnf("install", *(f"{name}-{OLD}" for name in FAMILY), "hello-fake-1.0-1", plugin=False, check=True)
    try:
        yield root
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _upgrade(root: Installroot, conf: Path) -> subprocess.CompletedProcess:
    """`dnf upgrade` with both versionlock and the gpuguard plugin loaded, best=True as on RHEL 9."""
    return run(["/usr/bin/dnf", "-c", str(conf), f"--installroot={root.root}", "--releasever=9", "-y",
                "--setopt=best=True", "upgrade"], root.env, check=False)


def _kernels(root: Installroot) -> List[str]:
    """Every installed build of the kernel family, as ``name-evr`` (straight from rpm)."""
    out = root.rpm("-q", "--qf", "%{NAME}-%{VERSION}-%{RELEASE}\n", *FAMILY, check=True).stdout
    return sorted(out.split())


def test_pin_apply_then_dnf_upgrade_exits_0_and_moves_no_kernel(rhel9: Installroot) -> None:
    """The excludes cover every package of the forbidden kernel build, not only kernel-core and kernel."""
    before = _kernels(rhel9)
    assert before == sorted(f"{name}-{OLD}" for name in FAMILY), before
    conf = enable_versionlock(rhel9)
    code, out = cli(rhel9, "pin", "apply", config=agent_config(rhel9))
    assert code == 0, out
    locklist = (rhel9.root / "etc/dnf/plugins/versionlock.list").read_text()
    for name in FAMILY:
        assert f"!{name}-0:{NEW}.*" in locklist, locklist
    upgraded = _upgrade(rhel9, conf)
    assert upgraded.returncode == 0, upgraded.stdout + upgraded.stderr
    assert _kernels(rhel9) == before
    assert rhel9.installed()["hello-fake"] == "1.1-1"  # the routine upgrade did its work
    check = run(["/usr/bin/dnf", "-c", str(conf), f"--installroot={rhel9.root}", "--releasever=9", "-q", "check"],
                rhel9.env, check=False)
    assert check.returncode == 0 and not check.stdout.strip(), check.stdout + check.stderr
