"""The hot path's re-free globs match exactly as fnmatch.fnmatchcase does."""

from __future__ import annotations

import fnmatch

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.policy.globs import any_glob, glob_match, matched_by_some

# Few characters, so generated patterns often hit what matters: stars, classes, ranges, negation, stray brackets.
PATTERN_CHARS = st.sampled_from(list("ab-c*?[]!^\\z.") + ["[!", "[a-c]", "[!b]", "*-"])
# Bracket sets built on purpose: ranges in both directions, hyphens at the ends, "!" and "]" first.
CLASSES = st.builds(lambda neg, body: "[" + neg + body + "]", st.sampled_from(["", "!"]),
                    st.text(alphabet="abcz-]!^", min_size=0, max_size=6))
PATTERNS = st.lists(st.one_of(PATTERN_CHARS, CLASSES), max_size=7).map("".join)
TEXTS = st.text(alphabet="abcz-.[]!^\\*?", max_size=10)


@settings(max_examples=3000, deadline=None)
@given(PATTERNS, TEXTS)
def test_glob_match_agrees_with_fnmatchcase(pattern: str, text: str) -> None:
    """Every generated pattern and text: the same answer as fnmatch.fnmatchcase."""
    assert glob_match(text, pattern) == fnmatch.fnmatchcase(text, pattern), (pattern, text)


@settings(max_examples=500, deadline=None)
@given(st.lists(PATTERNS, max_size=4), TEXTS)
def test_any_glob_agrees_with_fnmatchcase(patterns: list, text: str) -> None:
    """A set of patterns matches when fnmatch says one of them does."""
    assert any_glob(patterns)(text) == any(fnmatch.fnmatchcase(text, p) for p in patterns), (patterns, text)


@settings(max_examples=500, deadline=None, derandomize=True)
@given(PATTERNS, st.lists(TEXTS, max_size=6))
def test_matched_by_some_agrees_with_fnmatchcase(pattern: str, texts: list) -> None:
    """A pattern matches some of the texts when fnmatch says it matches one of them (binary searches included)."""
    assert matched_by_some(texts)(pattern) == any(fnmatch.fnmatchcase(t, pattern) for t in texts), (pattern, texts)


@pytest.mark.parametrize("pattern,text,expected", [
    ("rocm*", "rocm-core", True),
    ("*-dkms", "amdgpu-dkms", True),
    ("*-dkms", "amdgpu-dkms-firmware", False),
    ("linux-image-6.8.0-4[0-3]-generic", "linux-image-6.8.0-42-generic", True),
    ("linux-image-6.8.0-4[0-3]-generic", "linux-image-6.8.0-44-generic", False),
    ("6.2.*", "6.2.2", True),
    ("[!a]mdgpu", "amdgpu", False),
    ("[z-a]", "m", False),          # a reversed range is empty
    ("[", "[", True),               # no closing bracket: a literal
    ("[]-[!--]", "-", False),       # merged ranges leave "!" first: fnmatch negates, and the hyphen is literal
    ("[]-[!--]", "a", True),
    ("a*b*c", "a-x-b-y-c", True),
    ("a*b*c", "a-x-c-y-b", False),
])
def test_package_globs_as_policies_write_them(pattern: str, text: str, expected: bool) -> None:
    """The globs policies really use, and fnmatch's edge cases."""
    assert glob_match(text, pattern) is expected
    assert fnmatch.fnmatchcase(text, pattern) is expected


@settings(max_examples=2000, deadline=None)
@given(CLASSES)
def test_bracket_sets_agree_with_fnmatchcase_on_every_character(pattern: str) -> None:
    """A generated bracket set against each character of its alphabet (random texts rarely hit one)."""
    for char in "abcdz-]!^[":
        assert glob_match(char, pattern) == fnmatch.fnmatchcase(char, pattern), (pattern, char)
