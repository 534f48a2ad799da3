"""Session sid root with a dnf5 installroot for the dnf5 guard and rollback tests; each test starts from the baseline.

Locally the suite is skipped (with the reason) when not root or without debootstrap; in CI (CI=true) those
conditions fail the run instead, so a green CI means dnf5 really ran.
"""

from __future__ import annotations

import io
import os
import time
from typing import Iterator, NoReturn

import pytest

from tests import needs
from tests.guard.dnf.dnf5.harness import BASELINE, INSTALLONLY_NAMES, Dnf5Root
from tests.guard.dnf.installroot.harness import install_specs
from tests.sidroot import SidRoot, build_base, missing_tools

TIMINGS: dict = {}


def _unavailable(reason: str) -> NoReturn:
    needs.unavailable("dnf5 tests", reason)


def compile_policy(root: Dnf5Root) -> None:
    """``gpuguard policy compile --root <sid>/ir`` from this process, as the dnf4 installroot tests do."""
    from agent.cli import main

    out = io.StringIO()
    assert main(["policy", "compile", "--root", str(root.root), "--config", "/nonexistent/agent.toml"], out=out) == 0, \
        out.getvalue()


@pytest.fixture(scope="session")
def dnf5_session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Dnf5Root]:
    if os.geteuid() != 0:
        _unavailable("they must run as root (debootstrap, chroot, mount)")
    missing = missing_tools()
    if missing:
        _unavailable(f"missing tools: {', '.join(missing)} (apt-get install debootstrap)")
    base = tmp_path_factory.mktemp("dnf5")
    started = time.monotonic()
    TIMINGS.update(build_base(base / "sid", use_cache=not needs.IN_CI))
    sid = SidRoot(base / "sid")
    try:
        sid.mount()
        root = Dnf5Root(sid)
        root.build_repo()
        root.install_gpuguard()
        compile_policy(root)
        result = root.dnf5("install", *install_specs(BASELINE), plugin=False)
        assert result.returncode == 0, result.stdout + result.stderr
        assert root.installed() == {**{k: v for k, v in BASELINE.items() if k not in INSTALLONLY_NAMES},
                                    "kernel@" + BASELINE["kernel"]: BASELINE["kernel"],
                                    "kernel-core@" + BASELINE["kernel-core"]: BASELINE["kernel-core"]}
        root.save()
        TIMINGS["setup_seconds"] = round(time.monotonic() - started, 1)
        print(f"\ndnf5 sid root ready: {TIMINGS}")
        yield root
    finally:
        sid.release(base)


@pytest.fixture
def dnf5_root(dnf5_session: Dnf5Root) -> Dnf5Root:
    """The session installroot reset to the baseline: packages, policy, compiled policy, gpuguard state."""
    dnf5_session.restore()
    dnf5_session.install_gpuguard()
    return dnf5_session
