"""The control judgement's pure parts: the one-sided Fisher exact test against known values, and a cohort's verdict."""

from __future__ import annotations

from fractions import Fraction
from math import comb
from pathlib import Path

import pytest

from agent.hub.judge import JUDGE_ALPHA, JUDGE_MIN_SAMPLE, fisher_greater, judge_cohort, summary


def exact_tail(failed_a: int, total_a: int, failed_b: int, total_b: int) -> Fraction:
    failures, hosts = failed_a + failed_b, total_a + total_b
    return sum((Fraction(comb(failures, x) * comb(hosts - failures, total_a - x), comb(hosts, total_a))
                for x in range(failed_a, min(failures, total_a) + 1)), Fraction(0))


@pytest.mark.parametrize("table, p_value", [
    ((3, 4, 1, 4), 17 / 70),  # Fisher's lady tasting tea, one-sided
    ((9, 12, 1, 12), 3731 / 2704156),  # Wikipedia's dieting example: 0.001346 + 0.000034
    ((0, 10, 5, 10), 1.0),  # no failure in the admitted group: never worse
    ((10, 10, 0, 10), 1 / 184756),  # every admitted host failed, no control host did: 1 / C(20, 10)
])
def test_fisher_greater_matches_known_values(table: tuple, p_value: float) -> None:
    """The one-sided p-value matches published and closed-form values."""
    assert fisher_greater(*table) == pytest.approx(p_value, rel=1e-9)


@pytest.mark.parametrize("table", [(1, 25, 50, 2475), (5, 25, 50, 2475), (3, 30, 2, 40), (7, 200, 3, 90),
                                   (40, 500, 100, 2000), (2, 2, 0, 3)])
def test_fisher_greater_matches_exact_rational_arithmetic(table: tuple) -> None:
    """The lgamma sum agrees with the hypergeometric tail computed exactly with math.comb and fractions."""
    assert fisher_greater(*table) == pytest.approx(float(exact_tail(*table)), rel=1e-9)


def test_fisher_greater_refuses_counts_out_of_range() -> None:
    """More failures than hosts is a programming error, refused with the counts named."""
    with pytest.raises(ValueError, match="3/2"):
        fisher_greater(3, 2, 0, 5)


def test_a_broken_cohort_is_worse_and_background_noise_is_not() -> None:
    """25 of 25 admitted failing against 2 % of the control is worse; 1 of 25 against 2 % is not."""
    broken = judge_cohort("mi300x", 25, 25, 49, 2475)
    noise = judge_cohort("mi300x", 1, 25, 49, 2475)
    assert broken.worse and broken.p_value is not None and broken.p_value < JUDGE_ALPHA
    assert not noise.worse and noise.p_value is not None and noise.p_value > 0.3


def test_a_group_under_the_minimum_sample_is_not_tested() -> None:
    """A cohort with fewer than JUDGE_MIN_SAMPLE admitted or control hosts gets no p-value (the absolute rule
    judges it)."""
    small = judge_cohort("h100", JUDGE_MIN_SAMPLE - 1, JUDGE_MIN_SAMPLE - 1, 0, 500)
    thin_control = judge_cohort("h100", 5, 30, 0, JUDGE_MIN_SAMPLE - 1)
    assert small.p_value is None and not small.worse and thin_control.p_value is None
    assert f"under {JUDGE_MIN_SAMPLE} hosts" in small.line()


def test_the_line_and_summary_give_both_rates_and_counts() -> None:
    """A judgement's line names both groups' failures, sizes and rates; the summary names the closest cohort."""
    worse = judge_cohort("mi300x", 25, 25, 49, 2475)
    line = worse.line()
    assert "admitted 25/25 (100.0%) failed" in line and "control 49/2475 (2.0%)" in line and "p=" in line
    text = summary([judge_cohort("h100", 0, 25, 40, 2475), worse, judge_cohort("tiny", 0, 1, 0, 3)])
    assert text.startswith("2 cohorts judged against their control, closest: cohort mi300x")
    assert "1 cohorts under 20 hosts a group judged by the absolute rule" in text


def test_the_cohorts_of_one_evaluation_share_the_alpha() -> None:
    """With 8 cohorts tested, a cohort is worse only below JUDGE_ALPHA / 8 (Bonferroni), so one evaluation of a
    harmless change halts with a chance of at most JUDGE_ALPHA."""
    alone, shared = judge_cohort("c", 5, 25, 18, 1225), judge_cohort("c", 5, 25, 18, 1225, tested_cohorts=8)
    assert alone.p_value == shared.p_value and alone.p_value is not None
    assert JUDGE_ALPHA / 8 < alone.p_value < JUDGE_ALPHA
    assert alone.worse and not shared.worse and shared.threshold == JUDGE_ALPHA / 8


def test_docs_hub_quotes_the_threshold_and_minimum_sample() -> None:
    """docs/hub.md states JUDGE_ALPHA and JUDGE_MIN_SAMPLE with the values the code holds."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "hub.md").read_text(encoding="utf-8")
    assert f"**`JUDGE_ALPHA` = {JUDGE_ALPHA:g}**" in text
    assert f"**`JUDGE_MIN_SAMPLE` = {JUDGE_MIN_SAMPLE}**" in text
