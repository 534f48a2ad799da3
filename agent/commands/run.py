"""``gpuguard run``: the agent daemon (agent/daemon.py)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, TextIO

from agent.commands.options import add_config, add_root

if TYPE_CHECKING:
    from agent.commands import HostFactory, Subparsers


def add_parser(sub: Subparsers) -> None:
    run_parser = sub.add_parser("run", help="run the agent daemon: snapshots, package watch, health checks, "
                                            "reporting")
    add_config(run_parser)
    add_root(run_parser)
    run_parser.set_defaults(handler=run)


def run(args: argparse.Namespace, make_host: HostFactory, out: TextIO) -> int:
    """Run the daemon until it is stopped; its exit code."""
    from agent.daemon_jobs.openssl import keep_openssl_out

    keep_openssl_out()  # before structlog (through asyncio) would load it
    from agent.daemon_jobs.lazy_asyncio import defer_asyncio

    defer_asyncio()  # before structlog imports it
    from agent.daemon import run_daemon

    return run_daemon(args.config, make_host(args.root))
