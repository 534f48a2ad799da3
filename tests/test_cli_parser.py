"""The lazily built parser: a command builds only its own parser, and every help, usage and error stays the same."""

from __future__ import annotations

import argparse
import ast
from pathlib import Path
from typing import Dict, List, Tuple

import pytest

from agent import cli
from agent.cli import build_parser, command_in, main

COMMANDS_DIR = Path(cli.__file__).parent / "commands"
# Options several commands declare: only agent/commands/options.py adds them, so flag, metavar and default agree.
SHARED_OPTIONS = ("--root", "--config", "--policy", "--json", "--output", "--dry-run")


def _subparsers(parser: argparse.ArgumentParser) -> Dict[str, argparse.ArgumentParser]:
    found = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(found[0].choices) if found else {}


def _command_paths(parser: argparse.ArgumentParser, prefix: Tuple[str, ...] = ()) -> List[Tuple[str, ...]]:
    paths = []
    for name, child in _subparsers(parser).items():
        paths.append((*prefix, name))
        paths.extend(_command_paths(child, (*prefix, name)))
    return paths


COMMAND_PATHS = _command_paths(build_parser())


def _outcome(argv: List[str], capsys: pytest.CaptureFixture) -> Tuple[object, str, str]:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    captured = capsys.readouterr()
    return exit_info.value.code, captured.out, captured.err


def test_every_command_path_is_covered() -> None:
    """The walk finds the top-level commands and the nested ones (the table below is not empty by accident)."""
    assert {"snapshot", "run", "status", "policy", "hub", "health"} <= {p[0] for p in COMMAND_PATHS}
    assert ("policy", "check") in COMMAND_PATHS and ("hub", "add-host") in COMMAND_PATHS


@pytest.mark.parametrize("path", COMMAND_PATHS, ids=" ".join)
@pytest.mark.parametrize("tail", [["--help"], ["--no-such-option"]], ids=["help", "usage-error"])
def test_help_and_usage_errors_match_the_whole_parser(path: Tuple[str, ...], tail: List[str],
                                                      capsys: pytest.CaptureFixture) -> None:
    """``gpuguard CMD ... --help`` and a usage error print exactly what the parser of every command prints."""
    argv = [*path, *tail]
    lazy = _outcome(argv, capsys)
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(argv)
    captured = capsys.readouterr()
    assert lazy == (exit_info.value.code, captured.out, captured.err)
    assert lazy[1] or lazy[2]


@pytest.mark.parametrize("argv", [[], ["--help"], ["-h"], ["no-such-command"], ["--version"],
                                  ["--log-level", "debug", "--help"], ["--log-level", "snapshot"],
                                  ["--log-level=info", "nope"]])
def test_top_level_output_is_the_whole_parsers(argv: List[str], capsys: pytest.CaptureFixture) -> None:
    """Top-level help, an unknown command and a missing command list every command, as before."""
    lazy = _outcome(argv, capsys)
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(argv)
    captured = capsys.readouterr()
    assert lazy == (exit_info.value.code, captured.out, captured.err)


@pytest.mark.parametrize("argv,command", [
    (["snapshot", "--json"], "snapshot"),
    (["--log-level", "debug", "snapshot"], "snapshot"),
    (["--log-level=debug", "status", "--json"], "status"),
    (["pin", "apply"], "pin"),
    (["snapshot", "--help"], "snapshot"),
    ([], None),
    (["--help"], None),
    (["-h", "snapshot"], None),
    (["--version"], None),
    (["--log-level", "snapshot"], None),
    (["no-such-command"], None),
])
def test_command_in(argv: List[str], command: object) -> None:
    """The command is the first word after the top-level options; help, version or an unknown word mean all."""
    assert command_in(argv) == command


def test_snapshot_builds_only_its_own_parser() -> None:
    """``gpuguard snapshot`` builds one subparser, ``gpuguard pin`` too: each command family is built alone."""
    assert list(_subparsers(build_parser("snapshot"))) == ["snapshot"]
    assert list(_subparsers(build_parser("pin"))) == ["pin"]
    assert list(_subparsers(build_parser())) == [p[0] for p in COMMAND_PATHS if len(p) == 1]


def test_the_internal_job_command_is_built_only_when_run(capsys: pytest.CaptureFixture) -> None:
    """``_job`` (a child of ``gpuguard run``) is not for people: help, a usage error and completion (the whole parser)
    never name it; ``gpuguard _job`` itself still parses."""
    assert "_job" not in _subparsers(build_parser())
    assert list(_subparsers(build_parser("_job"))) == ["_job"]
    code, out, err = _outcome(["no-such-command"], capsys)
    assert code == 2 and "invalid choice: 'no-such-command'" in err and "_job" not in err
    code, out, err = _outcome(["_job", "--help"], capsys)
    assert code == 0 and out.startswith("usage: gpuguard _job")


def test_every_command_family_module_is_in_the_table() -> None:
    """Each module of agent/commands/ with an ``add_parser`` is one row of cli.py's table, and each row's module
    has one: no family that ``gpuguard`` cannot reach, no row without a parser."""
    families = {f"agent.commands.{p.stem}" for p in COMMANDS_DIR.glob("*.py")
                if "\ndef add_parser(" in p.read_text(encoding="utf-8")}
    assert families == {module for _, module in cli._COMMANDS}
    assert all(callable(cli._family(module).add_parser) for _, module in cli._COMMANDS)


def test_shared_options_are_declared_only_by_the_options_module() -> None:
    """``--root``, ``--config`` and the other shared options are added by agent/commands/options.py's helpers only,
    never by a command module or cli.py itself."""
    offenders = []
    for path in sorted([*COMMANDS_DIR.glob("*.py"), Path(cli.__file__)]):
        if path.name == "options.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add_argument"
                    and any(isinstance(a, ast.Constant) and a.value in SHARED_OPTIONS for a in node.args)):
                offenders.append(f"{path.name}:{node.lineno}")
    assert offenders == []
