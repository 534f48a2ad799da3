"""One rule for tests that need something this machine may lack (root, a tool, a server, a library).

Locally such a test is skipped with the reason; in CI (``CI=true``, set by .ci/run) it fails instead, so a green
CI means every test really ran. scripts/setup.sh --test installs everything these tests need.
"""

from __future__ import annotations

import os
from typing import NoReturn

import pytest

IN_CI = os.environ.get("CI", "").lower() == "true"


def unavailable(what: str, reason: str) -> NoReturn:
    """Skip (locally) or fail (in CI) the running test: ``what`` cannot run here because of ``reason``."""
    if IN_CI:
        pytest.fail(f"{what} cannot run in CI: {reason}", pytrace=False)
    pytest.skip(f"{what} need it: {reason}")
