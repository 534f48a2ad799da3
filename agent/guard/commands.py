"""The ``policy``, ``pin``, ``override`` and ``guard`` commands: glue from parsed arguments to the guard modules.

agent/cli.py parses and dispatches here lazily; each function returns the exit code and raises known errors.
"""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, TextIO, Tuple

from agent.errors import InputFileError, PolicyError
from agent.host import Host

if TYPE_CHECKING:  # the commands import their modules lazily, for the CLI's start-up time
    from agent.config import Settings
    from agent.guard.hotpath.state import GuardPaths
    from agent.policy.compiled import CompiledPolicy
    from agent.policy.freeze import FreezeFacts
    from agent.policy.load import LoadedPolicy

HostFactory = Callable[[str], Host]
EXIT_VIOLATIONS = 10
EXIT_ROLLBACK_FAILED = 14


def _settings(args: argparse.Namespace) -> Settings:
    from agent.config import load_settings

    return load_settings(args.config)


def _policy_path(args: argparse.Namespace, host: Host, settings: Settings) -> str:
    if getattr(args, "policy", None):
        return str(args.policy)
    return str(host.path(settings.guard.policy_path))


def _paths(settings: Settings) -> GuardPaths:
    from agent.guard.hotpath.state import GuardPaths

    return GuardPaths(settings.agent.state_dir)


def _compile(args: argparse.Namespace, host: Host, settings: Settings) -> Tuple[LoadedPolicy, CompiledPolicy]:
    from agent.policy.load import load_and_compile

    return load_and_compile(_policy_path(args, host, settings), settings.guard.matrix_path)


def _policy_for_host(args: argparse.Namespace, host: Host, settings: Settings) -> CompiledPolicy:
    """The policy from the policy files when they are there, else the compiled copy in the state directory."""
    from agent.policy.compiled import read_compiled

    if getattr(args, "policy", None) or host.path(settings.guard.policy_path).exists():
        return _compile(args, host, settings)[1]
    return read_compiled(str(host.path(_paths(settings).compiled_policy)))


def policy_check(args: argparse.Namespace, make_host: HostFactory, out: TextIO) -> int:
    """Validate a policy file or directory (default /etc/gpuguard/policy.d under --root): its structure, then the
    semantic checks (agent/policy/semantic.py) against AMD's matrix and, unless --no-host, the host's packages and
    kernels. Every problem on its own line; errors exit 3, warnings alone exit 0."""
    from agent.policy.load import DEFAULT_POLICY_DIR, compiled_from, load_policy
    from agent.policy.semantic import Problem, check_policy

    host = make_host(getattr(args, "root", "/"))
    path = args.path or str(host.path(DEFAULT_POLICY_DIR))
    problems: List[Problem] = []
    summary: Optional[Dict[str, Any]] = None
    try:
        loaded = load_policy(path)
        matrix = _matrix_for_check(loaded.policy.policy.require_amd_matrix, getattr(args, "matrix", None))
        compiled = compiled_from(loaded, matrix if loaded.policy.policy.require_amd_matrix else None)
    except PolicyError as exc:
        problems = [_problem_of(exc.path, text) for text in exc.problems]
    else:
        inventory = None
        if not getattr(args, "no_host", False):
            inventory, unread = _inventory(host, loaded.policy)
            if unread is not None:
                problems.append(unread)
        problems += check_policy(loaded.parts, loaded.policy, matrix, inventory)
        rules = loaded.policy.rule_count()
        summary = {"name": compiled.name, "rules": rules, "action": compiled.action, "failsafe": compiled.failsafe,
                   "files": [source for source, _ in loaded.sources], "host_checked": inventory is not None}
    errors = [p for p in problems if p.severity == "error"]
    warnings = [p for p in problems if p.severity != "error"]
    code = PolicyError.exit_code if errors else 0
    if getattr(args, "json", False):
        out.write(json.dumps({"path": path, "ok": not errors, "exit_code": code, "policy": summary,
                              "errors": [p.to_dict() for p in errors],
                              "warnings": [p.to_dict() for p in warnings]}, indent=2, sort_keys=True) + "\n")
        return code
    for problem in problems:
        out.write(("warning: " if problem.severity != "error" else "") + f"{problem.file}: {problem.text()}\n")
    counted = f", {len(warnings)} warning{'s' if len(warnings) != 1 else ''}" if warnings else ""
    if errors:
        out.write(f"{len(errors)} problem{'s' if len(errors) != 1 else ''} found{counted}\n")
        return code
    assert summary is not None
    out.write(f"{path}: ok: policy '{summary['name']}', {summary['rules']} rule{'s' if summary['rules'] != 1 else ''}"
              f", action {summary['action']}, fail-safe {summary['failsafe']}, from {len(summary['files'])} file(s)"
              f"{counted}\n")
    return 0


def _matrix_for_check(required: bool, path: Optional[str]) -> Optional[Any]:
    """The AMD matrix: PolicyError when the policy requires it and it cannot be read; otherwise None then (the
    checks that only use it as a reference are skipped)."""
    from agent.policy.matrix import load_matrix

    try:
        return load_matrix(path)
    except PolicyError:
        if required:
            raise
        return None


def _problem_of(base: str, text: str) -> Any:
    """A PolicyError problem (``10-site.toml: field -> 1: message`` for a directory) as a Problem naming its file."""
    import re
    from pathlib import Path

    from agent.policy.semantic import Problem

    file = base
    head, sep, rest = text.partition(": ")
    if sep and head.endswith(".toml") and Path(base).is_dir():
        file, text = str(Path(base) / head), rest
    where, sep, message = text.partition(": ")
    if sep and re.fullmatch(r"[\w.-]+( -> [\w.-]+)*", where):
        return Problem(where, message, file=file)
    return Problem("", text, file=file)


def _inventory(host: Host, policy: Any) -> Tuple[Optional[Any], Optional[Any]]:
    """This host's guarded packages and kernel releases for the semantic checks, or a warning why they are not
    known (no package database under --root, rpm not runnable)."""
    from agent.errors import GpuguardError
    from agent.guard.manager import detect_manager
    from agent.guard.rollback.core import read_installed
    from agent.policy.compiled import DEFAULT_KERNEL_PACKAGES
    from agent.policy.load import guarded_patterns
    from agent.policy.semantic import WARNING, Inventory, Problem, inventory_kernels

    try:
        found = read_installed(host, guarded_patterns(policy) + list(DEFAULT_KERNEL_PACKAGES))
    except GpuguardError as exc:
        return None, Problem("", f"the host's packages could not be read ({exc}); the checks against this host "
                                 f"were skipped (--no-host skips them on purpose)", WARNING, str(host.root))
    installed = {k: v.version for k, v in found.items()}
    kernels = inventory_kernels(installed, detect_manager(host), host.read_first_line("/proc/sys/kernel/osrelease"))
    return Inventory(installed=installed, kernels=kernels), None


def policy_compile(args: argparse.Namespace, make_host: HostFactory, out: TextIO) -> int:
    """Compile the policy to the JSON the apt hook reads, atomically."""
    from agent.policy.load import write_compiled

    host = make_host(args.root)
    settings = _settings(args)
    _, compiled = _compile(args, host, settings)
    target = args.output or str(host.path(_paths(settings).compiled_policy))
    write_compiled(target, compiled)
    out.write(f"compiled policy '{compiled.name}' from {', '.join(compiled.sources)} -> {target}\n")
    return 0


def _installed(host: Host, policy: CompiledPolicy, settings: Optional[Settings] = None) -> Dict[str, str]:
    from agent.guard.rollback.core import read_installed

    return {k: v.version for k, v in read_installed(host, policy.guarded, settings=settings).items()}


def policy_explain(args: argparse.Namespace, make_host: HostFactory, out: TextIO) -> int:
    """What the current host is pinned to and what it would be allowed to do (agent/policy/explain.py); exit 10
    (EXIT_VIOLATIONS) when the host violates the policy now."""
    from agent.guard.hotpath.overrides import active_windows, load_windows
    from agent.guard.manager import detect_manager
    from agent.hostfacts.context import read_host_context
    from agent.policy.explain import HostFacts, explain

    host = make_host(args.root)
    settings = _settings(args)
    policy = _policy_for_host(args, host, settings)
    windows, windows_problem = [], None
    try:
        windows = active_windows(load_windows(str(host.path(_paths(settings).overrides)), policy.max_override_minutes),
                                 host.clock())
    except InputFileError as exc:
        windows_problem = str(exc)
    facts = HostFacts(installed=_installed(host, policy, settings), manager=detect_manager(host),
                      context=read_host_context(str(host.root)), windows=windows, windows_problem=windows_problem)
    explanation = explain(policy, facts)
    code = EXIT_VIOLATIONS if explanation.violations else 0
    if getattr(args, "json", False):
        out.write(json.dumps({"policy": policy.name, "sources": list(policy.sources), "manager": facts.manager,
                              "os_id": facts.context.os_id, "os_version_id": facts.context.os_version_id,
                              "installed": dict(sorted(facts.installed.items())),
                              "compliant": not explanation.violations, "exit_code": code,
                              "violations": [v.to_dict() for v in explanation.violations],
                              "lines": explanation.lines}, indent=2, sort_keys=True) + "\n")
        return code
    out.write("\n".join(explanation.lines) + "\n")
    return code


def policy_freeze(args: argparse.Namespace, make_host: HostFactory, out: TextIO) -> int:
    """Write a policy that keeps this host on what it runs now (agent/policy/freeze.py renders it): to stdout, or
    atomically to --output, which must not exist unless --force; exit 10 when the host is inconsistent."""
    import os
    import sys

    from agent.errors import UsageError
    from agent.files import write_atomically
    from agent.policy.freeze import FreezeOptions, FreezeRefused, render_freeze

    if args.output and os.path.isdir(args.output):
        raise UsageError(f"{args.output} is a directory; give a file name, e.g. {args.output.rstrip('/')}/"
                         f"50-freeze.toml")
    if args.output and os.path.lexists(args.output) and not args.force:
        raise UsageError(f"{args.output} exists; pass --force to replace it")
    host = make_host(args.root)
    facts = read_freeze_facts(host, _settings(args))
    options = FreezeOptions(name=args.name, point_releases=args.allow_point_releases,
                            kernel_series=args.kernel_series, accept_inconsistent=args.accept_inconsistent)
    try:
        text = render_freeze(facts, options)
    except FreezeRefused as exc:
        print(f"gpuguard: refusing to freeze: {exc}", file=sys.stderr)
        return EXIT_VIOLATIONS
    if not args.output:
        out.write(text)
        return 0
    try:
        write_atomically(args.output, text)
    except OSError as exc:
        raise UsageError(f"cannot write {args.output}: {exc.strerror or exc}") from None
    out.write(f"wrote {args.output}; next: gpuguard policy check {args.output}, then put it in /etc/gpuguard/policy.d/ "
              f"and run gpuguard policy compile and gpuguard pin apply\n")
    return 0


def read_freeze_facts(host: Host, settings: Settings) -> FreezeFacts:
    """What ``policy freeze`` freezes: the packages it reads, the running kernel and the host context."""
    from agent.guard.manager import detect_manager
    from agent.guard.rollback.core import read_installed
    from agent.hostfacts.context import read_host_context
    from agent.policy.freeze import FREEZE_PACKAGES, FreezeFacts

    installed = read_installed(host, list(FREEZE_PACKAGES), settings=settings)
    return FreezeFacts(installed={k: v.version for k, v in installed.items()}, manager=detect_manager(host),
                       running_kernel=host.read_first_line("/proc/sys/kernel/osrelease"),
                       context=read_host_context(str(host.root)), hostname=host.hostname(),
                       date=host.clock().date().isoformat())


def pin_apply(args: argparse.Namespace, make_host: HostFactory, out: TextIO) -> int:
    """Render the policy as native pins: apt preferences on dpkg hosts, dnf versionlock entries on rpm hosts;
    gpuguard's stale ones are removed, nobody else's."""
    from agent.guard.manager import detect_manager
    from agent.policy.load import write_compiled

    host = make_host(args.root)
    settings = _settings(args)
    _, policy = _compile(args, host, settings)
    if not args.dry_run:
        write_compiled(str(host.path(_paths(settings).compiled_policy)), policy)
    if detect_manager(host) == "rpm":
        return _pin_apply_versionlock(args, host, settings, policy, out)
    return _pin_apply_apt(args, host, settings, policy, out)


def _pin_apply_apt(args: argparse.Namespace, host: Host, settings: Settings, policy: CompiledPolicy,
                   out: TextIO) -> int:
    from agent.guard.apt.preferences import apply_pins
    from agent.guard.apt.tool import AptTool

    tool = AptTool(host, timeout_seconds=settings.guard.apt_timeout_seconds,
                   lock_timeout_seconds=settings.guard.lock_timeout_seconds)
    changes, wanted = apply_pins(host, policy, settings.guard.preferences_dir, tool, _installed(host, policy),
                                 dry_run=args.dry_run)
    verb = "would write" if args.dry_run else "wrote"
    for name in changes.written:
        out.write(f"{verb} {settings.guard.preferences_dir}/{name}\n")
        if args.dry_run:
            out.write(wanted[name])
    for name in changes.unchanged:
        out.write(f"unchanged {settings.guard.preferences_dir}/{name}\n")
    for name in changes.removed:
        out.write(f"{'would remove' if args.dry_run else 'removed'} stale {settings.guard.preferences_dir}/{name}\n")
    for name in changes.foreign:
        out.write(f"left alone {settings.guard.preferences_dir}/{name} (not written by gpuguard)\n")
    if not (changes.written or changes.unchanged or changes.removed):
        out.write("nothing to pin\n")
    _note_amd_pins("".join(wanted.values()), out)
    return 0


def _note_amd_pins(rendered: str, out: TextIO) -> None:
    """Say once that the AMD pins follow the installed stack, when any were rendered."""
    from agent.guard.pin_records import AFTER_A_MOVE

    if AFTER_A_MOVE in rendered:
        out.write("note: the AMD pins keep this host on its installed pairing and driver build; "
                  f"{AFTER_A_MOVE}\n")


def _pin_apply_versionlock(args: argparse.Namespace, host: Host, settings: Settings, policy: CompiledPolicy,
                           out: TextIO) -> int:
    from agent.guard.dnf.versionlock import apply_versionlock
    from agent.guard.manager import dnf_tool_for

    tool = dnf_tool_for(host, settings)
    installed = _installed(host, policy, settings)
    changes = apply_versionlock(host, policy, tool, installed, dry_run=args.dry_run)
    if changes.note:
        out.write(f"note: {changes.note}\n")
    total = changes.unchanged + len(changes.added)
    if changes.changed:
        verb = "would write" if args.dry_run else "wrote"
        out.write(f"{verb} {changes.path}: {total} gpuguard entr{'y' if total == 1 else 'ies'} "
                  f"({len(changes.added)} new, {len(changes.removed)} stale removed); other entries left alone\n")
        if args.dry_run:
            out.write(changes.text)
    elif total:
        out.write(f"unchanged {changes.path}: {total} gpuguard entr{'y' if total == 1 else 'ies'}\n")
    for entry in changes.added:
        out.write(f"  + {entry}\n")
    for entry in changes.removed:
        out.write(f"  - {entry}\n")
    if not total and not changes.removed:
        out.write("nothing to pin\n")
    _note_amd_pins(changes.text, out)
    return 0


def _max_override_minutes(host: Host, settings: Settings) -> float:
    from agent.policy.compiled import read_compiled

    try:
        return read_compiled(str(host.path(_paths(settings).compiled_policy))).max_override_minutes
    except InputFileError:
        return 240


def override_start(args: argparse.Namespace, make_host: HostFactory, out: TextIO) -> int:
    from agent.guard.hotpath.overrides import start_window

    host = make_host(args.root)
    settings = _settings(args)
    paths = _paths(settings)
    window = start_window(str(host.path(paths.overrides)), str(host.path(paths.audit_log)), args.minutes,
                          args.reason, _max_override_minutes(host, settings), now=host.clock)
    out.write(f"override window {window.id} open until {window.expires_at.isoformat(timespec='seconds')} "
              f"({window.reason!r}, by {window.opened_by}); audited in {paths.audit_log}\n")
    return 0


def override_list(args: argparse.Namespace, make_host: HostFactory, out: TextIO) -> int:
    from agent.guard.hotpath.overrides import load_windows

    host = make_host(args.root)
    settings = _settings(args)
    paths = _paths(settings)
    now = host.clock()
    windows = load_windows(str(host.path(paths.overrides)), _max_override_minutes(host, settings))
    if args.json:
        out.write(json.dumps([dict(w.to_dict(), active=w.is_active(now)) for w in windows], indent=2) + "\n")
        return 0
    for window in windows:
        state = "open" if window.is_active(now) else "expired"
        out.write(f"{window.id} {state} {window.started_at.isoformat(timespec='seconds')} -> "
                  f"{window.expires_at.isoformat(timespec='seconds')} by {window.opened_by}: {window.reason}\n")
    if not windows:
        out.write("no override windows\n")
    return 0


def override_end(args: argparse.Namespace, make_host: HostFactory, out: TextIO) -> int:
    from agent.guard.hotpath.overrides import end_windows

    host = make_host(args.root)
    paths = _paths(_settings(args))
    closed = end_windows(str(host.path(paths.overrides)), str(host.path(paths.audit_log)), now=host.clock,
                         window_id=args.id)
    out.write("".join(f"closed override window {w.id} ({w.reason!r})\n" for w in closed) or "no open window\n")
    return 0


def guard_rollback(args: argparse.Namespace, make_host: HostFactory, out: TextIO) -> int:
    """Check the installed set against the last known-good one; roll back when the policy says so."""
    from agent.guard.rollback.core import check_and_rollback

    host = make_host(args.root)
    settings = _settings(args)
    policy = _policy_for_host(args, host, settings)
    result = check_and_rollback(host, settings, policy=policy, dry_run=args.dry_run)
    out.write(result.summary())
    if result.status == "failed":
        return EXIT_ROLLBACK_FAILED
    if result.status in ("violations", "no_known_good", "override", "inconsistent"):
        return EXIT_VIOLATIONS
    return 0
