"""Version specs: parsing, matching with real dpkg/rpm ordering, and clear errors."""

from __future__ import annotations

import pytest

from agent.policy.spec import SpecError, matches, parse_entry, spec_errors


@pytest.mark.parametrize("spec,value,scheme,expected", [
    ("6.2.*", "6.2.2", "dpkg", True),
    ("6.2.*", "6.3.0", "dpkg", False),
    (["6.2.*", "6.3.*"], "6.3.0", "dpkg", True),
    (">= 1:6.8.5.60202, << 1:6.10", "1:6.8.5.60202-2041575", "dpkg", True),
    (">= 1:6.8.5.60202", "6.12.12.60400-1", "dpkg", False),  # the epoch wins
    ("<< 6.3.0~rc1", "6.3.0~beta", "dpkg", True),  # ~ sorts before anything
    ("<< 6.3.0", "6.3.0~rc1", "dpkg", True),
    ("= 6.2.2.60202-116~12", "6.2.2.60202-116~12", "dpkg", True),
    ("6.2.2.60202-116~12", "6.2.2.60202-116~13", "dpkg", False),
    ("!= 1.0", "1.0", "dpkg", False),
    (">= 1.17.3, << 1.18", "1.17.10-1", "dpkg", True),
    (">= 6.1.0-26-amd64, << 6.1.0-28", "6.1.0-27-amd64", "release", True),
    (">= 6.8.0-40-generic, << 6.8.0-44-generic", "6.8.0-44-generic", "release", False),
    (">= 6.2.0, << 6.3", "6.2.4", "release", True),
    (">= 6.12.12-2187269.el9", "6.12.12-2187270.el9", "rpm", True),
    ("<< 1.0^git1", "1.0", "rpm", True),
    ("any", None, "dpkg", True),
    ("none", None, "dpkg", True),
    ("none", "1.0", "dpkg", False),
    ("*", None, "dpkg", False),
    ("6.1.0-2[67]-amd64", "6.1.0-27-amd64", "dpkg", True),
])
def test_matches(spec, value, scheme, expected) -> None:
    """Each spec of the table matches a version, a missing package or a kernel glob as the table says."""
    assert matches(spec, value, scheme) is expected


@pytest.mark.parametrize("text,fragment", [
    ("", "empty version spec"),
    ("< 6.3", "use << or <="),
    (">= ", "needs a version"),
    (">= 6.*", "not a glob"),
    (">= 1.0 << 2.0", "no spaces"),
    ("x:1.0", "epoch"),
    (">= 1.0,", "empty constraint"),
])
def test_bad_entries(text: str, fragment: str) -> None:
    """A bad spec entry is a SpecError whose message says what is wrong."""
    with pytest.raises(SpecError) as info:
        parse_entry(text)
    assert fragment in str(info.value)


def test_spec_errors_lists_every_bad_entry() -> None:
    """spec_errors lists every bad entry of a list, and an empty list is one error."""
    assert len(spec_errors(["< 1", "6.2.*", "> 2"])) == 2
    assert spec_errors([]) == ["empty list: give at least one version spec (or 'any')"]
