"""Report events for a health result: a HealthRegression per regressed figure, a CpuFallback per fallback reason, a
HealthFailed for a failed or timed-out check."""

from __future__ import annotations

from typing import List, Union

from agent.health.model import HealthResult
from agent.report.events import CpuFallback, HealthFailed, HealthRegression

HealthPayload = Union[HealthRegression, CpuFallback, HealthFailed]


def payloads_for(result: HealthResult) -> List[HealthPayload]:
    """The events a result should raise; a pass, a skip, a busy or a deferred check raise none of these kinds."""
    fingerprint = result.fingerprint_id or "unknown"
    if result.status == "cpu_fallback":
        return [CpuFallback(reason=r.code, fingerprint=fingerprint, detail=r.message)
                for r in result.fallback_reasons]
    if result.status == "regression":
        return [HealthRegression(metric=r.metric, baseline_value=r.baseline_value, current_value=r.current_value,
                                 drop_fraction=r.drop_fraction, threshold_fraction=r.threshold_fraction,
                                 fingerprint=fingerprint,
                                 baseline_fingerprint=r.baseline_fingerprint or f"peers of {fingerprint}",
                                 gpu=str(r.gpu) if r.gpu is not None else None)
                for r in result.regressions]
    if result.status in ("failed", "timeout"):
        return [HealthFailed(status=result.status, summary=result.summary[:2000], fingerprint=fingerprint,
                             failures=[f[:500] for f in result.failures[:20]])]
    return []
