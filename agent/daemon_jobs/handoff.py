"""When the daemon hands its node to the scheduler: a bundle installed because a staged rollout admitted this host
(the host is about to change under it) begins the hand-off; the post-change health check ends it (pass, busy) or
keeps the node out (a failure). A bundle installed outside a rollout begins nothing: it reaches every host in its
scope at once, and draining them all would empty the whole partition, each node held until a package change that
may never come (a bundle that only tightens a rule changes no package). Such a bundle may end a rollout's hold,
though (:func:`end_unapplied_rollout`): when the rollout was aborted before this host changed, its revert (or the
previous policy under a new serial) arrives outside any admission, no package changes, no post-change check comes,
and the node would stay drained for good. A hold begun for a rollout (draining or held) is ended then when the
installed guarded packages comply with the policy now compiled (judged as the snapshot's policy check judges them,
``agent.report.compliance.check_installed``, nothing rolled back); when they violate it the guard rolls them back
and the post-change check after that ends it as usual; when they cannot be judged the hold stays (fail safe). A
kept hold (a failed check) and an operator's own hold are never ended here. Whose hold it is, is a typed field of
the hold (``rollout_id``, written only by :func:`begin_for_change` for an admitted host), never read from its
reason: an operator's ``gpuguard maintenance begin --reason "rollout R stage 2"`` is the operator's.

Both calls run in a job child (the policy fetch's, the health check's) and never raise: a scheduler that cannot
be reached is logged (``maintenance_failed``) and the job's own result stands. ``[integrations] scheduler = "none"``
(the default) makes both no-ops. A rollout that admits this host (the offer's ``admitted_stage``,
agent/bundle/rollout_fields.py) calls :func:`begin_for_change` with its id and a reason for people ("rollout R
stage 2"). Each later policy fetch calls :func:`poll_drain`: a hold still draining is
looked at once more and recorded as drained once Slurm shows it DRAINED (the apt hook and dnf checker refuse
guarded changes until then).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, List, Optional

from agent.errors import GpuguardError
from agent.log import get_logger

if TYPE_CHECKING:  # pragma: no cover
    from agent.bundle.rollout_fields import RolloutFields
    from agent.config import Settings
    from agent.host import Host
    from agent.integrations.maintenance import MaintenanceOutcome
    from agent.statepaths import StatePaths

log = get_logger("maintenance")

Step = Callable[["StatePaths"], "Optional[MaintenanceOutcome]"]


def _step(settings: "Settings", name: str, call: Step, **context: str) -> Optional[str]:
    """Run one hand-off step unless no scheduler is configured; its line, or None (nothing done, or it failed:
    logged, never raised)."""
    if settings.integrations.scheduler == "none":
        return None
    from agent.statepaths import StatePaths

    try:
        outcome = call(StatePaths(settings.agent.state_dir))
    except (GpuguardError, OSError) as exc:
        log.error("maintenance_failed", step=name, error=str(exc), **context)
        return None
    if outcome is None:
        return None
    log.info("maintenance_step", step=name, exit_code=outcome.exit_code, detail=outcome.line, **context)
    return outcome.line


def begin_for_change(host: "Host", settings: "Settings", reason: str, wait_seconds: float = 0.0,
                     rollout_id: Optional[str] = None) -> Optional[str]:
    """Begin the hand-off before a change (by default without waiting: the drain runs while the change waits for
    its window), for the rollout ``rollout_id`` (recorded in the hold: gpuguard's own) or None; the outcome's line,
    or None when no scheduler is configured or the scheduler failed."""
    from agent.integrations.maintenance import begin_maintenance

    return _step(settings, "begin", lambda paths: begin_maintenance(
        host, paths, settings.integrations, settings.report.nfd_features_file, reason, wait_seconds,
        rollout_id=rollout_id), reason=reason)


def after_fetch(host: "Host", settings: "Settings", outcome: str, rollout: "Optional[RolloutFields]",
                serial: Optional[int]) -> Optional[str]:
    """The hand-off after a policy fetch: an installed bundle whose offer's fields say a rollout admitted this host
    begins it (for that rollout id, "rollout R stage N" for people); anything else looks at a draining hold once
    more (:func:`poll_drain`)."""
    from agent.bundle.rollout_fields import handoff_reason

    if outcome == "installed" and rollout is not None and rollout.admitted_stage is not None:
        return begin_for_change(host, settings, handoff_reason(rollout, serial), rollout_id=rollout.rollout_id)
    if outcome == "installed":
        log.info("maintenance_not_begun", serial=serial, why="bundle installed outside a staged rollout")
        ended = end_unapplied_rollout(host, settings, serial)
        if ended is not None:
            return ended
    return poll_drain(host, settings)


def end_unapplied_rollout(host: "Host", settings: "Settings", serial: Optional[int]) -> Optional[str]:
    """After a bundle installed outside a rollout's admission (the rollout aborted, its revert or the previous
    policy under a new serial installed): a hold begun for a rollout (draining or held; a kept one waits for an
    operator) is ended when the installed guarded packages comply with the policy now compiled, since no package
    change, so no post-change check, is coming to end it; the end's line, or None (hold left as it is)."""
    if settings.integrations.scheduler == "none":
        return None
    from agent.integrations.hold import read_state
    from agent.statepaths import StatePaths

    paths = StatePaths(settings.agent.state_dir)
    try:
        state = read_state(host, paths)
    except (GpuguardError, OSError) as exc:
        log.error("maintenance_failed", step="end_unapplied_rollout", error=str(exc))
        return None
    if state is None or state.rollout_id is None:
        return None  # no hold, or an operator's own (gpuguard maintenance begin, whatever its reason): theirs to end
    if state.phase == "kept":
        log.info("maintenance_hold_kept", reason=state.reason, serial=serial,
                 why="kept out after a failed post-change check: an operator ends it (gpuguard maintenance end)")
        return None
    try:
        violations = _installed_violations(host, settings)
    except (GpuguardError, OSError) as exc:
        log.warning("maintenance_hold_kept", reason=state.reason, serial=serial, error=str(exc),
                    why="whether the installed packages comply is unknown: the hold stays (fail safe)")
        return None
    if violations:
        log.info("maintenance_hold_kept", reason=state.reason, serial=serial, rules=violations,
                 why="the installed packages violate the policy now in force: the guard rolls them back and the "
                     "post-change check that follows ends the hold")
        return None
    why = (f"{state.reason} no longer applies to this host: nothing changed (policy bundle serial {serial} "
           f"installed outside the rollout, and the installed guarded packages comply with it)")

    def end(step_paths: "StatePaths") -> "MaintenanceOutcome":
        from dataclasses import replace

        from agent.integrations.maintenance import end_maintenance

        ended = end_maintenance(host, step_paths, settings.integrations, settings.report.nfd_features_file)
        return replace(ended, line=f"{why}; {ended.line}")

    return _step(settings, "end_unapplied_rollout", end, reason=state.reason)


def _installed_violations(host: "Host", settings: "Settings") -> List[str]:
    """The rules (other than warn: those ask nothing of the guard) that the installed guarded packages violate
    under the compiled policy in the state directory, judged as the snapshot's policy check judges them (no
    rollback, no plan). A GpuguardError when the compiled policy or the package database is missing or damaged
    (InputFileError), or rpm cannot be asked."""
    from agent.guard.installed import detect_manager, read_installed
    from agent.policy.compiled import read_compiled
    from agent.report.compliance import check_installed
    from agent.statepaths import StatePaths

    policy = read_compiled(host.file(StatePaths(settings.agent.state_dir).compiled_policy))
    installed = {key: package.version for key, package in read_installed(host, policy.guarded).items()}
    return sorted({v.rule for v in check_installed(policy, installed, detect_manager(host), str(host.root))
                   if v.action != "warn"})


def poll_drain(host: "Host", settings: "Settings") -> Optional[str]:
    """A hold begun but still draining, looked at once (one ``scontrol show node`` round, no wait): records the
    node as drained once it is, so the held-back change may go ahead; its line, or None (no hold waiting, no
    scheduler, or the scheduler failed)."""
    from agent.integrations.maintenance import poll_drain as poll

    return _step(settings, "poll_drain", lambda paths: poll(
        host, paths, settings.integrations, settings.report.nfd_features_file))


def end_after_check(host: "Host", settings: "Settings", health_status: str, summary: str = "") -> Optional[str]:
    """The post-change check's verdict on a held node (pass/busy give it back, a failure keeps it out); the
    outcome's line, or None when nothing was held, nothing judged, or the scheduler failed."""
    from agent.integrations.maintenance import after_check

    return _step(settings, "after_check", lambda paths: after_check(
        host, paths, settings.integrations, settings.report.nfd_features_file, health_status, summary),
        health_status=health_status)
