"""``gpuguard _job NAME``: one job body in a child of ``gpuguard run`` (agent/daemon_jobs/children.py); not for
people, so help, usage errors and completion never list it (agent/cli.py builds it only when it runs)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, TextIO

from agent.commands.options import add_config, add_root
from agent.defaults import JOB_NAMES

if TYPE_CHECKING:
    from agent.commands import HostFactory, Subparsers


def add_parser(sub: Subparsers) -> None:
    job_parser = sub.add_parser("_job")
    job_parser.add_argument("job", choices=JOB_NAMES)
    add_config(job_parser, help=None, metavar=None)
    add_root(job_parser, help=None)
    job_parser.add_argument("--request", default="{}")
    job_parser.add_argument("--result", required=True)
    job_parser.set_defaults(handler=job)


def job(args: argparse.Namespace, make_host: HostFactory, out: TextIO) -> int:
    """Run the job the daemon asked for (agent/daemon_jobs/child_main.py); its exit code."""
    from agent.daemon_jobs.child_main import parse_request, run_job

    return run_job(args.job, args.config, make_host(args.root), parse_request(args.request), args.result)
