"""The maintenance hand-off: take this host's node from the scheduler before a change, give it back after the
post-change check passes, keep it out when the check fails.

    begin_maintenance(reason)      drain (Slurm) or label (Kubernetes), wait bounded until nothing runs there
    poll_drain()                   a hold still draining: look once more, record drained_at when it is drained
    end_maintenance()              give the node back, only when the hold is gpuguard's own
    after_check(status, summary)   the post-change health check's verdict: pass/busy end it (or, when the last
                                   snapshot says the change needs a reboot, ask Slurm for one), a failure keeps it
    after_boot(passed, why)        the gate after that reboot (gpuguard status --slurm --drain): give the node back
                                   or keep it out
    maintenance_status()           what this host holds now

The hold is written to ``<state_dir>/maintenance.json`` before the scheduler is asked, so a restart mid-change
knows it holds the node (and whether it drained it or found it drained by an operator, who then keeps it).
Which scheduler: ``[integrations] scheduler`` (none, slurm, kubernetes); with ``none`` every call is a no-op.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional

from agent.host import Host
from agent.integrations.handoff import HandoffStep, SchedulerHandoff
from agent.integrations.hold import MaintenanceState, clear_state, read_state, write_state
from agent.integrations.reboot import booted_at_seconds, read_reboot_needs
from agent.integrations.settings import IntegrationsSettings
from agent.statepaths import StatePaths
from agent.wire import FAILED_HEALTH_STATUSES, PASSED_HEALTH_STATUSES

EXIT_MAINTENANCE_OK = 0
EXIT_MAINTENANCE_NOT_READY = 40  # begin: jobs still run on the node after the wait (Slurm DRAINING)
EXIT_MAINTENANCE_KEPT = 41  # the post-change check failed: the node stays out of service
EXIT_MAINTENANCE_REBOOTING = 42  # Slurm was asked to reboot the node: it waits for the boot and the check after it
# Health statuses after which the node goes back (agent/wire.py PASSED_HEALTH_STATUSES); those that fail keep it out
# (FAILED_HEALTH_STATUSES); the rest (skipped, deferred) wait.
@dataclass(frozen=True)
class MaintenanceOutcome:
    """What a call did: the exit code, one line, and the hold after it (None: no hold)."""

    exit_code: int
    line: str
    state: Optional[MaintenanceState]


def node_for(host: Host, settings: IntegrationsSettings) -> str:
    """The node's name for the scheduler: the setting, $SLURMD_NODENAME, else the short host name."""
    from agent.integrations.slurm import node_name

    return node_name(host, settings.slurm_node_name)


def make_handoff(host: Host, settings: IntegrationsSettings, nfd_features_file: str,
                 reason: str = "", rollout_id: Optional[str] = None) -> Optional[SchedulerHandoff]:
    """The hand-off for ``[integrations] scheduler`` (for the hold's reason and rollout, None: an operator's);
    None for ``none``."""
    if settings.scheduler == "slurm":
        from agent.integrations.slurm_handoff import SlurmHandoff

        return SlurmHandoff(host, node_for(host, settings), poll_seconds=settings.drain_poll_seconds)
    if settings.scheduler == "kubernetes":
        from agent.integrations.kubernetes_handoff import KubernetesHandoff

        return KubernetesHandoff(host.file(nfd_features_file), host.clock, reason=reason, rollout_id=rollout_id)
    return None


def _line(scheduler: str, step: HandoffStep) -> str:
    state = f" [{step.scheduler_state}]" if step.scheduler_state else ""
    return f"gpuguard: maintenance: {scheduler}: {step.detail}{state}"


def begin_maintenance(host: Host, paths: StatePaths, settings: IntegrationsSettings, nfd_features_file: str,
                      reason: str, wait_seconds: Optional[float] = None,
                      rollout_id: Optional[str] = None) -> MaintenanceOutcome:
    """Hand the node to the scheduler before a change: 0 when nothing runs there any more, 40 when jobs still do
    after the wait (the hold stays; call again to wait more). A hold from before a restart is taken up again, as
    it is: an operator's hold stays the operator's. ``rollout_id``: the staged rollout whose admission begins it
    (gpuguard's own hand-off only; ``gpuguard maintenance begin`` never passes one)."""
    previous = read_state(host, paths)
    if previous is not None and previous.phase == "kept":
        return MaintenanceOutcome(EXIT_MAINTENANCE_KEPT, f"gpuguard: maintenance: node {previous.node} is kept out "
                                  f"of service: {previous.detail}; end it first", previous)
    owner = rollout_id if previous is None else previous.rollout_id
    handoff = make_handoff(host, settings, nfd_features_file, reason if previous is None else previous.reason, owner)
    if handoff is None:
        return MaintenanceOutcome(EXIT_MAINTENANCE_OK, "gpuguard: maintenance: no scheduler configured "
                                  "([integrations] scheduler = \"none\")", None)
    state = previous or MaintenanceState(handoff.name, node_for(host, settings), reason,
                                         host.clock().timestamp(), True, "draining", rollout_id=rollout_id)
    write_state(host, paths, state)  # before the scheduler is asked: a restart in between knows it may hold it
    step = handoff.begin(state.reason, settings.drain_wait_seconds if wait_seconds is None else wait_seconds)
    drained_by_us = step.drained_by_us and (previous is None or previous.drained_by_us)
    drained_at = (state.drained_at_seconds or host.clock().timestamp()) if step.ready else None
    state = replace(state, drained_by_us=drained_by_us, phase="held" if step.ready else "draining",
                    detail=step.detail, drained_at_seconds=drained_at)
    write_state(host, paths, state)
    return MaintenanceOutcome(EXIT_MAINTENANCE_OK if step.ready else EXIT_MAINTENANCE_NOT_READY,
                              _line(handoff.name, step), state)


def poll_drain(host: Host, paths: StatePaths, settings: IntegrationsSettings,
               nfd_features_file: str) -> Optional[MaintenanceOutcome]:
    """A hold still draining looked at once more, without waiting: the node recorded as drained (phase ``held``,
    ``drained_at_seconds``) once the scheduler shows nothing running, which lets the held-back change through the
    apt hook and dnf checker. None when there is no hold, or it is not draining."""
    state = read_state(host, paths)
    if state is None or state.phase != "draining":
        return None
    return begin_maintenance(host, paths, settings, nfd_features_file, state.reason, wait_seconds=0.0,
                             rollout_id=state.rollout_id)


def end_maintenance(host: Host, paths: StatePaths, settings: IntegrationsSettings,
                    nfd_features_file: str) -> MaintenanceOutcome:
    """Give the node back (resumed only when gpuguard drained it) and forget the hold."""
    state = read_state(host, paths)
    handoff = make_handoff(host, settings, nfd_features_file, state.reason if state else "",
                           state.rollout_id if state else None)
    if handoff is None:
        return MaintenanceOutcome(EXIT_MAINTENANCE_OK, "gpuguard: maintenance: no scheduler configured "
                                  "([integrations] scheduler = \"none\")", state)
    if state is None:
        return MaintenanceOutcome(EXIT_MAINTENANCE_OK, "gpuguard: maintenance: no hold to end", None)
    step = handoff.end(state.drained_by_us)
    clear_state(host, paths)
    return MaintenanceOutcome(EXIT_MAINTENANCE_OK, _line(handoff.name, step), None)


def booted_since_reboot_asked(host: Host, state: MaintenanceState) -> bool:
    """The machine booted after the hand-off asked Slurm to reboot it (unknown boot time: not yet)."""
    booted = booted_at_seconds(host)
    return state.reboot_asked_at_seconds is not None and booted is not None \
        and booted > state.reboot_asked_at_seconds


def after_check(host: Host, paths: StatePaths, settings: IntegrationsSettings, nfd_features_file: str,
                health_status: str, summary: str = "") -> Optional[MaintenanceOutcome]:
    """The post-change health check's verdict on a held node: pass or busy ends the hold, unless the last snapshot
    says a reboot is needed (agent/integrations/reboot.py): then Slurm is asked to reboot the node when idle, and the
    gate after the boot (:func:`after_boot`) gives it back; regression, cpu_fallback, failed or timeout keep the node
    out with the reason; no hold, no verdict, or a pass from before the asked reboot: None. A damaged snapshot
    raises (InputFileError): the hold stays."""
    state = read_state(host, paths)
    if state is None:
        return None
    if health_status in PASSED_HEALTH_STATUSES:
        if state.phase == "rebooting" and not booted_since_reboot_asked(host, state):
            return None  # a check from before the reboot judges the old kernel or module
        needs = read_reboot_needs(host.file(paths.last_snapshot))
        if needs:
            return _reboot(host, paths, settings, nfd_features_file, state, "; ".join(needs))
        return end_maintenance(host, paths, settings, nfd_features_file)
    if health_status not in FAILED_HEALTH_STATUSES:
        return None
    why = f"post-change check {health_status}" + (f": {summary}" if summary else "") + f" ({state.reason})"
    return _keep(host, paths, settings, nfd_features_file, state, why)


def _keep(host: Host, paths: StatePaths, settings: IntegrationsSettings, nfd_features_file: str,
          state: MaintenanceState, why: str) -> Optional[MaintenanceOutcome]:
    handoff = make_handoff(host, settings, nfd_features_file, state.reason, state.rollout_id)
    if handoff is None:
        return None
    step = handoff.keep(state.drained_by_us, why)
    kept = replace(state, drained_by_us=step.drained_by_us and state.drained_by_us, phase="kept", detail=why)
    write_state(host, paths, kept)
    return MaintenanceOutcome(EXIT_MAINTENANCE_KEPT, _line(handoff.name, step), kept)


def _reboot(host: Host, paths: StatePaths, settings: IntegrationsSettings, nfd_features_file: str,
            state: MaintenanceState, why: str) -> Optional[MaintenanceOutcome]:
    """Ask the scheduler to reboot the held node; a node already rebooted once for this hold that still needs one
    is kept out instead (no reboot loop); a scheduler that cannot reboot (Kubernetes) or a node drained by someone
    else ends the hold as before."""
    if state.reboot_asked_at_seconds is not None:
        return _keep(host, paths, settings, nfd_features_file, state,
                     f"still needs a reboot after the reboot: {why} ({state.reason})")
    handoff = make_handoff(host, settings, nfd_features_file, state.reason, state.rollout_id)
    if handoff is None:
        return None
    asked_at = host.clock().timestamp()
    step = handoff.reboot(state.drained_by_us, f"{why} ({state.reason})")
    if step is None:
        return end_maintenance(host, paths, settings, nfd_features_file)
    rebooting = replace(state, phase="rebooting", detail=step.detail, reboot_asked_at_seconds=asked_at)
    write_state(host, paths, rebooting)
    return MaintenanceOutcome(EXIT_MAINTENANCE_REBOOTING, _line(handoff.name, step), rebooting)


def after_boot(host: Host, paths: StatePaths, settings: IntegrationsSettings, nfd_features_file: str,
               passed: bool, why: str) -> Optional[MaintenanceOutcome]:
    """The gate after a reboot the hand-off asked for (``gpuguard status --slurm --drain``, the HealthCheckProgram):
    ``passed`` (compliant, and a health check after the boot passed) gives the node back; otherwise it is kept out
    with ``why``. None when there is no such hold, or the node has not booted since (nothing to judge yet)."""
    state = read_state(host, paths)
    if state is None or state.phase != "rebooting" or not booted_since_reboot_asked(host, state):
        return None
    if passed:
        return end_maintenance(host, paths, settings, nfd_features_file)
    return _keep(host, paths, settings, nfd_features_file, state, f"post-boot check: {why} ({state.reason})")


def maintenance_status(host: Host, paths: StatePaths) -> MaintenanceOutcome:
    """The hold as persisted: 0 none or held, 40 still draining, 41 kept after a failed check."""
    state = read_state(host, paths)
    if state is None:
        return MaintenanceOutcome(EXIT_MAINTENANCE_OK, "gpuguard: maintenance: none", None)
    code = {"kept": EXIT_MAINTENANCE_KEPT, "draining": EXIT_MAINTENANCE_NOT_READY,
            "rebooting": EXIT_MAINTENANCE_REBOOTING}.get(state.phase, EXIT_MAINTENANCE_OK)
    owner = "drained by gpuguard" if state.drained_by_us else "drained by someone else (not resumed by gpuguard)"
    return MaintenanceOutcome(code, f"gpuguard: maintenance: {state.scheduler} node {state.node}: {state.phase}, "
                              f"{owner}: {state.reason}" + (f"; {state.detail}" if state.detail else ""), state)
