"""``gpuguard pin apply``: the policy rendered as native pins, apt preferences on dpkg hosts, dnf versionlock
entries on rpm hosts with dnf, zypper locks on rpm hosts with zypper."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, TextIO, Tuple

from agent.commands.guard_inputs import compile_policy, installed_versions, settings_of, state_paths
from agent.commands.options import add_dry_run, add_group, add_guard_options

if TYPE_CHECKING:
    from agent.commands import HostFactory, Subparsers
    from agent.config import Settings
    from agent.guard.pin_records import PinFileChanges
    from agent.host import Host
    from agent.policy.compiled import CompiledPolicy


def add_parser(sub: Subparsers) -> None:
    pin_sub = add_group(sub, "pin", "native pins rendered from the policy (apt preferences.d, dnf versionlock, "
                                    "zypper locks)")
    apply = pin_sub.add_parser("apply", help="write /etc/apt/preferences.d/gpuguard-*.pref (dpkg hosts), "
                                             "gpuguard's dnf versionlock entries (rpm hosts with dnf) or its "
                                             "/etc/zypp/locks blocks (zypper hosts), remove stale ones")
    add_guard_options(apply)
    add_dry_run(apply, "print what would change; write nothing")
    apply.set_defaults(handler=pin_apply)


def pin_apply(args: argparse.Namespace, make_host: HostFactory, out: TextIO) -> int:
    """Render the policy as native pins: apt preferences on dpkg hosts, dnf versionlock entries on rpm hosts, zypper
    locks on zypper hosts; gpuguard's stale ones are removed, nobody else's."""
    from agent.guard.installed import detect_manager
    from agent.guard.zypper.locks import uses_zypper
    from agent.policy.load import write_compiled

    host = make_host(args.root)
    settings = settings_of(args)
    _, policy = compile_policy(args, host, settings)
    if not args.dry_run:
        write_compiled(str(host.path(state_paths(settings).compiled_policy)), policy)
    if detect_manager(host) == "rpm":
        if uses_zypper(host):
            return _pin_apply_zypper_locks(args, host, policy, out)
        return _pin_apply_versionlock(args, host, settings, policy, out)
    return _pin_apply_apt(args, host, settings, policy, out)


def _pin_apply_apt(args: argparse.Namespace, host: Host, settings: Settings, policy: CompiledPolicy,
                   out: TextIO) -> int:
    from agent.guard.apt.preferences import apply_pins
    from agent.guard.apt.tool import AptTool

    tool = AptTool(host, timeout_seconds=settings.guard.package_tool_timeout_seconds,
                   lock_timeout_seconds=settings.guard.lock_timeout_seconds)
    changes, wanted = apply_pins(host, policy, settings.guard.preferences_dir, tool, installed_versions(host, policy),
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

    tool = dnf_tool_for(host, settings.guard, state_paths(settings))
    installed = installed_versions(host, policy)
    changes = apply_versionlock(host, policy, tool, installed, dry_run=args.dry_run)
    if changes.note:
        out.write(f"note: {changes.note}\n")
    _report_pins(changes, args.dry_run, ("entry", "entries"), out)
    return 0


def _report_pins(changes: "PinFileChanges", dry_run: bool, nouns: Tuple[str, str], out: TextIO) -> None:
    """What a versionlock list or zypper's locks file got: written or not, gpuguard's entries added and removed (the
    others left alone), then the AMD pins note."""
    total = changes.unchanged + len(changes.added)
    noun = nouns[0] if total == 1 else nouns[1]
    if changes.changed:
        verb = "would write" if dry_run else "wrote"
        out.write(f"{verb} {changes.path}: {total} gpuguard {noun} ({len(changes.added)} new, {len(changes.removed)} "
                  f"stale removed); other {nouns[1]} left alone\n")
        if dry_run:
            out.write(changes.text)
    elif total:
        out.write(f"unchanged {changes.path}: {total} gpuguard {noun}\n")
    for entry in changes.added:
        out.write(f"  + {entry}\n")
    for entry in changes.removed:
        out.write(f"  - {entry}\n")
    if not total and not changes.removed:
        out.write("nothing to pin\n")
    _note_amd_pins(changes.text, out)


def _pin_apply_zypper_locks(args: argparse.Namespace, host: Host, policy: CompiledPolicy, out: TextIO) -> int:
    from agent.guard.zypper.locks import apply_locks

    changes = apply_locks(host, policy, installed_versions(host, policy), dry_run=args.dry_run)
    _report_pins(changes, args.dry_run, ("lock", "locks"), out)
    return 0
