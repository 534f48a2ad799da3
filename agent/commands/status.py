"""``gpuguard status [--json] [--offline]``: gather, assess, print a table (or JSON), exit with the verdict's code.

``gpuguard status --slurm [--drain]``: the same facts judged for Slurm (agent/integrations/slurm.py), one line.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, TextIO

from agent.commands.options import add_config, add_json, add_root

if TYPE_CHECKING:
    from agent.commands import HostFactory, Subparsers
    from agent.host import Host
    from agent.integrations.slurm import SlurmVerdict


def add_parser(sub: Subparsers) -> None:
    status_parser = sub.add_parser("status", help="is the agent all right: daemon, last snapshot/health/guard "
                                                  "results, compliance, outbox, hub (exit 0 ok, 30 attention, 31 "
                                                  "failing)")
    add_json(status_parser, "print checks and facts as JSON instead of a table")
    status_parser.add_argument("--offline", action="store_true", help="do not contact the hub")
    add_config(status_parser)
    add_root(status_parser, "look for the daemon under DIR's /proc instead of / (tests)")
    status_parser.add_argument("--slurm", action="store_true", help="one line for a Slurm Prolog or "
                               "HealthCheckProgram: exit 0 ok (a busy GPU included), 1 drain "
                               "(docs/integrations.md); never asks the hub")
    status_parser.add_argument("--drain", action="store_true", help="with --slurm: drain this node through "
                               "scontrol on a failure, resume it only when gpuguard drained it")
    status_parser.add_argument("--node-name", metavar="NAME", help="the Slurm node name for --drain (default "
                               "$SLURMD_NODENAME, else the short host name)")
    status_parser.set_defaults(handler=status)


def status(args: argparse.Namespace, make_host: HostFactory, out: TextIO) -> int:
    """Print the status; the exit code is 0 ok, 30 attention, 31 failing (STATUS_EXIT_CODES). With --slurm, the
    Slurm line instead."""
    if args.slurm or args.drain:
        return slurm_check(args, make_host, out)
    from agent.status.assess import assess
    from agent.status.facts import gather
    from agent.status.render import render_json, render_table

    facts = gather(make_host(args.root), args.config, args.offline)
    assessment = assess(facts)
    out.write(render_json(facts, assessment) if args.json else render_table(facts, assessment))
    return assessment.exit_code


def slurm_check(args: argparse.Namespace, make_host: HostFactory, out: TextIO) -> int:
    """Print ``gpuguard: ok|drain: REASON``; exit 0 (busy and deferred included) or 1 (drain). With --drain,
    drain or resume the node through scontrol as well (for HealthCheckProgram, whose exit code slurmd ignores)."""
    from agent.errors import GpuguardError
    from agent.integrations.slurm import node_name
    from agent.status.assess import assess
    from agent.status.facts import gather
    from agent.status.slurm import slurm_verdict

    host = make_host(args.root)
    facts = gather(host, args.config, offline=True)  # the hub is not Slurm's business, and must not slow a Prolog
    verdict = slurm_verdict(facts, assess(facts))
    line = f"gpuguard: {'drain' if verdict.drain else 'ok'}: {verdict.reason}"
    if args.drain:
        name = node_name(host, args.node_name)
        try:
            line += f" (node {name}: {_apply(host, args.config, name, verdict)})"
        except GpuguardError:
            out.write(line + "\n")  # the verdict stands; the CLI adds scontrol's failure as its own line
            raise
    out.write(line + "\n")
    return verdict.exit_code


def _apply(host: "Host", config_path: str, node: str, verdict: "SlurmVerdict") -> str:
    """What --drain did: after a reboot the hand-off asked for, its gate gives the node back or keeps it out
    (agent/integrations/maintenance.py after_boot); otherwise drain or resume as a health check does."""
    from agent.integrations.slurm import apply_to_node

    if verdict.reboot_gate == "judged":
        from agent.config import load_settings
        from agent.integrations.maintenance import after_boot
        from agent.statepaths import StatePaths

        settings = load_settings(config_path)
        outcome = after_boot(host, StatePaths(settings.agent.state_dir), settings.integrations,
                             settings.report.nfd_features_file, passed=not verdict.drain, why=verdict.reason)
        if outcome is not None:
            return outcome.line
    return apply_to_node(host, node, verdict)
