"""``gpuguard status --slurm``: should this node take jobs? The status assessment judged for Slurm, pure.

A node is drained for a real failure only: the daemon not running or its snapshot stale, the stack not compliant
with the pairing policy, a failed health check (regression, cpu_fallback, failed, timeout), a failed rollback, a
damaged state file. Never for a busy GPU (health ``busy`` or ``deferred``), a delivery backlog or an unreachable
hub: those are the hub's business. What is done with the verdict (drain, resume) is agent/integrations/slurm.py's.
"""

from __future__ import annotations

import datetime as dt
from typing import Optional

from agent.integrations.slurm import EXIT_DRAIN, EXIT_OK, MAX_REASON_CHARS, SlurmVerdict
from agent.status.assess import Assessment, snapshot_stale
from agent.status.facts import StatusFacts

# The checks whose failure means jobs must not land here; outbox and hub trouble never drains a node.
DRAINING_CHECKS = ("daemon", "snapshot", "compliance", "health", "guard")


def _one_line(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= MAX_REASON_CHARS else text[:MAX_REASON_CHARS - 3] + "..."


def slurm_verdict(facts: StatusFacts, assessment: Assessment, now: Optional[dt.datetime] = None) -> SlurmVerdict:
    """Drain for a failing check in DRAINING_CHECKS or a stale snapshot; otherwise ok (busy included). Pure."""
    at = now or facts.gathered_at
    failing = [c for c in assessment.checks if c.name in DRAINING_CHECKS and c.state == "fail"]
    if snapshot_stale(facts, at):
        failing += [c for c in assessment.checks if c.name == "snapshot" and c not in failing]
    if failing:
        return SlurmVerdict(drain=True, exit_code=EXIT_DRAIN,
                            reason=_one_line("; ".join(f"{c.name}: {c.summary}" for c in failing)))
    shown = [c for c in assessment.checks if c.name in ("compliance", "health")]
    return SlurmVerdict(drain=False, exit_code=EXIT_OK,
                        reason=_one_line("; ".join(f"{c.name}: {c.summary}" for c in shown)))
