"""The parser pieces several commands share, declared once: the options (the same flag, metavar and default
everywhere; the help where a command means something of its own by it: ``--root`` of ``status`` is where to look
for the daemon) and the command with subcommands (``policy check``, ``hub serve``)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Optional

from agent.defaults import DEFAULT_CONFIG_PATH, DEFAULT_HUB_CONFIG_PATH, DEFAULT_POLICY_DIR

if TYPE_CHECKING:
    from agent.commands import Subparsers

READ_ROOT_HELP = "read the host tree under DIR instead of / (chroot, fixture)"
ACT_ROOT_HELP = "act on the host tree under DIR instead of / (chroot, fixture)"
AGENT_CONFIG_HELP = f"agent config file (default {DEFAULT_CONFIG_PATH}; missing means defaults)"
HUB_CONFIG_HELP = f"hub config file (default {DEFAULT_HUB_CONFIG_PATH}; missing means defaults)"
POLICY_HELP = f"policy file or directory (default: [guard] policy_path, {DEFAULT_POLICY_DIR} under --root)"


def add_group(sub: Subparsers, name: str, help: str) -> Subparsers:
    """Command ``name``, whose subcommands (one of them required) are added to what this returns; the one chosen
    is ``args.NAME_command``."""
    group = sub.add_parser(name, help=help).add_subparsers(dest=f"{name}_command", metavar=f"{name.upper()}_COMMAND")
    group.required = True
    return group


def add_root(parser: argparse.ArgumentParser, help: Optional[str] = READ_ROOT_HELP) -> None:
    """``--root DIR`` (default ``/``): the host tree the command reads or acts on."""
    parser.add_argument("--root", default="/", help=help)


def add_config(parser: argparse.ArgumentParser, help: Optional[str] = AGENT_CONFIG_HELP,
               metavar: Optional[str] = "PATH") -> None:
    """``--config PATH`` (default /etc/gpuguard/agent.toml): the agent's config file."""
    parser.add_argument("--config", default=DEFAULT_CONFIG_PATH, metavar=metavar, help=help)


def add_hub_config(parser: argparse.ArgumentParser) -> None:
    """``--config PATH`` of a hub command: None when not given, so that only an explicit file must exist."""
    parser.add_argument("--config", metavar="PATH", help=HUB_CONFIG_HELP)


def add_guard_options(parser: argparse.ArgumentParser, policy: bool = True) -> None:
    """``--root``, ``--config`` and (with ``policy``) ``--policy``: what a guard command acts on."""
    add_root(parser, ACT_ROOT_HELP)
    add_config(parser)
    if policy:
        parser.add_argument("--policy", metavar="PATH", help=POLICY_HELP)


def add_json(parser: argparse.ArgumentParser, help: str) -> None:
    """``--json``: print the result as JSON."""
    parser.add_argument("--json", action="store_true", help=help)


def add_output(parser: argparse.ArgumentParser, help: str) -> None:
    """``--output FILE`` / ``-o FILE``: where to write the result."""
    parser.add_argument("--output", "-o", metavar="FILE", help=help)


def add_dry_run(parser: argparse.ArgumentParser, help: str) -> None:
    """``--dry-run``: say what would be done, change nothing."""
    parser.add_argument("--dry-run", action="store_true", help=help)
