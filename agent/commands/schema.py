"""``gpuguard schema``: the JSON schema of report events."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, TextIO

from agent.commands.options import add_output

if TYPE_CHECKING:
    from agent.commands import HostFactory, Subparsers


def add_parser(sub: Subparsers) -> None:
    schema_parser = sub.add_parser("schema", help="print the JSON schema of report events (schemas/events-v1.json)")
    add_output(schema_parser, "write it to FILE (atomically) instead")
    schema_parser.set_defaults(handler=schema)


def schema(args: argparse.Namespace, make_host: HostFactory, out: TextIO) -> int:
    """Print the schema, or write it to --output."""
    from agent.files import write_atomically
    from agent.report.schema import render_schema

    if args.output:
        write_atomically(args.output, render_schema())
    else:
        out.write(render_schema())
    return 0
