"""compare_rpm against the real rpm: hypothesis-generated EVRs, judged by rpm.labelCompare of python3-rpm.

The rpm module exists only for /usr/bin/python3, so one worker process there answers batches of comparisons over
a pipe (one JSON line per batch). Locally the test is skipped when python3-rpm is missing; in CI it fails.
"""

from __future__ import annotations

from typing import Iterator, List, Tuple

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent.versions import compare_rpm, rpmvercmp
from tests.rpm_worker import RpmWorker, start_rpm_worker

pytestmark = pytest.mark.slow  # a real rpm worker process: left out of `make test-fast`

WORKER = r"""
import json, sys, rpm
for line in sys.stdin:
    pairs = json.loads(line)
    out = [rpm.labelCompare(tuple(a), tuple(b)) for a, b in pairs]
    sys.stdout.write(json.dumps(out) + "\n")
    sys.stdout.flush()
"""


@pytest.fixture(scope="module")
def real_rpm() -> Iterator[RpmWorker]:
    worker = start_rpm_worker(WORKER, "rpm ordering checks")
    yield worker
    worker.close()


# Segments rpm treats specially: digits (with leading zeros), letters, separators, ~ (sorts before everything,
# even the end) and ^ (sorts after the end, before anything else).
_PIECE = st.sampled_from(["0", "00", "1", "01", "2", "9", "10", "011", "a", "b", "Z", "rc", "beta", ".", "_", "+",
                          "~", "^", "~~", "^^", ".~", "~1", "^1", "el9", "fc41"])
VERSION = st.lists(_PIECE, min_size=1, max_size=6).map("".join).filter(lambda v: v[0] not in ":")
EPOCH = st.sampled_from(["", "0", "1", "2", "10"])


def _mutate(text: str, piece: str, where: int) -> str:
    i = where % (len(text) + 1)
    return text[:i] + piece + text[i:]


@st.composite
def evr_pairs(draw) -> List[Tuple[Tuple[str, str, str], Tuple[str, str, str]]]:
    """A batch of EVR pairs; half of them are a version and a small mutation of it, so ties and near-ties occur."""
    pairs = []
    for _ in range(draw(st.integers(20, 60))):
        ea, eb = draw(EPOCH), draw(EPOCH)
        va, ra = draw(VERSION), draw(VERSION)
        if draw(st.booleans()):
            vb = _mutate(va, draw(_PIECE), draw(st.integers(0, 20))) if draw(st.booleans()) else va
            rb = _mutate(ra, draw(_PIECE), draw(st.integers(0, 20))) if draw(st.booleans()) else ra
            eb = ea
        else:
            vb, rb = draw(VERSION), draw(VERSION)
        pairs.append(((ea, va, ra), (eb, vb, rb)))
    return pairs


def _evr(e: str, v: str, r: str) -> str:
    return f"{e}:{v}-{r}" if e else f"{v}-{r}"


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(evr_pairs())
def test_compare_rpm_agrees_with_rpm_label_compare(real_rpm: RpmWorker, pairs) -> None:
    """Full EVRs (a missing epoch is 0, as rpm reads a header without Epoch)."""
    expected = real_rpm.ask([((a[0] or "0", a[1], a[2]), (b[0] or "0", b[1], b[2])) for a, b in pairs])
    got = [compare_rpm(_evr(*a), _evr(*b)) for a, b in pairs]
    mismatches = [(_evr(*a), _evr(*b), g, e) for (a, b), g, e in zip(pairs, got, expected) if g != e]
    assert not mismatches, mismatches[:5]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(VERSION, VERSION), min_size=20, max_size=60))
def test_rpmvercmp_agrees_with_rpm_on_single_strings(real_rpm: RpmWorker, pairs) -> None:
    """rpmvercmp orders version strings exactly as the real rpm library does."""
    expected = real_rpm.ask([(("0", a, "1"), ("0", b, "1")) for a, b in pairs])
    got = [rpmvercmp(a, b) for a, b in pairs]
    assert [(a, b, g, e) for (a, b), g, e in zip(pairs, got, expected) if g != e] == []


@pytest.mark.parametrize("a,b,expected", [
    ("1.0~rc1-1", "1.0-1", -1), ("1.0^git1-1", "1.0-1", 1), ("1.0^git1-1", "1.0.1-1", -1), ("1:1.0-1", "2.0-1", 1),
    ("6.10.5.60300-1.el9", "6.8.5.60202-1.el9", 1), ("1.01-1", "1.1-1", 0), ("1.0a-1", "1.0.1-1", -1),
])
def test_known_orderings(real_rpm: RpmWorker, a: str, b: str, expected: int) -> None:
    """Hand-picked cases, checked against rpm too."""
    from agent.versions import parse_rpm

    (epoch_a, version_a, release_a), (epoch_b, version_b, release_b) = parse_rpm(a), parse_rpm(b)
    (real,) = real_rpm.ask([((str(epoch_a), version_a, release_a), (str(epoch_b), version_b, release_b))])
    assert compare_rpm(a, b) == real == expected


def test_missing_release_matches_any_release_like_an_rpm_dependency() -> None:
    """A policy bound without a release (``>= 1.17.3``) compares by version only, as rpm dependency ranges do."""
    assert compare_rpm("1.17.3", "1.17.3-1.el9") == 0 and compare_rpm("1.17.3-1.el9", "1.17.3") == 0
    assert compare_rpm("1.17.2", "1.17.3-1.el9") == -1
