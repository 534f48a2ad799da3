"""Session chroot for the apt/dpkg integration tests; each test starts from the baseline package set.

Locally the suite is skipped (with the reason) when not root or when debootstrap and friends are missing; in CI
(CI=true) those conditions fail the run instead, so a green CI means the chroot tests really ran.
"""

from __future__ import annotations

import io
import os
import shutil
import time
from pathlib import Path
from typing import Iterator, NoReturn

import pytest

from tests import needs
from tests.guard.apt.chroot.harness import (
    BASELINE,
    FIRMWARE,
    KERNEL_27,
    KERNEL_28,
    Chroot,
    build_base,
    missing_tools,
)

TIMINGS: dict = {}


def _unavailable(reason: str) -> NoReturn:
    needs.unavailable("chroot tests", reason)


def gpuguard(chroot: Chroot, *argv: str) -> tuple:
    """Run the gpuguard CLI against the chroot (--root), returning (exit code, output)."""
    from agent.cli import main

    out = io.StringIO()
    code = main([*argv[:2], *argv[2:], "--root", str(chroot.root), "--config", "/nonexistent/agent.toml"], out=out)
    return code, out.getvalue()


@pytest.fixture(scope="session")
def chroot_session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Chroot]:
    if os.geteuid() != 0:
        _unavailable("they must run as root (debootstrap, chroot, mount)")
    missing = missing_tools()
    if missing:
        _unavailable(f"missing tools: {', '.join(missing)} (apt-get install debootstrap apt-utils dpkg-dev)")
    base = tmp_path_factory.mktemp("chroot")
    root = base / "root"
    started = time.monotonic()
    TIMINGS.update(build_base(root, use_cache=not needs.IN_CI))
    chroot = Chroot(root)
    try:
        chroot.mount()
        chroot.build_repo(base / "debs")
        chroot.install_gpuguard()
        code, out = gpuguard(chroot, "policy", "compile")
        assert code == 0, out
        result = chroot.apt("install", *(f"{n}={v}" for n, v in BASELINE.items()))
        assert result.returncode == 0, result.stdout + result.stderr
        code, out = gpuguard(chroot, "guard", "rollback")
        assert code == 0 and "recorded" in out, out
        shutil.copytree(chroot.state_dir, base / "baseline-state")
        TIMINGS["setup_seconds"] = time.monotonic() - started
        print(f"\nchroot ready: {TIMINGS}")
        yield chroot
    finally:
        chroot.release(base)


@pytest.fixture
def chroot(chroot_session: Chroot, tmp_path_factory: pytest.TempPathFactory) -> Chroot:
    """The session chroot reset to the baseline: packages, repository, policy, gpuguard state, pins."""
    c = chroot_session
    c.restore_repo()
    for pref in (c.root / "etc/apt/preferences.d").glob("gpuguard-*"):
        pref.unlink()
    c.install_gpuguard()
    baseline_state = c.root.parent / "baseline-state"
    shutil.rmtree(c.state_dir, ignore_errors=True)
    shutil.copytree(baseline_state, c.state_dir)
    # dpkg, not apt: a test may leave dependencies broken, and apt refuses to start from such a state
    c.run("dpkg", "--configure", "-a")
    installed = c.installed()
    if any(installed.get(n) != v for n, v in BASELINE.items()):
        c.run("dpkg", "-i", *(c.deb(n, v) for n, v in BASELINE.items()), check=True)
    present = c.run("dpkg-query", "-W", "-f", "${Package} ${db:Status-Abbrev}\n").stdout.splitlines()
    present_names = {line.split()[0] for line in present if len(line.split()) > 1 and line.split()[1][1] != "n"}
    extra = [k for k in (KERNEL_27, KERNEL_28, "hello-fake", FIRMWARE) if k in present_names]
    if extra:
        c.run("dpkg", "--purge", *extra, check=True)
    (c.state_dir / "reboot-required").unlink(missing_ok=True)
    (c.state_dir / "reboot-required.pkgs").unlink(missing_ok=True)
    return c


@pytest.fixture
def chroot_paths(chroot: Chroot) -> Path:
    return chroot.state_dir
