"""The ``gpuguard`` command: builds the parser from the table of command families and dispatches to the handler
the parsed command names; known errors become one line and an exit code.

Every command family is a module of agent/commands/ of one shape (``add_parser`` and its handlers; see
agent/commands/__init__.py). Only the family that runs is imported, and it imports what it needs inside its
handlers: building its parser needs only argparse and the default paths (agent/defaults.py), so ``gpuguard snapshot``
loads no other command, no settings model of another area, no scheduler, no HTTP client and no logger it does not
use (tests/test_cli_imports.py pins this).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from typing import TYPE_CHECKING, Any, List, Optional, Sequence, TextIO, Tuple, cast

from agent import __version__
from agent.errors import GpuguardError
from agent.log import configure, get_logger

if TYPE_CHECKING:
    from agent.commands import CommandFamily, HostFactory
    from agent.host import Host


def _terminal_columns() -> int:
    """The width argparse would wrap help to (``shutil.get_terminal_size``: COLUMNS, the terminal, else 80)."""
    try:
        columns = int(os.environ.get("COLUMNS", "0"))
    except ValueError:
        columns = 0
    stdout = sys.__stdout__
    if columns <= 0 and stdout is not None:
        try:
            columns = os.get_terminal_size(stdout.fileno()).columns
        except (AttributeError, ValueError, OSError):
            columns = 0
    return columns or 80


class _HelpFormatter(argparse.HelpFormatter):
    """argparse's own, given the width: argparse makes one for every argument added and would otherwise import
    shutil (with bz2 and lzma) to ask the terminal, on every command, help or not (issue #17)."""

    def __init__(self, prog: str) -> None:
        super().__init__(prog, width=_terminal_columns() - 2)


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose help formatter is :class:`_HelpFormatter`; subcommand parsers are of this class too."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", _HelpFormatter)
        super().__init__(**kwargs)


def build_parser(command: Optional[str] = None) -> argparse.ArgumentParser:
    """The command line's parser: every command's, or only ``command``'s (see :func:`command_in`).

    A command's own parser, its help and its usage are the same either way: each is built by the same function.
    """
    parser: argparse.ArgumentParser = _Parser(
        prog="gpuguard", description="Keep a GPU host's driver/ROCm/CUDA stack frozen and working.")
    parser.add_argument("--version", action="version", version=f"gpuguard {__version__}")
    parser.add_argument("--log-level", default="warning", choices=_LOG_LEVELS)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name, module in _COMMANDS:
        # Internal commands (``_job``) exist only when run: help, usage errors and completion never list them.
        if command == name or (command is None and not name.startswith("_")):
            _family(module).add_parser(sub)
    return parser


def _family(module: str) -> CommandFamily:
    """The command family's module, imported now."""
    return cast("CommandFamily", importlib.import_module(module))


def command_in(argv: Sequence[str]) -> Optional[str]:
    """The command ``argv`` runs when only its parser is needed; None when the whole parser is (no command, an
    unknown one, ``gpuguard --help``, an option argparse must judge), so help, errors and completion see every
    command."""
    expect_value = False
    for arg in argv:
        if expect_value:
            expect_value = False
        elif arg == "--log-level":
            expect_value = True
        elif arg.startswith("--log-level="):
            continue
        elif arg.startswith("-"):
            return None
        else:
            return arg if any(arg == name for name, _ in _COMMANDS) else None
    return None


_LOG_LEVELS = ["debug", "info", "warning", "error"]
# Every command family, in the order ``gpuguard --help`` lists them: the command and its module in agent/commands/,
# imported only when its parser is built (a snapshot loads no other command's module).
_COMMANDS: Tuple[Tuple[str, str], ...] = (
    ("snapshot", "agent.commands.snapshot"),
    ("run", "agent.commands.run"),
    ("_job", "agent.commands.job"),
    ("schema", "agent.commands.schema"),
    ("status", "agent.commands.status"),
    ("hub", "agent.commands.hub"),
    ("policy", "agent.commands.policy"),
    ("pin", "agent.commands.pin"),
    ("override", "agent.commands.override"),
    ("guard", "agent.commands.guard"),
    ("health", "agent.commands.health"),
    ("maintenance", "agent.commands.maintenance"),
)


def _host_for_root(root: str) -> "Host":
    """The default host factory (agent.host imported only by the commands that read a host)."""
    from agent.host import Host

    return Host.for_root(root)


def main(argv: Optional[List[str]] = None, make_host: HostFactory = _host_for_root,
         out: Optional[TextIO] = None) -> int:
    """Entry point; returns the process exit code."""
    if argv is None:
        argv = sys.argv[1:]
    args = build_parser(command_in(argv)).parse_args(argv)
    configure(level=args.log_level)
    stream = out if out is not None else sys.stdout
    try:
        return args.handler(args, make_host, stream)
    except GpuguardError as exc:
        get_logger("cli").debug("command_failed", error=str(exc), exit_code=exc.exit_code)
        # One write with its newline (print makes two): a job child shares the daemon's stderr (agent/log.py).
        sys.stderr.write(f"gpuguard: error: {exc}\n")
        return exc.exit_code
    except KeyboardInterrupt:
        sys.stderr.write("gpuguard: interrupted\n")
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
