"""Judgement with a control (issue #43), the pure part: is a cohort's admitted group failing more than the same
cohort's hosts that were not admitted, over the same window, with a given confidence? No I/O.

A GPU fleet fails in the background (Xid errors, ECC, thermal, flaky nodes), so "any failure halts" halts on noise
and a tolerance hides a regression. As Kayenta, Gandalf and Google's canarying do, a rollout compares the changed
hosts with a control: per cohort, the admitted hosts' failures since their admission against the cohort's hosts
while not admitted (``rollout_plan.control_counts`` says who counts), with a one-sided Fisher exact test.

    JUDGE_ALPHA        the significance threshold of one evaluation: halt when, for a cohort, P(admitted failing at
                       least this much | no difference) is below JUDGE_ALPHA / (cohorts tested in the evaluation)
                       (Bonferroni: one evaluation of a harmless change halts with a chance of at most JUDGE_ALPHA,
                       however many cohorts; one-sided: a change that fails less is never halted)
    JUDGE_MIN_SAMPLE   a cohort is tested only when both groups have at least this many hosts; a smaller cohort is
                       judged by the absolute rule (any failing canary, more than ``halt_percent`` of a batch)

Both are the one home of these numbers (docs/hub.md "Judgement with a control" quotes them; a test holds it).
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

from agent.models import FrozenModel

JUDGE_ALPHA = 1e-4
JUDGE_MIN_SAMPLE = 20


def _log_comb(n: int, k: int) -> float:
    return math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)


def fisher_greater(failed_a: int, total_a: int, failed_b: int, total_b: int) -> float:
    """The one-sided Fisher exact test's p-value that group a fails more often than group b: under the hypothesis
    of no difference, the probability that a holds ``failed_a`` or more of the ``failed_a + failed_b`` failures
    (hypergeometric tail); 1.0 when a has no failure."""
    if not (0 <= failed_a <= total_a and 0 <= failed_b <= total_b):
        raise ValueError(f"fisher_greater: counts out of range ({failed_a}/{total_a}, {failed_b}/{total_b})")
    failures, hosts = failed_a + failed_b, total_a + total_b
    if failed_a == 0:
        return 1.0
    top = min(failures, total_a)
    log_all = _log_comb(hosts, total_a)
    logs = [_log_comb(failures, x) + _log_comb(hosts - failures, total_a - x) - log_all
            for x in range(failed_a, top + 1)]
    peak = max(logs)
    return min(1.0, math.exp(peak) * sum(math.exp(v - peak) for v in logs))


class CohortJudgement(FrozenModel):
    """One cohort judged: its admitted and control groups' counts, the test's p-value (None: a group is below
    ``JUDGE_MIN_SAMPLE``, so the absolute rule judged it), the threshold it was held to and whether the change is
    worse (p below the threshold)."""

    cohort: str
    admitted_failed: int
    admitted: int
    control_failed: int
    control: int
    p_value: Optional[float] = None
    threshold: Optional[float] = None
    worse: bool = False

    def line(self) -> str:
        """``cohort X: admitted 25/25 failed (100.0%) vs control 12/975 (1.2%), p=1e-40``: both rates and counts."""
        def rate(failed: int, total: int) -> str:
            return f"{failed}/{total} ({100.0 * failed / total:.1f}%)" if total else f"{failed}/0"
        verdict = (f"p={self.p_value:.2g}" + (f" < {self.threshold:.2g}" if self.worse else "")
                   if self.p_value is not None else f"not tested (under {JUDGE_MIN_SAMPLE} hosts a group)")
        return (f"cohort {self.cohort}: admitted {rate(self.admitted_failed, self.admitted)} failed vs control "
                f"{rate(self.control_failed, self.control)}, {verdict}")


def testable(admitted: int, control: int) -> bool:
    """Whether both groups reach ``JUDGE_MIN_SAMPLE`` hosts."""
    return admitted >= JUDGE_MIN_SAMPLE and control >= JUDGE_MIN_SAMPLE


def judge_cohort(cohort: str, admitted_failed: int, admitted: int, control_failed: int, control: int,
                 tested_cohorts: int = 1) -> CohortJudgement:
    """The cohort's judgement: tested when both groups have ``JUDGE_MIN_SAMPLE`` hosts, worse when p is below
    ``JUDGE_ALPHA / tested_cohorts`` (the evaluation's other tested cohorts share the alpha)."""
    if not testable(admitted, control):
        return CohortJudgement(cohort=cohort, admitted_failed=admitted_failed, admitted=admitted,
                               control_failed=control_failed, control=control)
    p_value = fisher_greater(admitted_failed, admitted, control_failed, control)
    threshold = JUDGE_ALPHA / max(tested_cohorts, 1)
    return CohortJudgement(cohort=cohort, admitted_failed=admitted_failed, admitted=admitted,
                           control_failed=control_failed, control=control, p_value=p_value, threshold=threshold,
                           worse=p_value < threshold)


def summary(judgements: Sequence[CohortJudgement]) -> str:
    """One line on every tested cohort: how many, the closest to a halt with both rates, and the untested count."""
    tested = sorted((j for j in judgements if j.p_value is not None), key=lambda j: (j.p_value, j.cohort))
    untested = len(judgements) - len(tested)
    parts = []
    if tested:
        parts.append(f"{len(tested)} cohorts judged against their control, closest: {tested[0].line()}")
    if untested:
        parts.append(f"{untested} cohorts under {JUDGE_MIN_SAMPLE} hosts a group judged by the absolute rule")
    return "; ".join(parts)
