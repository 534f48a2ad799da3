"""When the daemon hands its node to the scheduler: a new policy bundle (the host is about to change under it)
begins the hand-off; the post-change health check ends it (pass, busy) or keeps the node out (a failure).

Both calls run in a job child (the policy fetch's, the health check's) and never raise: a scheduler that cannot
be reached is logged (``maintenance_failed``) and the job's own result stands. ``[integrations] scheduler = "none"``
(the default) makes both no-ops. A rollout that admits this host calls :func:`begin_for_change` with its own
reason ("rollout R stage 2").
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

from agent.errors import GpuguardError
from agent.log import get_logger

if TYPE_CHECKING:  # pragma: no cover
    from agent.config import Settings
    from agent.host import Host

log = get_logger("maintenance")


def begin_for_change(host: "Host", settings: "Settings", reason: str, wait_seconds: float = 0.0) -> Optional[str]:
    """Begin the hand-off before a change (by default without waiting: the drain runs while the change waits for
    its window); the outcome's line, or None when no scheduler is configured or the scheduler failed."""
    if settings.integrations.scheduler == "none":
        return None
    from agent.integrations.maintenance import begin_maintenance
    from agent.statepaths import StatePaths

    try:
        outcome = begin_maintenance(host, StatePaths(settings.agent.state_dir), settings.integrations,
                                    settings.report.nfd_features_file, reason, wait_seconds)
    except (GpuguardError, OSError) as exc:
        log.error("maintenance_failed", step="begin", reason=reason, error=str(exc))
        return None
    log.info("maintenance_begun", reason=reason, exit_code=outcome.exit_code, detail=outcome.line)
    return outcome.line


def end_after_check(host: "Host", settings: "Settings", health_status: str, summary: str = "") -> Optional[str]:
    """The post-change check's verdict on a held node (pass/busy give it back, a failure keeps it out); the
    outcome's line, or None when nothing was held, nothing judged, or the scheduler failed."""
    if settings.integrations.scheduler == "none":
        return None
    from agent.integrations.maintenance import after_check
    from agent.statepaths import StatePaths

    try:
        outcome = after_check(host, StatePaths(settings.agent.state_dir), settings.integrations,
                              settings.report.nfd_features_file, health_status, summary)
    except (GpuguardError, OSError) as exc:
        log.error("maintenance_failed", step="after_check", health_status=health_status, error=str(exc))
        return None
    if outcome is not None:
        log.info("maintenance_checked", health_status=health_status, exit_code=outcome.exit_code,
                 detail=outcome.line)
    return None if outcome is None else outcome.line
