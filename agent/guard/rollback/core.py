"""Catch what slipped past the package-manager guard (``dpkg -i``, ``rpm -U --force``) and roll it back.

The daemon calls :func:`check_and_rollback` whenever the package database changes; ``gpuguard guard rollback``
calls it by hand. It compares the installed guarded packages with the last known-good set in the state
directory. A compliant state becomes the new known-good set (and its package files are cached). A violation
whose action is ``rollback`` is planned (``apt-get -s``, ``dnf --assumeno``), run once the package database lock
is free, checked against the known-good versions, and recorded as a Rollback event; a reboot marker is written
when a kernel module package moved. What differs between apt/dpkg and dnf/rpm lives in agent.guard.rollback.backend.

When nothing changed since the known-good set but the policy in force moved under it (a revert bundle after an
aborted rollout, a tightened policy: the daemon also checks after a new compiled policy), a violation of the
installed set whose action is ``rollback`` rolls back to the set kept before the last change
(:func:`keep_before_change`), only when that set complies with the policy in force; the restored set becomes the
known-good one. Without such a set the result is ``violations`` (events recorded), never ``compliant``.
"""

from __future__ import annotations

import datetime as dt
import errno
import fnmatch
import json
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional

from agent.errors import InputFileError, StateWriteError
from agent.files import read_json_file, write_atomically
from agent.guard.hotpath.overrides import active_windows, audit, load_windows
from agent.guard.hotpath.state import append_json_line
from agent.guard.rollback.backend import InstalledPackage, PackageBackend, PlannedStep
from agent.guard.rollback.kept import KeptFile, ProgressSink
from agent.guard.settings import GuardSettings
from agent.host import Host
from agent.hostfacts.context import read_host_context
from agent.hostfacts.package_keys import package_name
from agent.log import get_logger
from agent.policy.compiled import KERNEL_MODULE_PACKAGES, CompiledPolicy
from agent.policy.evaluate import HostState, Violation, evaluate, facts_used
from agent.rollback_coverage import summarize, write_coverage
from agent.statepaths import StatePaths

log = get_logger("guard.rollback")
KNOWN_GOOD_FORMAT = 1


@dataclass
class GuardResult:
    """What one check found and did."""

    status: str  # compliant | recorded | inconsistent | no_known_good | violations | override | planned |
    #              rolled_back | failed
    violations: List[Violation] = field(default_factory=list)
    plan: List[PlannedStep] = field(default_factory=list)
    targets: List[str] = field(default_factory=list)
    from_versions: Dict[str, str] = field(default_factory=dict)
    to_versions: Dict[str, str] = field(default_factory=dict)
    reboot_required: bool = False
    detail: str = ""

    def summary(self) -> str:
        lines = [f"guard: {self.status}" + (f" ({self.detail})" if self.detail else "")]
        lines += [f"  violation ({v.rule}, {v.action}): {v.message}" for v in self.violations]
        lines += [f"  plan: {s.action} {s.package} {s.old_version or '-'} -> {s.new_version or '-'}" for s in self.plan]
        if self.reboot_required:
            lines.append("  a kernel module package changed: reboot needed")
        return "\n".join(lines) + "\n"


def load_known_good(host: Host, paths: StatePaths) -> Optional[Dict[str, InstalledPackage]]:
    """The last known-good set, None when none was recorded; InputFileError when the file is corrupt."""
    return _load_set(str(host.path(paths.known_good)))


def _load_set(where: str) -> Optional[Dict[str, InstalledPackage]]:
    try:
        data = read_json_file(where)  # bounded size and depth, strict UTF-8, no NaN
    except InputFileError as exc:
        raise InputFileError(where, f"corrupt known-good state ({exc.reason}); delete it to record the current "
                                    f"set again once the host is compliant") from None
    if data is None:
        return None
    try:
        if data.get("format") != KNOWN_GOOD_FORMAT:
            raise ValueError(f"format {data.get('format')!r} is not {KNOWN_GOOD_FORMAT}")
        return {name: InstalledPackage(str(item["version"]), str(item.get("arch", "")))
                for name, item in data["packages"].items()}
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise InputFileError(where, f"corrupt known-good state ({exc}); delete it to record the current set "
                                    f"again once the host is compliant") from None


def record_known_good(host: Host, paths: StatePaths, installed: Dict[str, InstalledPackage], now: dt.datetime,
                      backend: Optional[PackageBackend],
                      progress: Optional[ProgressSink] = None) -> Dict[str, KeptFile]:
    """Store ``installed`` as the known-good set, keep its package files and write the rollback coverage; the kept
    file per package key. A record whose rebuilds take more than a few seconds tells ``progress`` how far it is
    (default: ``known_good_progress`` log events)."""
    files: Dict[str, KeptFile] = {}
    field_name = "deb"
    if backend is not None:
        try:
            before_change = load_before_change(host, paths) or {}
        except InputFileError:
            before_change = {}  # the health-gated rollback reports it; keeping files must not stop on it
        files = backend.cache_known_good(installed, before_change, progress)
        field_name = backend.file_field
    packages = {}
    for k, v in sorted(installed.items()):
        kept = files.get(k, KeptFile(None))
        packages[k] = {"version": v.version, "arch": v.arch, field_name: kept.path, **kept.entry()}
    data = {"format": KNOWN_GOOD_FORMAT, "recorded_at": now.isoformat(), "packages": packages}
    write_atomically(str(host.path(paths.known_good)), json.dumps(data, indent=2, sort_keys=True) + "\n")
    coverage = write_coverage(str(host.path(paths.rollback_coverage)),
                              {k: {"version": v.version, "arch": v.arch, "path": files.get(k, KeptFile(None)).path,
                                   **files.get(k, KeptFile(None)).entry()} for k, v in installed.items()}, now)
    log.info("known_good_recorded", packages=len(installed), coverage=coverage.summary(),
             not_restorable=list(coverage.not_restorable), inexact=sorted(coverage.inexact))
    return files


def keep_before_change(host: Host, paths: StatePaths, known_good: Dict[str, InstalledPackage],
                       now: dt.datetime) -> None:
    """Keep the known-good set a compliant change is about to replace (docs/health.md "After a package change")."""
    data = {"format": KNOWN_GOOD_FORMAT, "recorded_at": now.isoformat(),
            "packages": {k: {"version": v.version, "arch": v.arch} for k, v in sorted(known_good.items())}}
    write_atomically(str(host.path(paths.known_good_before_change)), json.dumps(data, indent=2, sort_keys=True) + "\n")


def load_before_change(host: Host, paths: StatePaths) -> Optional[Dict[str, InstalledPackage]]:
    """The set kept by :func:`keep_before_change`, None when there is none; InputFileError when it is corrupt."""
    return _load_set(str(host.path(paths.known_good_before_change)))


def _uncached_note(files: Dict[str, KeptFile], backend: Optional[PackageBackend]) -> str:
    """The coverage of the recorded set, and what the operator must know when some package files could not be
    kept, or not exactly."""
    if backend is None:
        return ""
    note = "; " + summarize({k: {"path": kept.path, "source": kept.source} for k, kept in files.items()}).summary()
    capped = sorted(k for k, kept in files.items() if not kept.restorable and "kept_packages_max_bytes" in kept.reason)
    missing = sorted(k for k, kept in files.items() if not kept.restorable and k not in capped)
    inexact = sorted(k for k, kept in files.items() if kept.inexact)
    if capped:
        shown = ", ".join(capped[:5]) + (f" and {len(capped) - 5} more" if len(capped) > 5 else "")
        note += (f"; {len(capped)} not kept: {files[capped[0]].reason} ({shown})")
    if missing:
        shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        note += (f"; no package file could be kept for {len(missing)} of them ({shown}): no configured repository "
                 f"offers those versions now and they could not be rebuilt from the installed files")
    if inexact:
        shown = ", ".join(inexact[:5]) + (f" and {len(inexact) - 5} more" if len(inexact) > 5 else "")
        note += (f"; {len(inexact)} rebuilt inexactly ({shown}): files changed since installation "
                 f"(gpuguard status names them)")
    return note


def _versions(packages: Dict[str, InstalledPackage]) -> Dict[str, str]:
    return {k: v.version for k, v in packages.items()}


def _module_packages_moved(moved: List[str]) -> List[str]:
    return [n for n in moved
            if any(fnmatch.fnmatchcase(package_name(n), p) for p in KERNEL_MODULE_PACKAGES)]


def _record_event(host: Host, paths: StatePaths, payload: dict, now: dt.datetime) -> None:
    record = {"occurred_at": now.isoformat(), **payload}
    append_json_line(str(host.path(paths.guard_events)), record)
    audit(str(host.path(paths.audit_log)), str(payload.get("kind")), now,
          **{k: v for k, v in payload.items() if k != "kind"})


def _report_violations(host: Host, paths: StatePaths, violations: List[Violation], clock: Callable[[], dt.datetime],
                       dry_run: bool) -> None:
    """Each violation logged and, unless a dry run, recorded as a policy_violation event."""
    from agent.report.events import PolicyViolation

    for v in violations:
        if not dry_run:
            payload = PolicyViolation(rule=v.rule, message=v.message, packages=v.packages, action=v.action)
            _record_event(host, paths, payload.model_dump(mode="json"), clock())
        log.warning("guard_violation", rule=v.rule, action=v.action, packages=v.packages)


def _write_reboot_marker(host: Host, paths: StatePaths, moved: Dict[str, str], now: dt.datetime) -> None:
    lines = [f"*** gpuguard: reboot required: kernel module packages changed ({now.isoformat()}) ***"]
    lines += [f"{name} {move}" for name, move in sorted(moved.items())]
    write_atomically(str(host.path(paths.reboot_required)), "\n".join(lines) + "\n")
    write_atomically(str(host.path(paths.reboot_required_packages)),
                     "\n".join(package_name(n) for n in sorted(moved)) + "\n")


# Less free space than this (for root) on the state directory's filesystem is a full disk.
FULL_DISK_BYTES = 1 << 20


def _disk_full(path: str) -> bool:
    """Whether the filesystem holding ``path`` has (almost) no block left, even for root: a typed fact (statvfs),
    never the wording of a tool's error."""
    try:
        stat = os.statvfs(path)
    except OSError:
        return False
    return stat.f_bfree * stat.f_frsize < FULL_DISK_BYTES


# The rule name of a change that left the package database inconsistent (the Rollback event's reason), whatever
# the policy's rules say of the versions: a set with broken dependencies is never known-good.
DEPENDENCIES_BROKEN = "dependencies_broken"


def _database_problem(backend: PackageBackend, state_dir: str) -> Optional[str]:
    """What is wrong with the package database (``dpkg --audit``, ``apt-get check``; rpm's checks), None when it is
    consistent. A check that failed on a full disk proves nothing of the database: that is the disk-full error
    (exit 16), the old known-good set kept."""
    broken = backend.verify_database()
    if broken and _disk_full(state_dir):
        raise StateWriteError(state_dir, errno.ENOSPC, f"the disk is full; the package database could not be "
                                                       f"verified ({broken[:200]}), nothing was recorded")
    return broken


def _dependencies_broken(host: Host, paths: StatePaths, clock: Callable[[], dt.datetime], problem: str,
                         before: Dict[str, str], after: Dict[str, str], action: str, dry_run: bool) -> None:
    """Record (guard-events.jsonl, audit) that a change left the database inconsistent and was not recorded."""
    from agent.report.events import DependenciesBroken

    log.warning("known_good_not_recorded", reason=problem, action=action)
    if dry_run:
        return
    moved = {k for k in set(before) | set(after) if before.get(k) != after.get(k)}
    event = DependenciesBroken(message=f"the package database is not consistent ({problem})"[:2000],
                               from_versions={k: before.get(k, "(not installed)") for k in sorted(moved)},
                               to_versions={k: after.get(k, "(removed)") for k in sorted(moved)}, action=action)
    _record_event(host, paths, event.model_dump(mode="json"), clock())


def _inconsistent(problem: str, why: str) -> GuardResult:
    """A set whose package database is broken (a forced install left dependencies unmet) is never recorded as
    known-good: a later rollback would restore the broken set."""
    return GuardResult("inconsistent", detail=f"the package database is not consistent ({problem}); not recorded "
                                              f"as known-good; {why}")


AUTHORIZATION_MINUTES = 15  # longer than any rollback's apt/dnf run; the file is removed right after it anyway


def _authorize(host: Host, paths: StatePaths, known_good: Dict[str, InstalledPackage], reason: str,
               now: dt.datetime) -> str:
    """Write the one-shot authorization for exactly the known-good set (root-only, 0600); its host path."""
    import secrets

    from agent.guard.hotpath.authorization import render

    path = str(host.path(paths.rollback_authorization))
    grant_id = secrets.token_hex(6)
    write_atomically(path, render(_versions(known_good), reason, now,
                                  now + dt.timedelta(minutes=AUTHORIZATION_MINUTES), grant_id), mode=0o600)
    audit(str(host.path(paths.audit_log)), "rollback_authorization_written", now, id=grant_id,
          target=_versions(known_good))
    return path


def _revoke(host: Host, paths: StatePaths, path: str) -> None:
    """Remove the authorization (a host-prefixed path) once the rollback's transaction is over; audited."""
    import os

    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    audit(str(host.path(paths.audit_log)), "rollback_authorization_removed", host.clock())


def check_and_rollback(host: Host, guard: GuardSettings, paths: StatePaths, backend: PackageBackend,
                       policy: Optional[CompiledPolicy] = None,
                       now: Optional[Callable[[], dt.datetime]] = None, dry_run: bool = False,
                       snapshot: Optional[Callable[[Host], object]] = None,
                       progress: Optional[ProgressSink] = None) -> GuardResult:
    """Compare the installed set with the last known-good one and act as the policy says.

    ``guard`` is the ``[guard]`` settings, ``paths`` the state directory's files, ``backend`` the host's package
    manager (agent.guard.manager.backend_for builds it). ``policy`` defaults to the compiled policy in the state
    directory. ``snapshot`` is called after a rollback (default: a full snapshot, whose content hash goes into the
    Rollback event). ``progress`` hears how far a long known-good record is (default: logged).
    """
    from agent.policy.compiled import read_compiled

    clock = now or host.clock
    if policy is None:
        policy = read_compiled(str(host.path(paths.compiled_policy)))
    backend.wait_for_lock()
    current = backend.read_installed(policy.guarded)
    known_good = load_known_good(host, paths)
    context = read_host_context(str(host.root), facts_used(policy))
    if known_good is None:
        violations = _faults(current, backend, policy, context)
        if violations:
            return GuardResult("no_known_good", violations,
                               detail="the host violates the policy and no known-good set was recorded yet")
        detail = f"{len(current)} guarded packages recorded as known-good"
        broken = _database_problem(backend, str(host.path(paths.state_dir)))
        if broken:
            _dependencies_broken(host, paths, clock, broken, {}, {}, "reported", dry_run)
            return _inconsistent(broken, "no known-good set to go back to: repair it, then run gpuguard guard "
                                         "rollback again")
        if not dry_run:
            detail += _uncached_note(record_known_good(host, paths, current, clock(), backend, progress), backend)
        return GuardResult("recorded", detail=detail)
    state = HostState(before=_versions(known_good), after=_versions(current), manager=backend.manager,
                      context=context)
    judged = evaluate(state, policy)
    violations = [v for v in judged if v.touches(state.changed())]
    target: Optional[Dict[str, InstalledPackage]] = known_good
    why, policy_moved = "", False
    broken = _database_problem(backend, str(host.path(paths.state_dir))) if state.changed() else None
    if broken:
        # A bypass (dpkg -i --force-depends of one library of an exact-= meta web) broke the stack's own
        # dependencies: whatever the rules say of the versions, the way back is the known-good (consistent) set.
        return _restore_consistent(host, guard, paths, backend, policy, clock, dry_run, snapshot, known_good,
                                   current, violations, broken)
    if not violations:
        if state.changed() and not dry_run:
            keep_before_change(host, paths, known_good, clock())
            files = record_known_good(host, paths, current, clock(), backend, progress)
            return GuardResult("recorded", detail=f"compliant change of {len(state.changed())} packages recorded"
                               + _uncached_note(files, backend))
        standing = [v for v in judged if v.action != "warn"]
        if state.changed() or not any(v.action == "rollback" for v in standing):
            return GuardResult("compliant")
        # The policy moved under an unchanged set (a revert bundle, an aborted rollout, a tightened policy): the
        # known-good set itself violates it, so the way back is the set kept before the last change, if it complies.
        violations, policy_moved = standing, True
        why = "the policy in force changed and the installed (known-good) set violates it: "
        target = _compliant_before_change(host, paths, backend, policy, context, current)
    _report_violations(host, paths, violations, clock, dry_run)
    rollback_violations = [v for v in violations if v.action == "rollback"]
    if not rollback_violations or not guard.rollback_enabled:
        return GuardResult("violations", violations, detail="no violation asks for a rollback")
    windows = _open_windows(host, paths, policy, clock)
    if windows:
        return GuardResult("override", violations, detail=f"override window {windows[0].id} is open: not rolling back")
    if target is None:
        return GuardResult("violations", violations,
                           detail="the policy in force changed and the installed set violates it; no compliant set "
                                  "was kept before the last change: not rolled back")
    targets, from_versions, to_versions = backend.plan_targets(target, current)
    # The authorization covers the plan too: dnf runs its plugins (gpuguard's checker) on --assumeno as well.
    grant = _authorize(host, paths, target, rollback_violations[0].rule, clock())
    try:
        outcome = plan_and_apply(host, policy, backend, paths, clock, dry_run, snapshot, target, violations,
                                 rollback_violations[0].rule, why + "; ".join(v.message for v in rollback_violations),
                                 targets, from_versions, to_versions)
    finally:
        _revoke(host, paths, grant)
    if policy_moved and outcome.status == "rolled_back":
        # The restored set is the new known-good one (its files were kept with the set it replaced).
        record_known_good(host, paths, backend.read_installed(policy.guarded), clock(), backend, progress)
    return outcome


def _open_windows(host: Host, paths: StatePaths, policy: CompiledPolicy, clock: Callable[[], dt.datetime]) -> list:
    """The override windows open now (none when the overrides file is unreadable: logged)."""
    try:
        return active_windows(load_windows(str(host.path(paths.overrides)), policy.max_override_minutes), clock())
    except InputFileError as exc:
        log.warning("override_file_corrupt", error=str(exc))
        return []


def _restore_consistent(host: Host, guard: GuardSettings, paths: StatePaths, backend: PackageBackend,
                        policy: CompiledPolicy, clock: Callable[[], dt.datetime], dry_run: bool,
                        snapshot: Optional[Callable[[Host], object]], known_good: Dict[str, InstalledPackage],
                        current: Dict[str, InstalledPackage], violations: List[Violation],
                        problem: str) -> GuardResult:
    """A change left the package database inconsistent: never recorded; rolled back to the known-good set (kept
    package files first, ``dpkg -i`` when apt refuses to plan from broken dependencies) unless [guard] rollback is
    off or an override window is open, then only reported (a dependencies_broken event, status attention)."""
    before, after = _versions(known_good), _versions(current)
    _report_violations(host, paths, violations, clock, dry_run)
    windows = _open_windows(host, paths, policy, clock)
    if not guard.rollback_enabled or windows:
        _dependencies_broken(host, paths, clock, problem, before, after, "reported", dry_run)
        reason = (f"override window {windows[0].id} is open: not rolling back" if windows
                  else "[guard] rollback is off: repair it, then run gpuguard guard rollback again")
        return GuardResult("inconsistent", violations, detail=_inconsistent(problem, reason).detail)
    _dependencies_broken(host, paths, clock, problem, before, after, "rollback", dry_run)
    broken_rule = Violation(DEPENDENCIES_BROKEN, "rollback", f"the package database is not consistent ({problem})",
                            {k: f"{before.get(k, '(not installed)')} -> {after.get(k, '(removed)')}"
                             for k in sorted(set(before) | set(after)) if before.get(k) != after.get(k)})
    # The Rollback event's reason: the first rule that asks for a rollback anyway, else the broken database.
    reason = next((v.rule for v in violations if v.action == "rollback"), DEPENDENCIES_BROKEN)
    targets, from_versions, to_versions = backend.plan_targets(known_good, current)
    grant = _authorize(host, paths, known_good, reason, clock())
    try:
        return plan_and_apply(host, policy, backend, paths, clock, dry_run, snapshot, known_good,
                              [*violations, broken_rule], reason,
                              f"a change left the package database inconsistent ({problem}); back to the "
                              f"known-good set", targets, from_versions, to_versions)
    finally:
        _revoke(host, paths, grant)


def _faults(packages: Dict[str, InstalledPackage], backend: PackageBackend, policy: CompiledPolicy,
            context: Any) -> List[Violation]:
    """What ``policy`` finds wrong with a set as it stands, warn rules aside (they ask nothing of the guard)."""
    state = HostState.standing(_versions(packages), backend.manager, context)
    return [v for v in evaluate(state, policy) if v.action != "warn"]


def _compliant_before_change(host: Host, paths: StatePaths, backend: PackageBackend, policy: CompiledPolicy,
                             context: Any, current: Dict[str, InstalledPackage]
                             ) -> Optional[Dict[str, InstalledPackage]]:
    """The set kept before the last change when it differs from ``current`` and no rule of ``policy`` (but a warn
    one) finds fault with it; None otherwise (none kept, an unreadable one, or one the policy forbids too)."""
    try:
        previous = load_before_change(host, paths)
    except InputFileError as exc:
        log.warning("before_change_unreadable", error=str(exc))
        return None
    if previous is None or _versions(previous) == _versions(current):
        return None
    faults = _faults(previous, backend, policy, context)
    if faults:
        log.warning("before_change_violates_policy", rules=sorted({v.rule for v in faults}))
        return None
    return previous


def plan_and_apply(host: Host, policy: CompiledPolicy, backend: PackageBackend,
                   paths: StatePaths, clock: Callable[[], dt.datetime], dry_run: bool,
                   snapshot: Optional[Callable[[Host], object]], known_good: Dict[str, InstalledPackage],
                   violations: List[Violation], reason: str, why: str, targets: List[str],
                   from_versions: Dict[str, str], to_versions: Dict[str, str],
                   sink: Optional[Callable[[Any], None]] = None, health_status: Optional[str] = None) -> GuardResult:
    """Plan the rollback, run it and verify it (check_and_rollback's second half, under the authorization).

    The Rollback event (``reason``; ``why`` starts its detail) goes to guard-events.jsonl for the daemon to forward,
    or to ``sink`` (the health job commits it to the outbox itself); either way it is audited.
    """
    from agent.report.events import Rollback

    plan, plan_error = backend.simulate(targets)
    moved_modules = _module_packages_moved(list(from_versions))
    outcome = GuardResult("planned", violations, plan, targets, from_versions, to_versions,
                          reboot_required=bool(moved_modules))
    if plan_error is not None:
        missing = sorted(f"{k} {v.version}" for k, v in known_good.items()
                         if k in to_versions and not backend.has_cached(k, v))
        if missing:
            plan_error += (f" (no kept package file for {', '.join(missing)}: put it in {backend.cache_dir} or make "
                           f"a repository offer that version, then run gpuguard guard rollback again)")
        outcome.status, outcome.detail = "failed", plan_error
    if dry_run:
        return outcome
    if outcome.status != "failed":
        backend.wait_for_lock()
        apply_error = backend.apply(targets)
        if apply_error is not None:
            backend.finish_pending()
        if apply_error is not None:
            outcome.status = "failed"
            outcome.detail = apply_error
        else:
            after = backend.read_installed(policy.guarded)
            wrong = {k: (after[k].version if k in after else "(absent)") for k, v in to_versions.items()
                     if (after[k].version if k in after else "(removed)") != v}
            broken = backend.verify_database()
            if wrong:
                outcome.status, outcome.detail = "failed", f"after the rollback these differ: {wrong}"
            elif broken:
                outcome.status, outcome.detail = "failed", f"the package database is not consistent: {broken}"
            else:
                outcome.status = "rolled_back"
        outcome.detail = "; ".join(p for p in (f"via {backend.mechanism}", outcome.detail) if p)
    snapshot_hash = None
    if outcome.status == "rolled_back":
        taker = snapshot if snapshot is not None else _default_snapshot
        snap = taker(host)
        snapshot_hash = getattr(snap, "content_hash", None)
    if outcome.reboot_required and outcome.status == "rolled_back":
        _write_reboot_marker(host, paths, {k: f"{from_versions[k]} -> {to_versions[k]}" for k in moved_modules},
                             clock())
    detail = why
    if snapshot_hash:
        detail += f"; snapshot after rollback {snapshot_hash}"
    if outcome.detail:
        detail += f"; {outcome.detail}"
    event = Rollback(reason=reason, from_versions=from_versions, to_versions=to_versions,
                     succeeded=outcome.status == "rolled_back", reboot_required=outcome.reboot_required, detail=detail,
                     health_status=health_status)
    if sink is None:
        _record_event(host, paths, event.model_dump(mode="json", exclude_none=True), clock())
    else:
        audit(str(host.path(paths.audit_log)), "rollback", clock(),
              **{k: v for k, v in event.model_dump(mode="json").items() if k != "kind"})
        sink(event)
    log.warning("guard_rollback", status=outcome.status, targets=targets, reboot_required=outcome.reboot_required)
    return outcome


def _default_snapshot(host: Host) -> object:
    from agent.snapshot.take import take_snapshot

    try:
        return take_snapshot(host)
    except Exception as exc:  # noqa: BLE001 - a failed re-snapshot must not turn a done rollback into an error
        log.warning("snapshot_after_rollback_failed", error=f"{type(exc).__name__}: {exc}")
        return None


