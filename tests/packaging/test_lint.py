"""lintian and rpmlint on the built packages: every remaining finding is overridden with a written reason."""

from __future__ import annotations

from pathlib import Path
from typing import Dict

import pytest

from tests.packaging.conftest import REPO, need_tools, run


@pytest.mark.timeout(300)
def test_lintian_reports_nothing_unexplained(debian12: Dict[str, Path]) -> None:
    """lintian finds no error or warning beyond the overrides shipped in the packages (packaging/deb/*overrides)."""
    need_tools("lintian")
    result = run(["lintian", "--tag-display-limit", "0", str(debian12["gpuguard"]), str(debian12["gpuguard-hub"])],
                 check=False, timeout_seconds=280)
    findings = [line for line in result.stdout.splitlines() if line[:2] in ("E:", "W:")]
    assert findings == [], "\n".join(findings)
    assert result.returncode == 0, result.stdout + result.stderr


def test_lintian_overrides_are_all_explained() -> None:
    """Each override line follows a comment saying why (and there are override files and lines to check)."""
    paths = sorted((REPO / "packaging/deb").glob("*.lintian-overrides"))
    assert {p.name for p in paths} >= {"gpuguard.lintian-overrides", "gpuguard-hub.lintian-overrides"}, paths
    overrides = 0
    for path in paths:
        lines = path.read_text().splitlines()
        for number, line in enumerate(lines):
            if line and not line.startswith("#"):
                overrides += 1
                assert number > 0 and lines[number - 1].startswith("#"), f"{path.name}:{number + 1} has no reason"
    assert overrides > 0, "no override line found: the check above ran on nothing"


@pytest.mark.timeout(300)
def test_rpmlint_reports_nothing_unexplained(el9: Dict[str, Path]) -> None:
    """rpmlint with packaging/rpm/gpuguard.rpmlintrc: 0 errors, 0 warnings."""
    need_tools("rpmlint")
    result = run(["rpmlint", "--ignore-unused-rpmlintrc", "-r", str(REPO / "packaging/rpm/gpuguard.rpmlintrc"),
                  str(el9["gpuguard"]),
                  str(el9["gpuguard-hub"])], check=False, timeout_seconds=280)
    assert "0 errors, 0 warnings" in result.stdout, result.stdout
    assert result.returncode == 0
