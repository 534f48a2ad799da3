"""Version validity as dpkg and rpm define it: a table, and dpkg_version_problem against the real dpkg."""

from __future__ import annotations

import shutil
import subprocess
from typing import Optional

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent.versions import dpkg_version_problem, rpm_version_problem
from tests import needs


@pytest.mark.parametrize("version,problem", [
    ("1:6.8.5.60202-2041575", None), ("6.2.2.60202-116~12", None), ("2:9.0.1378-2", None), ("1.0+dfsg-1.1", None),
    ("1.0-1-2", None), ("1:2:3", None), ("+5:1.0", None),
    ("1;6.8.5.60202-2041575.24.04", "invalid character in version number"),
    ("1.17.3-", "revision number is empty"), ("", "version string is empty"), ("1 0", "has embedded spaces"),
    ("x:1", "epoch in version is not number"), ("1:", "nothing after colon"), (":1", "epoch in version is empty"),
    ("a1", "does not start with digit"), ("-1", "version number is empty"),
    ("1.0-a_b", "invalid character in revision number"), ("99999999999:1", "epoch in version is too big"),
])
def test_dpkg_version_problems(version: str, problem: Optional[str]) -> None:
    """dpkg's parseversion errors and warnings, each with its own message."""
    found = dpkg_version_problem(version)
    assert (found is None) if problem is None else (found is not None and problem in found)


@pytest.mark.parametrize("evr,ok", [
    ("1:6.8.5.60202-2041575.el9", True), ("6.3.0.60300-39.el9", True), ("1.0^git1~rc2-1", True), ("1.0", True),
    ("1.0-", False), ("x:1.0-1", False), ("1;0-1", False), ("1.0-1 2", False), ("", False), ("1:", False),
    ("1..0-1", False), ("1.0-1..el9", False),
])
def test_rpm_version_problems(evr: str, ok: bool) -> None:
    """rpmbuild's rules on epoch, version and release."""
    assert (rpm_version_problem(evr) is None) is ok


def _dpkg_rejects(version: str) -> bool:
    result = subprocess.run(["dpkg", "--compare-versions", version, "eq", version], capture_output=True)
    return result.returncode > 1 or b"bad syntax" in result.stderr


VERSION_TEXT = st.text(alphabet="0123456789ab:-.+~;_ Zé", min_size=1, max_size=12) | st.from_regex(
    r"\A[0-9]{1,3}:[0-9][0-9a-z.+~-]{0,8}(-[0-9a-z.+~]{0,4})?\Z")


@pytest.mark.slow
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(version=VERSION_TEXT)
def test_dpkg_version_problem_agrees_with_real_dpkg(version: str) -> None:
    """Whatever dpkg --compare-versions calls bad syntax (error or warning) is a problem here, and only that."""
    if shutil.which("dpkg") is None:
        needs.unavailable("dpkg version checks", "dpkg is missing")
    assert (dpkg_version_problem(version) is not None) == _dpkg_rejects(version), version


@pytest.mark.parametrize("allow", [">= 1;6.8.5.60202-2041575.24.04", ">= 1.17.3-", "1.17.3-"])
def test_policy_check_refuses_versions_dpkg_and_rpm_reject(tmp_path, allow: str) -> None:  # type: ignore[no-untyped-def]
    """`policy check` (load_policy) names the bad version instead of letting the hook judge with it."""
    from agent.errors import PolicyError
    from agent.policy.load import load_policy

    path = tmp_path / "p.toml"
    path.write_text(f'[[versions]]\nname = "t"\npackages = ["nvidia-container-toolkit"]\nallow = "{allow}"\n')
    with pytest.raises(PolicyError) as info:
        load_policy(str(path))
    assert "neither a dpkg version" in str(info.value.problems)
