"""``gpuguard status --slurm``: should this node take jobs? The status assessment judged for Slurm, pure.

A node is drained for a real failure only: the daemon not running or its snapshot stale, the stack not compliant
with the pairing policy, a failed health check (regression, cpu_fallback, failed, timeout), a failed rollback, a
damaged state file. Never for a busy GPU (health ``busy`` or ``deferred``), a delivery backlog or an unreachable
hub: those are the hub's business. What is done with the verdict (drain, resume) is agent/integrations/slurm.py's.

After a reboot the maintenance hand-off asked Slurm for (hold phase ``rebooting``) this is the node's gate: it may
take jobs again only once it has booted since the ask, the policy is compliant and a health check that finished
after the boot passed; until then it stays drained (``reboot_gate`` "waiting"), and a failure keeps it out.
"""

from __future__ import annotations

import datetime as dt
from typing import Optional

from agent.integrations.slurm import EXIT_DRAIN, EXIT_OK, MAX_REASON_CHARS, SlurmVerdict
from agent.status.assess import Assessment, snapshot_stale
from agent.status.facts import StatusFacts
from agent.wire import FAILED_HEALTH_STATUSES, PASSED_HEALTH_STATUSES

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
    rebooting = facts.maintenance.phase == "rebooting"
    if rebooting:
        waiting = _reboot_waiting(facts)
        if waiting is not None:
            return SlurmVerdict(drain=True, exit_code=EXIT_DRAIN, reason=_one_line(waiting), reboot_gate="waiting")
    if failing:
        return SlurmVerdict(drain=True, exit_code=EXIT_DRAIN,
                            reason=_one_line("; ".join(f"{c.name}: {c.summary}" for c in failing)),
                            reboot_gate="judged" if rebooting else "none")
    shown = [c for c in assessment.checks if c.name in ("compliance", "health")]
    return SlurmVerdict(drain=False, exit_code=EXIT_OK,
                        reason=_one_line("; ".join(f"{c.name}: {c.summary}" for c in shown)),
                        reboot_gate="judged" if rebooting else "none")


def _reboot_waiting(facts: StatusFacts) -> Optional[str]:
    """Why the gate after an asked reboot cannot judge yet (not booted since the ask, no passing health check or
    no compliance verdict since the boot), or None when it can. Pure; typed fields only."""
    m = facts.maintenance
    if m.reboot_asked_at is None or m.booted_at is None or m.booted_at <= m.reboot_asked_at:
        return f"maintenance: waiting for the reboot Slurm was asked for ({m.reason})"
    h = facts.health
    if h.finished_at is None or h.finished_at <= m.booted_at:
        return f"health: no check since the boot at {m.booted_at:%Y-%m-%dT%H:%M:%SZ} yet"
    if h.status not in PASSED_HEALTH_STATUSES and h.status not in FAILED_HEALTH_STATUSES:
        return f"health: {h.status} since the boot (no verdict yet)"
    written = facts.metrics.written_at
    if facts.metrics.compliant is None or written is None or written <= m.booted_at:
        return "compliance: not known since the boot yet"  # the daemon's verdict on the stack that booted
    return None
