"""dpkg and rpm version ordering, checked against tables and against the real dpkg."""

from __future__ import annotations

import shutil
import subprocess

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.versions import compare_dpkg, compare_rpm, parse_dpkg, parse_rpm, upstream_dotted

DPKG_TABLE = [
    ("1.0", "1.0", 0),
    ("1.0", "1.1", -1),
    ("1.0-1", "1.0-2", -1),
    ("1:1.0", "2.0", 1),
    ("1.0~rc1", "1.0", -1),
    ("1.0~rc1", "1.0~rc2", -1),
    ("1.0~~", "1.0~", -1),
    ("1.0", "1.0+b1", -1),
    ("1.0a", "1.0", 1),
    ("1.0.10", "1.0.9", 1),
    ("6.2.2.60202-116~22.04", "6.3.0.60300-39~22.04", -1),
    ("1:6.8.5.60202-2041575.22.04", "1:6.10.5.60300-2084815.22.04", -1),
    ("1:6.8.5.60202-2041575.22.04", "6.10.5.60300-2084815.22.04", 1),
    ("580.159.04-0ubuntu0.24.04.1", "580.95.05-0ubuntu1", 1),
    ("0.9", "00.9", 0),
    ("1.0-0", "1.0", 0),
]

RPM_TABLE = [
    ("1.0-1", "1.0-1", 0),
    ("1.0-1", "1.0-2", -1),
    ("1:1.0-1", "2.0-1", 1),
    ("1.0~rc1-1", "1.0-1", -1),
    ("1.0^git1-1", "1.0-1", 1),
    ("1.0^git1-1", "1.0.1-1", -1),
    ("1.0~rc1^git1-1", "1.0~rc1-1", 1),
    ("5.14.0-570.22.1.el9_6", "5.14.0-570.12.1.el9_6", 1),
    ("1.0a-1", "1.0-1", 1),
    ("1.0-1", "1.0", 0),
    ("1.01-1", "1.1-1", 0),
    ("2.0-1", "10-1", -1),
    ("a-1", "1-1", -1),
    ("7.0.2.70002-56.el9", "6.4.3.60403-128.el9", 1),
]


@pytest.mark.parametrize("a,b,expected", DPKG_TABLE)
def test_compare_dpkg_table(a: str, b: str, expected: int) -> None:
    """Each pair orders as dpkg orders it, in both directions."""
    assert compare_dpkg(a, b) == expected
    assert compare_dpkg(b, a) == -expected


@pytest.mark.parametrize("a,b,expected", RPM_TABLE)
def test_compare_rpm_table(a: str, b: str, expected: int) -> None:
    """Each pair orders as rpm orders it (epoch, ~ and ^ included), in both directions."""
    assert compare_rpm(a, b) == expected
    assert compare_rpm(b, a) == -expected


def test_parse_dpkg_splits_epoch_upstream_revision() -> None:
    """The last hyphen separates the revision; the epoch is numeric."""
    assert parse_dpkg("1:6.8.5.60202-2041575.22.04") == (1, "6.8.5.60202", "2041575.22.04")
    assert parse_dpkg("2.0-rc-1") == (0, "2.0-rc", "1")
    with pytest.raises(ValueError):
        parse_dpkg("x:1.0")


def test_parse_rpm_splits_epoch_version_release() -> None:
    """rpm EVR strings split into their three parts."""
    assert parse_rpm("3:575.51-1.el9") == (3, "575.51", "1.el9")
    assert parse_rpm("1.0") == (0, "1.0", "")


@pytest.mark.parametrize("version,parts,expected", [
    ("1:6.8.5.60202-2041575.22.04", 3, "6.8.5"),
    ("6.2.2.60202-116~22.04", None, "6.2.2.60202"),
    ("580.159.04-0ubuntu0.24.04.1", None, "580.159.04"),
    ("6.2.2-116", 3, "6.2.2"),
    ("none", None, None),
])
def test_upstream_dotted(version: str, parts, expected) -> None:
    """The dotted driver/ROCm number is pulled out of a package version."""
    assert upstream_dotted(version, parts) == expected


_version_chars = st.text(alphabet="0123456789.+~abz", min_size=1, max_size=8).filter(lambda s: s[0].isdigit())


@pytest.mark.skipif(shutil.which("dpkg") is None, reason="dpkg not installed")
@settings(max_examples=150, deadline=None)
@given(a=_version_chars, b=_version_chars, rev_a=st.sampled_from(["", "-1", "-1ubuntu1", "-0~1"]),
       rev_b=st.sampled_from(["", "-1", "-2", "-1~bpo1"]))
def test_compare_dpkg_agrees_with_real_dpkg(a: str, b: str, rev_a: str, rev_b: str) -> None:
    """Random versions order the same as `dpkg --compare-versions` says."""
    va, vb = a + rev_a, b + rev_b
    real_lt = subprocess.run(["dpkg", "--compare-versions", va, "lt", vb], check=False).returncode == 0
    real_eq = subprocess.run(["dpkg", "--compare-versions", va, "eq", vb], check=False).returncode == 0
    expected = -1 if real_lt else 0 if real_eq else 1
    assert compare_dpkg(va, vb) == expected
