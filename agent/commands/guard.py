"""``gpuguard guard rollback``: the after-the-fact guard for changes that bypassed apt/dnf (dpkg -i, rpm -U)."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, TextIO

from agent.commands.guard_inputs import (
    EXIT_ROLLBACK_FAILED,
    EXIT_VIOLATIONS,
    policy_for_host,
    settings_of,
    state_paths,
)
from agent.commands.options import add_dry_run, add_group, add_guard_options

if TYPE_CHECKING:
    from agent.commands import HostFactory, Subparsers
    from agent.guard.rollback.kept import RecordProgress


def add_parser(sub: Subparsers) -> None:
    grd_sub = add_group(sub, "guard", "after-the-fact guard for changes that bypassed apt/dnf (dpkg -i, rpm -U)")
    rollback = grd_sub.add_parser("rollback", help="compare with the last known-good set and roll back violations "
                                                  "(exit 0 ok, 10 violations left, 14 rollback failed)")
    add_guard_options(rollback)
    add_dry_run(rollback, "plan only (apt-get -s, dnf --assumeno)")
    rollback.set_defaults(handler=guard_rollback)


def _progress_line(progress: "RecordProgress") -> None:
    """A long known-good record's progress, one line on stderr (stdout keeps the summary)."""
    sys.stderr.write(progress.line() + "\n")


def guard_rollback(args: argparse.Namespace, make_host: HostFactory, out: TextIO) -> int:
    """Check the installed set against the last known-good one; roll back when the policy says so."""
    from agent.guard.manager import backend_for
    from agent.guard.rollback.core import check_and_rollback

    host = make_host(args.root)
    settings = settings_of(args)
    policy = policy_for_host(args, host, settings)
    paths = state_paths(settings)
    result = check_and_rollback(host, settings.guard, paths, backend_for(host, settings.guard, paths), policy=policy,
                                dry_run=args.dry_run, progress=_progress_line)
    out.write(result.summary())
    if result.status == "failed":
        return EXIT_ROLLBACK_FAILED
    if result.status in ("violations", "no_known_good", "override", "inconsistent"):
        return EXIT_VIOLATIONS
    return 0
