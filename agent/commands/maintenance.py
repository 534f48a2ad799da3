"""``gpuguard maintenance begin|end|status``: hand this node to the scheduler while it changes, and take it back.

``begin --reason R`` drains the Slurm node (or labels the Kubernetes node) and waits until nothing runs there;
``end`` gives it back (resumed only when gpuguard drained it), or with ``--check STATUS`` acts on a post-change
health result: pass or busy end the hold, a failed check keeps the node out with the reason. Exit 0 done, 40 jobs
still run after the wait, 41 kept out of service, 42 Slurm asked to reboot the node (the change needs a reboot)
(agent/integrations/maintenance.py, docs/integrations.md).
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, TextIO

from agent.commands.options import add_config, add_group, add_root
from agent.wire import HEALTH_STATUSES

if TYPE_CHECKING:
    from agent.commands import HostFactory, Subparsers


def add_parser(sub: Subparsers) -> None:
    m_sub = add_group(sub, "maintenance", "hand this node to the scheduler (Slurm drain, Kubernetes label) while it "
                                          "changes: exit 0 done, 40 jobs still running, 41 kept out of service, "
                                          "42 rebooting")
    begin = m_sub.add_parser("begin", help="drain (Slurm) or label (Kubernetes) this node and wait until no job runs")
    begin.add_argument("--reason", required=True, help="why, shown to the scheduler (\"rollout R stage 2\")")
    begin.add_argument("--wait-seconds", type=float, metavar="SECONDS",
                       help="how long to wait for running jobs (default [integrations] drain_wait_seconds)")
    end = m_sub.add_parser("end", help="give the node back; resumed only when gpuguard drained it")
    end.add_argument("--check", choices=HEALTH_STATUSES, metavar="STATUS",
                     help="the post-change health result: pass/busy end the hold, regression, cpu_fallback, failed "
                          "and timeout keep the node out, skipped/deferred change nothing")
    end.add_argument("--summary", default="", help="with --check: what failed, kept in the drain reason")
    status = m_sub.add_parser("status", help="the hold this host has on its node")
    for parser, handler in ((begin, maintenance_begin), (end, maintenance_end), (status, maintenance_status)):
        add_config(parser)
        add_root(parser)
        parser.set_defaults(handler=handler)


def maintenance_begin(args: argparse.Namespace, make_host: HostFactory, out: TextIO) -> int:
    """Drain or label the node; 0 when no job runs there any more, 40 when jobs still run after the wait."""
    from agent.commands.guard_inputs import settings_of, state_paths
    from agent.integrations.maintenance import begin_maintenance

    settings = settings_of(args)
    outcome = begin_maintenance(make_host(args.root), state_paths(settings), settings.integrations,
                                settings.report.nfd_features_file, args.reason, args.wait_seconds)
    out.write(outcome.line + "\n")
    return outcome.exit_code


def maintenance_end(args: argparse.Namespace, make_host: HostFactory, out: TextIO) -> int:
    """Give the node back, or with --check act on a post-change health result (41: kept out of service, 42: a
    reboot asked of Slurm)."""
    from agent.commands.guard_inputs import settings_of, state_paths
    from agent.integrations.maintenance import after_check, end_maintenance, maintenance_status

    settings = settings_of(args)
    host, paths = make_host(args.root), state_paths(settings)
    nfd_file = settings.report.nfd_features_file
    if args.check is None:
        outcome = end_maintenance(host, paths, settings.integrations, nfd_file)
    else:
        checked = after_check(host, paths, settings.integrations, nfd_file, args.check, args.summary)
        outcome = checked if checked is not None else maintenance_status(host, paths)
    out.write(outcome.line + "\n")
    return outcome.exit_code


def maintenance_status(args: argparse.Namespace, make_host: HostFactory, out: TextIO) -> int:
    """The persisted hold: 0 none or held, 40 still draining, 41 kept after a failed check, 42 rebooting."""
    from agent.commands.guard_inputs import settings_of, state_paths
    from agent.integrations.maintenance import maintenance_status as status_of

    settings = settings_of(args)
    outcome = status_of(make_host(args.root), state_paths(settings))
    out.write(outcome.line + "\n")
    return outcome.exit_code
