"""The daemon's policy check: is the stack in a snapshot compliant with the compiled policy?

The daemon calls :func:`check_snapshot` after every snapshot (agent/daemon_jobs/hooks.py). It reads the compiled
policy from the state directory each time, so ``gpuguard policy compile`` (or a SIGHUP) takes effect at the next
snapshot; :func:`check_installed` is its judgement of an installed set, which the maintenance hand-off shares
(agent/daemon_jobs/handoff.py). Rolling back what slipped through is ``agent.guard.rollback.core.check_and_rollback``.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, List, Mapping, Optional

from agent.hostfacts.context import read_host_context
from agent.log import get_logger
from agent.policy.compiled import CompiledPolicy, read_compiled
from agent.policy.evaluate import HostState, evaluate, facts_used
from agent.report.events import PolicyViolation
from agent.statepaths import StatePaths

if TYPE_CHECKING:  # pragma: no cover
    from agent.snapshot.model import Snapshot

log = get_logger("policy.compliance")  # the logger name operators filter on, kept from its old home


def check_snapshot(snapshot: Snapshot, state_dir: str, root: str = "/") -> Optional[List[PolicyViolation]]:
    """Report payloads for every rule the snapshot's installed stack violates (empty: compliant).

    The compiled policy (from ``state_dir``, ``[agent] state_dir``) and the host context (OS, GPU targets, loaded
    modules) are read under ``root``, where and as the apt hook and the guard read them; the snapshot gives the
    installed packages. None when no policy is installed (compliance unknown, not "compliant"); a corrupt one
    raises InputFileError.
    """
    path = os.path.join(root, StatePaths(state_dir).compiled_policy.lstrip("/"))
    if not os.path.exists(path):
        log.debug("policy_absent", path=path)
        return None
    installed = {key: info.version for key, info in snapshot.packages().items()}
    return check_installed(read_compiled(path), installed, snapshot.package_manager or "dpkg", root)


def check_installed(policy: CompiledPolicy, installed: Mapping[str, str], manager: str,
                    root: str = "/") -> List[PolicyViolation]:
    """Report payloads for every rule an installed set (package key -> version, ``manager`` dpkg or rpm) violates
    under ``policy`` (empty: compliant), judged with the host context read under ``root``; pure but for that read,
    nothing rolled back. :func:`check_snapshot` and the maintenance hand-off (agent/daemon_jobs/handoff.py) share it.
    """
    state = HostState.standing(installed, manager, read_host_context(root, facts_used(policy)))
    return [PolicyViolation(rule=v.rule, message=v.message, packages=dict(v.packages), action=v.action)
            for v in evaluate(state, policy)]
