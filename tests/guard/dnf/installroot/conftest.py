"""Session installroot for the dnf guard tests; each test starts from the baseline package set and state.

Locally the suite is skipped (with the reason) when dnf, rpm, rpmbuild, createrepo_c or the dnf Python module are
missing; in CI (CI=true) that fails the run instead, so a green CI means these tests really ran.
"""

from __future__ import annotations

import io
import shutil
import time
from pathlib import Path
from typing import Iterator, NoReturn, Tuple

import pytest

from tests import needs
from tests.guard.dnf.installroot.harness import (
    BASELINE,
    TEST_POLICY,
    Installroot,
    build_repo,
    install_specs,
    missing_tools,
)

TIMINGS: dict = {}


def _unavailable(reason: str) -> NoReturn:
    needs.unavailable("installroot tests", reason)


def gpuguard(root: Installroot, *argv: str) -> Tuple[int, str]:
    """Run the gpuguard CLI against the installroot (--root), returning (exit code, output)."""
    from agent.cli import main

    out = io.StringIO()
    code = main([*argv, "--root", str(root.root), "--config", "/nonexistent/agent.toml"], out=out)
    return code, out.getvalue()


def compile_policy(root: Installroot) -> None:
    code, out = gpuguard(root, "policy", "compile")
    assert code == 0, out


@pytest.fixture(scope="session")
def installroot_session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Installroot]:
    missing = missing_tools()
    if missing:
        _unavailable(f"missing: {', '.join(missing)} (apt-get install rpm dnf python3-dnf createrepo-c python3-rpm)")
    base = tmp_path_factory.mktemp("installroot")
    started = time.monotonic()
    repo = build_repo(base / "repo", base / "rpmbuild")
    TIMINGS["build_repo_seconds"] = round(time.monotonic() - started, 2)
    root = Installroot(base / "root", repo, base / "work")
    root.install_gpuguard(TEST_POLICY)
    compile_policy(root)
    root.dnf("install", *install_specs(BASELINE), plugin=False, check=True)
    root.save(base / "baseline")
    TIMINGS["setup_seconds"] = round(time.monotonic() - started, 2)
    print(f"\ninstallroot ready: {TIMINGS}")
    try:
        yield root
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def installroot(installroot_session: Installroot) -> Installroot:
    """The session installroot reset to the baseline: packages, policy, compiled policy, gpuguard state, config."""
    root = installroot_session
    root.restore(root.root.parent / "baseline")
    root.write_plugin_conf()
    return root


@pytest.fixture
def state_dir(installroot: Installroot) -> Path:
    return installroot.state_dir
