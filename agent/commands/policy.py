"""``gpuguard policy check|compile|explain|freeze|bundle|trust-root|install|deny``: validate the pairing policy,
compile it for the hot path, say what it means for this host, write one from the host as it is, sign and install
bundles, put a signed deny list in force."""

from __future__ import annotations

import argparse
import datetime as dt
import json
from typing import TYPE_CHECKING, Any, Dict, List, Optional, TextIO, Tuple

from agent.commands.guard_inputs import (
    EXIT_VIOLATIONS,
    chosen_source,
    compile_policy,
    installed_versions,
    policy_for_host,
    settings_of,
    state_paths,
)
from agent.commands.options import (
    ACT_ROOT_HELP,
    add_config,
    add_group,
    add_guard_options,
    add_json,
    add_output,
    add_root,
)
from agent.defaults import DEFAULT_POLICY_DIR

if TYPE_CHECKING:
    from agent.commands import HostFactory, Subparsers
    from agent.host import Host
    from agent.policy.companions import ExporterTable
    from agent.policy.freeze import FreezeFacts


def add_parser(sub: Subparsers) -> None:
    pol_sub = add_group(sub, "policy", "pairing policy: check, compile, explain, freeze, bundle, install")
    check = pol_sub.add_parser("check", help="validate a policy file or directory, also for rules that can never "
                                             "match or block everything; every problem on its own line, warnings "
                                             "as 'warning: ...' (exit 0 valid, warnings allowed; 3 invalid)")
    check.add_argument("path", metavar="FILE|DIR", nargs="?",
                       help=f"default: {DEFAULT_POLICY_DIR} under --root")
    check.add_argument("--matrix", metavar="PATH", help="AMD compatibility matrix file (default: the shipped one, "
                                                        "/usr/share/gpuguard/amd-compat-matrix.toml)")
    add_root(check, "check against the host tree under DIR instead of / (its packages and kernels: rules that match "
                    "nothing are warnings)")
    check.add_argument("--no-host", action="store_true", help="skip the checks against this host's packages")
    add_json(check, "print the result as JSON")
    check.set_defaults(handler=policy_check)
    comp = pol_sub.add_parser("compile", help="write the compiled policy the apt hook reads (atomically)")
    add_guard_options(comp)
    add_output(comp, "write here instead of the state directory")
    comp.set_defaults(handler=policy_compile)
    explain = pol_sub.add_parser("explain", help="show what this host is pinned to and what it may do (exit 0 "
                                                 "compliant, 10 the host violates the policy, 3 invalid policy)")
    add_guard_options(explain)
    add_json(explain, "print the result as JSON")
    explain.set_defaults(handler=policy_explain)
    freeze = pol_sub.add_parser(
        "freeze", help="write a policy that keeps this host on its installed driver/ROCm or NVIDIA driver/CUDA "
                       "builds and kernels, commented line by line (exit 10 when installed and loaded driver differ)",
        description="Print (or write with --output) a policy from the host as it is now: the installed driver/ROCm "
                    "or NVIDIA driver/CUDA pairing at its exact builds, the running and installed kernels, the rest "
                    "of the GPU stack frozen, the other guarded packages. Save it as "
                    f"{DEFAULT_POLICY_DIR}/50-freeze.toml, check it, then policy compile and pin apply. A host "
                    "whose installed driver is not the loaded one is refused (exit 10).")
    add_root(freeze)
    add_config(freeze)
    add_output(freeze, f"write the policy to FILE (atomically) instead of stdout, e.g. "
                       f"{DEFAULT_POLICY_DIR}/50-freeze.toml")
    freeze.add_argument("--force", action="store_true", help="replace FILE when it exists")
    freeze.add_argument("--name", help="the policy's name (default: freeze-HOSTNAME)")
    freeze.add_argument("--allow-point-releases", action="store_true",
                        help="allow point releases of the installed series (driver 6.2.*, ROCm 6.2.*, NVIDIA "
                             "driver 580.*, CUDA 13.0.*) instead of the exact builds")
    freeze.add_argument("--kernel-series", action="store_true",
                        help="allow new kernels of the installed series (6.8.0-*-generic) instead of the exact "
                             "kernel releases")
    freeze.add_argument("--accept-inconsistent", action="store_true",
                        help="freeze the installed packages even when the loaded driver differs (the policy says so)")
    freeze.set_defaults(handler=policy_freeze)
    _add_bundle_parsers(pol_sub)


def _add_bundle_parsers(pol_sub: Any) -> None:
    """``policy bundle`` and ``policy install``: make a signed policy bundle, install one
    (/usr/share/doc/gpuguard/guard.md, "Signed policy")."""
    bundle = pol_sub.add_parser(
        "bundle", help="make a policy bundle (one JSON file to sign and install) from a policy file or directory, "
                       "after the same checks as policy check (exit 3 when they find an error)")
    bundle.add_argument("path", metavar="FILE|DIR", help="the policy files, e.g. a policy.d directory")
    bundle.add_argument("--serial", type=int, required=True,
                        help="the bundle's serial: greater than every serial pushed or installed before")
    add_output(bundle, "write the bundle here (atomically; required)")
    bundle.add_argument("--created-by", metavar="WHO", help="who made it (default: USER@HOSTNAME)")
    bundle.add_argument("--all", dest="scope_all", action="store_true", help="for every host")
    bundle.add_argument("--host-id", dest="host_ids", action="append", default=[], metavar="GLOB",
                        help="for these host ids (repeat; any matches)")
    bundle.add_argument("--label", dest="labels", action="append", default=[], metavar="NAME=VALUE",
                        help="for hosts with this label (repeat; all must be equal)")
    bundle.add_argument("--gpu-model", dest="gpu_models", action="append", default=[], metavar="GLOB",
                        help="for hosts with a GPU model matching (repeat), e.g. '*H200*'")
    bundle.add_argument("--os", dest="os", action="append", default=[], metavar="GLOB",
                        help="for hosts on OS_ID-VERSION_ID matching (repeat), e.g. ubuntu-24.04")
    bundle.add_argument("--pairing", dest="pairings", action="append", default=[], metavar="GLOB",
                        help="for hosts whose pairing matches (repeat), e.g. 'nvidia 580.*'")
    bundle.add_argument("--matrix", metavar="PATH", help="AMD compatibility matrix to check against (default: the "
                                                         "shipped one)")
    bundle.add_argument("--with-matrix", action="store_true",
                        help="carry that matrix in the bundle: the hosts compile with it instead of their own")
    bundle.add_argument("--knowledge", dest="knowledge", action="append", default=[], metavar="FILE",
                        help="carry this knowledge table (repeat; e.g. a newer dcgm-exporter.toml): hosts use it "
                             "where it is dated the same day as their package's copy or later")
    add_root(bundle, "check against the host tree under DIR instead of / (as policy check does)")
    bundle.add_argument("--no-host", action="store_true", help="skip the checks against this host's packages")
    bundle.add_argument("--sign-with", metavar="KEYID", help="sign it with gpg --detach-sign as this key "
                                                             "(writes FILE.sig)")
    bundle.add_argument("--expires-days", type=int, metavar="DAYS",
                        help="the bundle expires DAYS after now (required by hosts that trust a root; an expired "
                             "bundle is refused at install and, in force, keeps guarding and asks for attention)")
    bundle.set_defaults(handler=policy_bundle)
    trust = pol_sub.add_parser(
        "trust-root", help="trust the first root (signed by a threshold of its own root keys), or take the next "
                           "root versions in order, each signed by a threshold of the old and of the new root keys "
                           "(exit 17 refused)")
    trust.add_argument("roots", metavar="ROOT_JSON", nargs="+",
                       help="root.json files, oldest first (each with ROOT_JSON.sig beside it)")
    add_root(trust, ACT_ROOT_HELP)
    add_config(trust)
    trust.set_defaults(handler=policy_trust_root)
    install = pol_sub.add_parser(
        "install", help="verify and install a signed policy bundle (exit 17 refused: signature, older serial, out "
                        "of scope, does not compile; the policy in force keeps guarding)")
    install.add_argument("bundle", metavar="BUNDLE", help="the bundle file")
    install.add_argument("--signature", metavar="SIG", help="its detached signature (default: BUNDLE.sig)")
    install.add_argument("--allow-rollback", action="store_true",
                         help="an operator's revert: take a bundle below the serial in force (or the same serial "
                              "with other content); every other check still applies; needs --reason, audited")
    install.add_argument("--reason", help="why the rollback (it goes to the audit log)")
    add_root(install, ACT_ROOT_HELP)
    add_config(install)
    install.set_defaults(handler=policy_install)
    deny = add_group(pol_sub, "deny", "the signed deny list of known-bad versions (the daemon takes the hub's at "
                                      "every fetch)")
    deny_install = deny.add_parser(
        "install", help="verify and put in force a signed deny list without a hub (exit 17 refused: signature, "
                        "threshold, scope, rollback, expired, format; the list in force keeps guarding)")
    deny_install.add_argument("deny", metavar="FILE", help="the deny list (deny.json, format gpuguard-deny/1)")
    deny_install.add_argument("--signature", metavar="SIG", help="its detached signatures (default: FILE.sig)")
    add_root(deny_install, ACT_ROOT_HELP)
    add_config(deny_install)
    deny_install.set_defaults(handler=policy_deny_install)


def _show(out: TextIO, text: str) -> None:
    """Write text a person reads with its control characters escaped (agent/printable.py; newlines kept): a policy's
    name, package patterns and reasons come from files anyone who can write policy.d (or a bundle's signer) wrote,
    and a NUL or an ESC in them must not reach the terminal as is. JSON output needs none: json escapes them."""
    from agent.printable import printable

    out.write(printable(text, keep_newlines=True))


def policy_check(args: argparse.Namespace, make_host: HostFactory, out: TextIO) -> int:
    """Validate a policy file or directory (default /etc/gpuguard/policy.d under --root): its structure, then the
    semantic checks (agent/policy/semantic.py) against AMD's matrix and, unless --no-host, the host's packages and
    kernels. Every problem on its own line; errors exit 3, warnings alone exit 0."""
    from agent.errors import PolicyError

    host = make_host(getattr(args, "root", "/"))
    path = args.path or str(host.path(DEFAULT_POLICY_DIR))
    problems, summary, _ = _checked(host, path, getattr(args, "matrix", None), getattr(args, "no_host", False))
    errors = [p for p in problems if p.severity == "error"]
    warnings = [p for p in problems if p.severity != "error"]
    code = PolicyError.exit_code if errors else 0
    if getattr(args, "json", False):
        out.write(json.dumps({"path": path, "ok": not errors, "exit_code": code, "policy": summary,
                              "errors": [p.to_dict() for p in errors],
                              "warnings": [p.to_dict() for p in warnings]}, indent=2, sort_keys=True) + "\n")
        return code
    for problem in problems:
        _show(out, ("warning: " if problem.severity != "error" else "") + f"{problem.file}: {problem.text()}\n")
    counted = f", {len(warnings)} warning{'s' if len(warnings) != 1 else ''}" if warnings else ""
    if errors:
        _show(out, f"{len(errors)} problem{'s' if len(errors) != 1 else ''} found{counted}\n")
        return code
    assert summary is not None
    _show(out, f"{path}: ok: policy '{summary['name']}', {summary['rules']} rule{'s' if summary['rules'] != 1 else ''}"
               f", action {summary['action']}, fail-safe {summary['failsafe']}, from {len(summary['files'])} file(s)"
               f"{counted}\n")
    return 0


def _checked(host: Host, path: str, matrix_path: Optional[str],
             no_host: bool) -> Tuple[List[Any], Optional[Dict[str, Any]], Optional[Any]]:
    """``policy check``'s judgement of a policy file or directory: every problem (errors and warnings), the
    summary when it loads, and the AMD matrix it was checked against (None when none could be read)."""
    from agent.errors import PolicyError
    from agent.policy.load import compiled_from, load_policy
    from agent.policy.semantic import Problem, check_policy

    problems: List[Problem] = []
    summary: Optional[Dict[str, Any]] = None
    matrix = None
    try:
        loaded = load_policy(path)
        matrix = _matrix_for_check(loaded.policy.policy.require_amd_matrix, matrix_path)
        compiled = compiled_from(loaded, matrix if loaded.policy.policy.require_amd_matrix else None)
    except PolicyError as exc:
        problems = [_problem_of(exc.path, text) for text in exc.problems]
    else:
        inventory = None
        if not no_host:
            inventory, unread = _inventory(host, loaded.policy)
            if unread is not None:
                problems.append(unread)
        problems += check_policy(loaded.parts, loaded.policy, matrix, inventory)
        rules = loaded.policy.rule_count()
        summary = {"name": compiled.name, "rules": rules, "action": compiled.action, "failsafe": compiled.failsafe,
                   "files": [source for source, _ in loaded.sources], "host_checked": inventory is not None}
    return problems, summary, matrix


def _matrix_for_check(required: bool, path: Optional[str]) -> Optional[Any]:
    """The AMD matrix: PolicyError when the policy requires it and it cannot be read; otherwise None then (the
    checks that only use it as a reference are skipped)."""
    from agent.errors import PolicyError
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
    from agent.guard.installed import detect_manager, read_installed
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
    settings = settings_of(args)
    _, compiled = compile_policy(args, host, settings)
    target = args.output or str(host.path(state_paths(settings).compiled_policy))
    write_compiled(target, compiled)
    _show(out, f"compiled policy '{compiled.name}' from {', '.join(compiled.sources)} -> {target}\n")
    return 0


def policy_explain(args: argparse.Namespace, make_host: HostFactory, out: TextIO) -> int:
    """What the current host is pinned to and what it would be allowed to do (agent/policy/explain.py); exit 10
    (EXIT_VIOLATIONS) when the host violates the policy now."""
    from agent.errors import InputFileError
    from agent.guard.hotpath.overrides import active_windows, load_windows
    from agent.guard.hotpath.rollout import rollout_notice  # the hub's staged-rollout notice, as the hook shows it
    from agent.guard.installed import detect_manager
    from agent.guard.rollback.core import load_known_good
    from agent.hostfacts.context import read_host_context
    from agent.policy.explain import HostFacts, explain

    host = make_host(args.root)
    settings = settings_of(args)
    policy = policy_for_host(args, host, settings)
    source = chosen_source(args, host, settings).description
    windows, windows_problem = [], None
    try:
        windows = active_windows(load_windows(str(host.path(state_paths(settings).overrides)),
                                              policy.max_override_minutes), host.clock())
    except InputFileError as exc:
        windows_problem = str(exc)
    known_good, known_good_problem = None, None
    try:
        recorded = load_known_good(host, state_paths(settings))
    except InputFileError as exc:
        known_good_problem = str(exc)
    else:
        known_good = {k: v.version for k, v in recorded.items()} if recorded is not None else None
    facts = HostFacts(installed=installed_versions(host, policy), manager=detect_manager(host),
                      context=read_host_context(str(host.root)), windows=windows, windows_problem=windows_problem,
                      known_good=known_good, known_good_problem=known_good_problem)
    explanation = explain(policy, facts)
    code = EXIT_VIOLATIONS if explanation.violations else 0
    rollout = rollout_notice(str(host.path(state_paths(settings).policy_bundle_state)))
    if getattr(args, "json", False):
        out.write(json.dumps({"policy": policy.name, "source": source, "sources": list(policy.sources),
                              "rollout": rollout,
                              "manager": facts.manager,
                              "os_id": facts.context.os_id, "os_version_id": facts.context.os_version_id,
                              "installed": dict(sorted(facts.installed.items())),
                              "compliant": not explanation.violations, "exit_code": code,
                              "violations": [v.to_dict() for v in explanation.violations],
                              "lines": explanation.lines}, indent=2, sort_keys=True) + "\n")
        return code
    held = [f"staged rollout: {rollout}"] if rollout else []
    _show(out, "\n".join([f"policy source: {source}", *held, *explanation.lines]) + "\n")
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
    from agent.bundle.source import policy_source

    host = make_host(args.root)
    settings = settings_of(args)  # a broken --config file stays an error (exit 3)
    # the dcgm-exporter table the guard judges with here: the package's, or the signed bundle's where dated later
    table = policy_source(host, settings.guard, settings.agent.state_dir).exporter_table()
    facts = read_freeze_facts(host, table)
    options = FreezeOptions(name=args.name, point_releases=args.allow_point_releases,
                            kernel_series=args.kernel_series, accept_inconsistent=args.accept_inconsistent)
    from agent.printable import printable

    try:
        # Escaped at print (the file is printed too, by whoever reads it): a --name or a host's package name with
        # a control character in a comment line; the TOML strings carry theirs as \u escapes already.
        text = printable(render_freeze(facts, options), keep_newlines=True)
    except FreezeRefused as exc:
        print(printable(f"gpuguard: refusing to freeze: {exc}"), file=sys.stderr)
        return EXIT_VIOLATIONS
    if not args.output:
        out.write(text)
        return 0
    try:
        write_atomically(args.output, text)
    except OSError as exc:
        raise UsageError(f"cannot write {args.output}: {exc.strerror or exc}") from None
    _show(out, f"wrote {args.output}; next: gpuguard policy check {args.output}, then put it in {DEFAULT_POLICY_DIR}/ "
               f"and run gpuguard policy compile and gpuguard pin apply\n")
    return 0


def _scope_of(args: argparse.Namespace) -> Any:
    """The bundle's scope from the command line; UsageError naming what is wrong."""
    from pydantic import ValidationError

    from agent.bundle.format import BundleScope
    from agent.errors import UsageError
    from agent.models import first_validation_problem

    labels = {}
    for item in args.labels:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise UsageError(f"--label {item}: give NAME=VALUE")
        labels[name] = value
    try:
        return BundleScope(all=args.scope_all, host_ids=tuple(args.host_ids), labels=labels,
                           gpu_models=tuple(args.gpu_models), os=tuple(args.os), pairings=tuple(args.pairings))
    except ValidationError as exc:
        problem = first_validation_problem(exc).removeprefix("(top level): ")
        raise UsageError(f"scope: {problem} (--all, --host-id, --label, --gpu-model, --os, --pairing)") from None


def policy_bundle(args: argparse.Namespace, make_host: HostFactory, out: TextIO) -> int:
    """Make a policy bundle from policy files after ``policy check``'s checks (exit 3 on an error), write it
    canonically to --output, and sign it with gpg when --sign-with names a key."""
    import getpass
    import socket

    from agent.bundle.format import render_bundle
    from agent.bundle.make import make_bundle
    from agent.errors import PolicyError, UsageError
    from agent.files import write_atomically
    from agent.policy.matrix import find_matrix_file
    from agent.validation import TIME_FORMAT

    if not args.output:
        raise UsageError("policy bundle: give --output FILE")
    scope = _scope_of(args)
    host = make_host(args.root)
    problems, summary, matrix = _checked(host, args.path, args.matrix, args.no_host)
    errors = [p for p in problems if p.severity == "error"]
    for problem in problems:
        _show(out, ("warning: " if problem.severity != "error" else "") + f"{problem.file}: {problem.text()}\n")
    if errors or summary is None:
        _show(out, f"{len(errors)} problem{'s' if len(errors) != 1 else ''} found: no bundle written\n")
        return PolicyError.exit_code
    created_by = args.created_by or f"{getpass.getuser()}@{socket.gethostname()}"
    if args.expires_days is not None and args.expires_days < 1:
        raise UsageError("--expires-days: give a whole number of days >= 1")
    expires = None
    if args.expires_days is not None:
        expires = (host.clock() + dt.timedelta(days=args.expires_days)).strftime(TIME_FORMAT)
    bundle = make_bundle(args.path, args.serial, scope, created_by, host.clock().strftime(TIME_FORMAT),
                         matrix_path=find_matrix_file(args.matrix) if args.with_matrix else None,
                         matrix_version=matrix.recorded if matrix is not None else None, expires=expires,
                         knowledge_paths=args.knowledge)
    write_atomically(args.output, render_bundle(bundle).decode("utf-8"))
    signed = ""
    if args.sign_with:
        signature = args.output + ".sig"
        # gpg runs with the runner's fixed environment: the signer's GNUPGHOME is handed over as --homedir.
        home = ["--homedir", host.env["GNUPGHOME"]] if host.env.get("GNUPGHOME") else []
        host.run(["gpg", *home, "--batch", "--yes", "--local-user", args.sign_with, "--detach-sign", "-o",
                  signature, args.output], 120.0).check()
        signed = f", signed -> {signature}"
    _show(out, f"wrote {args.output}: policy bundle serial {bundle.serial}, policy '{summary['name']}' from "
               f"{len(bundle.policy_files)} file(s){' and its matrix' if bundle.matrix else ''}"
               f"{' and knowledge ' + ', '.join(sorted(bundle.knowledge)) if bundle.knowledge else ''}{signed}\n")
    return 0


def policy_install(args: argparse.Namespace, make_host: HostFactory, out: TextIO) -> int:
    """Verify and install a signed policy bundle (agent/bundle/install.py): BundleRefused (exit 17) names why a
    bundle is refused, and the policy in force keeps guarding."""
    from agent.bundle.facts import host_scope_facts
    from agent.bundle.format import MAX_BUNDLE_BYTES
    from agent.bundle.install import BundleInstaller
    from agent.daemon_jobs.runtime import host_identity
    from agent.errors import UsageError
    from agent.files import read_bytes_bounded

    if args.allow_rollback and not (args.reason or "").strip():
        raise UsageError("--allow-rollback needs a --reason (it goes to the audit log)")
    host = make_host(args.root)
    settings = settings_of(args)
    data = read_bytes_bounded(args.bundle, MAX_BUNDLE_BYTES)
    signature = read_bytes_bounded(args.signature or args.bundle + ".sig", 1 << 20)
    paths = state_paths(settings)

    def facts() -> Any:
        return host_scope_facts(host, host_identity(host, settings.agent.host_id), dict(settings.agent.labels),
                                paths.last_snapshot)

    installed = BundleInstaller(host, settings.guard, settings.agent.state_dir).install(
        data, signature, origin=args.bundle, source="file", facts=facts, allow_rollback=args.allow_rollback)
    if installed.rolled_back_from is not None:
        from agent.guard.hotpath.overrides import audit, who

        audit_path = host.path(paths.audit_log)
        audit(str(audit_path), "policy_bundle_rolled_back", host.clock(), from_serial=installed.rolled_back_from,
              to_serial=installed.serial, key=installed.fingerprint, bundle=args.bundle, reason=args.reason.strip(),
              by=who())
        _show(out, f"rolled back from serial {installed.rolled_back_from} to {installed.serial} (recorded in "
                   f"{audit_path}); withdraw serial {installed.rolled_back_from} on the hub, or the daemon installs "
                   f"it again\n")
    if installed.unchanged:
        _show(out, f"policy bundle serial {installed.serial} is installed already: nothing changed\n")
        return 0
    where = (f"in force: compiled -> {host.path(paths.compiled_policy)}" if installed.compiled else
             'not in force: [guard] policy_source is "local" (set it to "bundle" and run gpuguard policy compile)')
    _show(out, f"installed policy bundle serial {installed.serial}, policy '{installed.policy_name}', key "
               f"{installed.fingerprint}; {where}\n")
    return 0


def policy_deny_install(args: argparse.Namespace, make_host: HostFactory, out: TextIO) -> int:
    """Verify a deny list under the trusted root and put it in force as the daemon's fetch does
    (agent/bundle/deny.py), then flag the packages installed at a version it denies; BundleRefused (exit 17)."""
    from agent.bundle.deny import MAX_DENY_BYTES
    from agent.bundle.install import BundleInstaller
    from agent.bundle.roles import MAX_SIGNATURES_BYTES
    from agent.daemon_jobs.policy_fetch import flag_denied_installed
    from agent.files import read_bytes_bounded

    host = make_host(args.root)
    settings = settings_of(args)
    data = read_bytes_bounded(args.deny, MAX_DENY_BYTES)
    signature = read_bytes_bounded(args.signature or args.deny + ".sig", MAX_SIGNATURES_BYTES)
    installer = BundleInstaller(host, settings.guard, settings.agent.state_dir)
    deny, new = installer.install_deny(data, signature, args.deny)
    found = flag_denied_installed(host, installer)
    verb = "took" if new else "in force already (nothing changed):"
    _show(out, f"{verb} deny list serial {deny.serial}, {len(deny.entries)} entries\n")
    for item in found:
        _show(out, f"known-bad version installed: {item}\n")
    return 0


def policy_trust_root(args: argparse.Namespace, make_host: HostFactory, out: TextIO) -> int:
    """Trust the first root, or walk the next root versions (agent/bundle/root.py); BundleRefused (exit 17)."""
    from agent.bundle.install import BundleInstaller
    from agent.bundle.roles import MAX_ROOT_BYTES, MAX_SIGNATURES_BYTES
    from agent.files import read_bytes_bounded

    host = make_host(args.root)
    settings = settings_of(args)
    chain = [(read_bytes_bounded(path, MAX_ROOT_BYTES), read_bytes_bounded(path + ".sig", MAX_SIGNATURES_BYTES))
             for path in args.roots]
    root = BundleInstaller(host, settings.guard, settings.agent.state_dir).walk_roots(chain, args.roots[-1])
    roles = ", ".join(f"{role.name} {role.threshold}-of-{len(role.keys)}" for role in root.policy)
    _show(out, f"trusted root version {root.version} (expires {root.expires}): root keys "
               f"{root.root.threshold}-of-{len(root.root.keys)}, policy roles {roles}\n")
    return 0


def read_freeze_facts(host: Host, exporter_table: Optional[ExporterTable] = None) -> FreezeFacts:
    """What ``policy freeze`` freezes: the packages it reads, the running kernel and the host context, judged with
    ``exporter_table`` (None: the package's dcgm-exporter table)."""
    from agent.guard.installed import detect_manager, read_installed
    from agent.hostfacts.context import read_host_context
    from agent.policy.freeze import FREEZE_PACKAGES, FreezeFacts

    installed = read_installed(host, list(FREEZE_PACKAGES))
    return FreezeFacts(installed={k: v.version for k, v in installed.items()}, manager=detect_manager(host),
                       running_kernel=host.read_first_line("/proc/sys/kernel/osrelease"),
                       context=read_host_context(str(host.root)), hostname=host.hostname(),
                       date=host.clock().date().isoformat(), exporter_table=exporter_table)
