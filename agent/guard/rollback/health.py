"""Health-gated rollback: put back the guarded packages recorded before a change the health check found broken.

The health gate (agent/guard/rollback/health_gate.py) keeps the last guarded set that passed a health check and
the package changes since. When the policy says ``[health] after_change = "rollback"`` and a check with changes
unjudged (or the check after a change) finds ``cpu_fallback`` or ``failed`` (or a confirmed ``regression``), the
health job calls :func:`rollback_before_change` with that set as ``target``; before anything passed, the set the
guard kept before the last compliant change (``known-good.before-change.json``,
:func:`agent.guard.rollback.core.keep_before_change`). The same plan, authorization, lock, apply,
``finish_pending`` and verification as the guard's rollback (core.plan_and_apply), with reason ``health``. Then:

- the kept set is used up (renamed ``.used``): one change gets one health rollback, never a retry;
- ``health-rollback.json`` records what was removed; a later change back to exactly that set is never rolled back
  to by health again (a rollback that did not fix the check must not ping-pong between two sets);
- a kernel module package that moved marks a reboot as needed: gpuguard's ``reboot-required`` in the state
  directory (``gpuguard status`` shows it) and, on dpkg hosts, Debian's ``/var/run/reboot-required`` with ``.pkgs``.

Side-by-side ROCm trees: the gate's set carries the active tree (``alternatives:core``, agent/guard/rollback/
repoint.py). When the packages are already the set to restore and only the tree moved, the alternative is pointed
back with ``update-alternatives --set`` instead (no package manager), and the Rollback event says ``method =
"repoint"``.
"""

from __future__ import annotations

import datetime as dt
import json
import os
from typing import TYPE_CHECKING, Any, Callable, Dict, Optional, Tuple

from agent.errors import InputFileError
from agent.files import decode_text, read_bytes_bounded, read_json_file, write_atomically
from agent.guard.rollback.backend import InstalledPackage, PackageBackend
from agent.guard.rollback.core import (
    GuardResult,
    _authorize,
    _faults,
    _module_packages_moved,
    _revoke,
    _versions,
    load_before_change,
    plan_and_apply,
)
from agent.guard.rollback.repoint import moved_trees, repoint, split, tree_key
from agent.host import Host
from agent.hostfacts.context import read_host_context
from agent.hostfacts.package_keys import package_name
from agent.log import get_logger
from agent.policy.evaluate import facts_used
from agent.statepaths import StatePaths

if TYPE_CHECKING:  # pragma: no cover
    from agent.policy.compiled import CompiledPolicy

log = get_logger("guard.health_rollback")

# Debian's marker (update-notifier, unattended-upgrades and needrestart read it), under the Host root.
DEBIAN_REBOOT_REQUIRED = "/var/run/reboot-required"
# The health statuses that ask for a rollback at once; a regression asks only once a second idle run confirms it.
ROLLBACK_STATUSES = frozenset({"cpu_fallback", "failed"})


def decide(after_change: str, status: str, confirmed: bool = False) -> str:
    """What a post-change health status asks for under the policy's ``after_change``: pure.

    "rollback", "confirm" (a regression: run the full check once more on an idle GPU first) or "none". Busy,
    deferred, timeout, skipped and pass never roll back: nothing was found broken.
    """
    if after_change != "rollback":
        return "none"
    if status in ROLLBACK_STATUSES:
        return "rollback"
    if status == "regression":
        return "rollback" if confirmed else "confirm"
    return "none"


def last_health_rollback(host: Host, paths: StatePaths) -> Optional[Dict[str, Any]]:
    """What the last health rollback removed and restored (None: none, or an unreadable record)."""
    try:
        data = read_json_file(str(host.path(paths.health_rollback)))
    except InputFileError as exc:
        log.warning("health_rollback_record_unreadable", error=str(exc))
        return None
    return data if isinstance(data, dict) else None


def rollback_before_change(host: Host, paths: StatePaths, backend: PackageBackend, health_status: str,
                           sink: Callable[[Any], None], policy: Optional["CompiledPolicy"] = None,
                           now: Optional[Callable[[], dt.datetime]] = None,
                           snapshot: Optional[Callable[[Host], object]] = None,
                           target: Optional[Dict[str, InstalledPackage]] = None, covers: str = "") -> GuardResult:
    """Restore the last set that passed (``target``, the health gate's) or, without one, the set kept before the
    last change; the Rollback event (reason ``health``, ``covers`` the changes its verdict covers) goes to ``sink``.

    Status ``rolled_back`` or ``failed`` (an event either way), or without an event: ``no_known_good`` (no set to
    restore), ``compliant`` (already that set), ``refused`` (it is the set a health rollback removed before),
    ``not_compliant`` (the policy in force forbids that set now).
    """
    from agent.policy.compiled import read_compiled

    clock = now or host.clock
    if policy is None:
        policy = read_compiled(str(host.path(paths.compiled_policy)))
    backend.wait_for_lock()
    which = "the last set that passed a health check" if target is not None else "the set kept before the change"
    previous = target if target is not None else load_before_change(host, paths)
    if previous is None:
        return GuardResult("no_known_good", detail="no known-good set was kept before the change: nothing to restore")
    previous, trees = split(previous)
    moved = moved_trees(host, trees)
    if moved and _versions(backend.read_installed(policy.guarded)) == _versions(previous):
        return _repoint_back(host, paths, moved, health_status, sink, clock, which, covers)
    last = last_health_rollback(host, paths)
    if last is not None and last.get("from_versions") == _versions(previous):
        _use_up(host, paths)
        return GuardResult("refused", detail=f"{which} is the one a health rollback removed "
                                             f"at {last.get('at')}: not rolled back to it again")
    current = backend.read_installed(policy.guarded)
    if _versions(current) == _versions(previous):
        _use_up(host, paths)
        return GuardResult("compliant", detail=f"the installed set is already {which}")
    if target is not None:
        faults = _faults(previous, backend, policy, read_host_context(str(host.root), facts_used(policy)))
        if faults:  # the policy moved since that set passed: never restore what it forbids now
            _use_up(host, paths)
            return GuardResult("not_compliant", detail=f"{which} violates the policy in force "
                                                       f"({', '.join(sorted({v.rule for v in faults}))}): not restored")
    targets, from_versions, to_versions = backend.plan_targets(previous, current)
    why = f"the health check after the package change found {health_status}"
    if covers:
        why = f"the health check found {health_status} after {covers}; restoring {which}"
    grant = _authorize(host, paths, previous, "health", clock())
    try:
        _use_up(host, paths)  # before apt runs: a crash mid-way must not lead to a second attempt
        outcome = plan_and_apply(host, policy, backend, paths, clock, False, snapshot, previous, [], "health", why,
                                 targets, from_versions, to_versions, sink=sink, health_status=health_status)
    finally:
        _revoke(host, paths, grant)
    record = {"at": clock().isoformat(), "health_status": health_status, "status": outcome.status,
              "from_versions": _versions(current), "to_versions": _versions(previous), "covers": covers[:4000]}
    write_atomically(str(host.path(paths.health_rollback)), json.dumps(record, indent=2, sort_keys=True) + "\n")
    if outcome.status == "rolled_back" and outcome.reboot_required and backend.manager == "dpkg":
        mark_debian_reboot_required(host, _module_packages_moved(list(from_versions)))
    log.warning("health_rollback", status=outcome.status, health_status=health_status, targets=targets,
                reboot_required=outcome.reboot_required)
    return outcome


def _repoint_back(host: Host, paths: StatePaths, moved: Dict[str, Tuple[str, str]], health_status: str,
                  sink: Callable[[Any], None], clock: Callable[[], dt.datetime], which: str,
                  covers: str) -> GuardResult:
    """The packages are already the set to restore but a side-by-side tree was repointed since: point each
    alternative back (agent/guard/rollback/repoint.py), no package manager; the Rollback event says repoint."""
    from agent.report.events import Rollback

    _use_up(host, paths)
    from_versions = {tree_key(name): now for name, (now, _tree) in moved.items()}
    to_versions = {tree_key(name): tree for name, (_now, tree) in moved.items()}
    failures = [why for why in (repoint(host, name, tree) for name, (_now, tree) in sorted(moved.items())) if why]
    status = "failed" if failures else "rolled_back"
    restored = ", ".join(f"{name} -> {tree}" for name, (_now, tree) in sorted(moved.items()))
    detail = (f"the health check found {health_status}" + (f" after {covers}" if covers else "")
              + f"; repointed the alternatives to {which} ({restored})"
              + (f": {'; '.join(failures)}" if failures else ""))
    sink(Rollback(reason="health", from_versions=from_versions, to_versions=to_versions, succeeded=not failures,
                  detail=detail[:4000], health_status=health_status, method="repoint"))
    record = {"at": clock().isoformat(), "health_status": health_status, "status": status, "method": "repoint",
              "from_versions": from_versions, "to_versions": to_versions, "covers": covers[:4000]}
    write_atomically(str(host.path(paths.health_rollback)), json.dumps(record, indent=2, sort_keys=True) + "\n")
    log.warning("health_rollback", status=status, health_status=health_status, method="repoint", trees=restored)
    return GuardResult(status, from_versions=from_versions, to_versions=to_versions, detail=detail)


def _use_up(host: Host, paths: StatePaths) -> None:
    where = str(host.path(paths.known_good_before_change))
    try:
        os.replace(where, where + ".used")
    except FileNotFoundError:
        pass


def mark_debian_reboot_required(host: Host, packages: Any) -> None:
    """Debian's /var/run/reboot-required, and the package names added to its ``.pkgs`` (kept, not replaced)."""
    marker = host.path(DEBIAN_REBOOT_REQUIRED)
    try:
        marker.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(str(marker), "*** System restart required ***\n", mode=0o644)
        pkgs = host.path(DEBIAN_REBOOT_REQUIRED + ".pkgs")
        try:  # never blocks on a FIFO there; an unreadable list is replaced by the names we know
            known = decode_text(str(pkgs), read_bytes_bounded(str(pkgs))).split()
        except InputFileError:
            known = []
        names = [package_name(n) for n in packages]
        write_atomically(str(pkgs), "".join(f"{n}\n" for n in dict.fromkeys([*known, *names])), mode=0o644)
    except OSError as exc:  # gpuguard's own marker is written; Debian's is a courtesy to its tools
        log.warning("reboot_required_marker_failed", path=str(marker), error=exc.strerror or str(exc))
