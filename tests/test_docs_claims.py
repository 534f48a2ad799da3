"""The checkable claims of the docs hold: the banned process-spawning calls and where they are allowed, every
exit-code table (docs/architecture.md, README.md, docs/guard.md, health.md, status.md, integrations.md), and the
drawing of the commands (docs/architecture.md).

Each test reads the claim from the document and the fact from where it lives (pyproject.toml, the code), so an
edit to one without the other fails here rather than leaving the document wrong.
"""

from __future__ import annotations

import argparse
import importlib
import re
from pathlib import Path
from types import ModuleType
from typing import Dict, Iterator, List, Set, Tuple

import agent.errors
from agent import cli
from tests.doctext import (
    REPO,
    DrawnCommand,
    backticked,
    coded_words,
    doc_text,
    drawn_commands,
    drawn_exit_codes,
    markdown_table,
    numbers,
)
from tests.test_imports import agent_modules, imported_names

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.9 and 3.10
    import tomli as tomllib  # type: ignore[no-redef]

ARCHITECTURE = REPO / "docs/architecture.md"
PYPROJECT = REPO / "pyproject.toml"
BANNED_RULE = "TID251"


def _ruff_settings() -> Dict[str, object]:
    lint = tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))["tool"]["ruff"]["lint"]
    assert isinstance(lint, dict)
    return lint


def _banned_in_pyproject() -> Set[str]:
    banned = _ruff_settings()["flake8-tidy-imports"]
    assert isinstance(banned, dict)
    return set(banned["banned-api"])


def _spawn_allowances_in_pyproject() -> Set[str]:
    ignores = _ruff_settings()["per-file-ignores"]
    assert isinstance(ignores, dict)
    return {path for path, rules in ignores.items() if BANNED_RULE in rules}


def _spawn_rule_text() -> str:
    text = ARCHITECTURE.read_text(encoding="utf-8")
    start = text.index("- **Processes are started only in the files that own them.**")
    return text[start:text.index("\n- **", start + 1)]


def test_the_banned_spawning_calls_in_the_docs_are_pyprojects() -> None:
    """docs/architecture.md names exactly the calls that pyproject.toml's banned-api table refuses."""
    sentence = re.search(r"The banned calls: (.*?)\.\s", _spawn_rule_text(), re.DOTALL)
    assert sentence, "docs/architecture.md: the process rule has no 'The banned calls: ...' sentence"
    in_docs = backticked(sentence.group(1))
    assert len(in_docs) == len(set(in_docs)), f"a banned call is named twice: {in_docs}"
    assert set(in_docs) == _banned_in_pyproject()


def test_every_spawning_call_is_banned() -> None:
    """The banned-api table covers every standard-library way to start a process, not only subprocess."""
    must = {"subprocess", "os.system", "os.popen", "os.fork", "os.forkpty", "os.posix_spawn", "os.posix_spawnp",
            "pty.fork", "pty.spawn", "multiprocessing", "concurrent.futures.ProcessPoolExecutor", "asyncio.subprocess",
            "asyncio.create_subprocess_exec", "asyncio.create_subprocess_shell"}
    import os

    must |= {f"os.{name}" for name in dir(os) if re.fullmatch(r"(exec|spawn)[lv]p?e?", name)}
    assert must <= _banned_in_pyproject(), f"not banned: {sorted(must - _banned_in_pyproject())}"


def test_the_spawn_allowances_in_the_docs_are_pyprojects() -> None:
    """The files docs/architecture.md allows to start processes are exactly pyproject.toml's TID251 allowances."""
    rows = markdown_table(_spawn_rule_text(), "| file | why it starts processes |")
    in_docs = [backticked(row[0])[0] for row in rows]
    assert len(in_docs) == len(set(in_docs)), f"a file is listed twice: {in_docs}"
    assert all(row[1] for row in rows), "every allowance in docs/architecture.md says why"
    assert set(in_docs) == _spawn_allowances_in_pyproject()


def test_every_spawn_allowance_in_pyproject_says_why() -> None:
    """Each TID251 allowance in pyproject.toml comes right after a comment line giving its reason."""
    lines = PYPROJECT.read_text(encoding="utf-8").splitlines()
    allowances = _spawn_allowances_in_pyproject()
    seen = set()
    for i, line in enumerate(lines):
        key = re.match(r'"([^"]+)"\s*=\s*\[.*"TID251"', line)
        if key and key.group(1) in allowances:
            seen.add(key.group(1))
            assert lines[i - 1].startswith("#"), f"pyproject.toml:{i + 1}: {key.group(1)} has no reason above it"
    assert seen == allowances


def test_every_spawn_allowance_names_a_file_that_exists() -> None:
    """No allowance is left behind for a file (or folder) that is gone."""
    allowances = _spawn_allowances_in_pyproject()
    assert "agent/host.py" in allowances, allowances
    for pattern in allowances:
        assert list(REPO.glob(pattern)), f"pyproject.toml allows {BANNED_RULE} in {pattern}, which matches nothing"


# The error tree's exit codes as drawn; tests/test_errors.py proves the drawing equals the classes.
ERROR_CODES = drawn_exit_codes(agent.errors.__doc__ or "")
OUTCOMES_HEADER = "| command | exit codes | in the code |"


def _module_named(cell: str) -> ModuleType:
    files = [span for span in backticked(cell) if span.endswith(".py")]
    assert len(files) == 1, f"{cell!r} names no module file (or several)"
    return importlib.import_module(files[0][:-len(".py")].replace("/", "."))


def constants_named(cell: str) -> Dict[str, int]:
    """Name -> exit code of the constants a cell names (```NAME```, ```PREFIX_*```, or a dict ```NAME``` whose keys
    are the names) in the one module file it names (```agent/x/y.py```)."""
    module = _module_named(cell)
    found: Dict[str, int] = {}
    for name in (span for span in backticked(cell) if not span.endswith(".py")):
        if name.endswith("*"):
            hits = {key: value for key, value in vars(module).items()
                    if key.startswith(name[:-1]) and isinstance(value, int)}
            assert hits, f"{module.__name__} has no constant {name}"
            found.update(hits)
        else:
            value = getattr(module, name)
            found.update(value if isinstance(value, dict) else {name: value})
    return found


def names_a_table(cell: str) -> bool:
    """Whether the cell names a dict of exit codes (status name -> code), whose names the docs must use."""
    module = _module_named(cell)
    return any(isinstance(getattr(module, span, None), dict) for span in backticked(cell))


def _outcome_rows() -> List[Tuple[str, str, str]]:
    return [(row[0], row[1], row[2]) for row in markdown_table(doc_text("docs/architecture.md"), OUTCOMES_HEADER)]


def _one_outcome(command: str) -> Dict[str, int]:
    """The constants of the architecture table's row whose command cell contains ``command``."""
    rows = [row for row in _outcome_rows() if command in row[0]]
    assert len(rows) == 1, f"docs/architecture.md: no single exit-code row for {command}"
    return constants_named(rows[0][2])


def test_the_error_exit_code_table_is_the_tree() -> None:
    """docs/architecture.md's error table gives every class of the drawn tree, and only those, its exit code."""
    in_docs: Dict[str, int] = {}
    for row in markdown_table(doc_text("docs/architecture.md"), "| exit | error |"):
        for name in backticked(row[1]):
            assert name not in in_docs, f"{name} is in the error table twice"
            in_docs[name] = int(row[0])
    assert in_docs == ERROR_CODES


def test_the_readmes_exit_codes_are_the_trees() -> None:
    """README.md's list of exit codes is 0 and every code of the error tree, none missing and none extra."""
    readme = doc_text("README.md")
    start = readme.index("Exit codes: ")
    listed = numbers(readme[start:readme.index("(the tree in `agent/errors.py`)", start)])
    assert sorted(listed) == sorted({0} | set(ERROR_CODES.values()))


def test_each_outcome_row_equals_its_constants() -> None:
    """Each row of the outcome table lists exactly the codes (and for a status table, the names) of its constants."""
    rows = _outcome_rows()
    assert len(rows) >= 5
    for command, codes, where in rows:
        constants = constants_named(where)
        if names_a_table(where):
            assert sorted(coded_words(codes)) == sorted((code, name) for name, code in constants.items()), command
        assert sorted(numbers(codes)) == sorted(set(constants.values())), f"docs/architecture.md: {command}"


def test_every_exit_code_constant_of_agent_is_in_the_outcome_table() -> None:
    """A module-level EXIT_* or *EXIT_CODES constant anywhere in agent/ is named by a row of the outcome table."""
    covered: Set[Tuple[str, str]] = set()
    for _command, _codes, where in _outcome_rows():
        spans = backticked(where)
        module_file = next(span for span in spans if span.endswith(".py"))
        for name in constants_named(where):
            covered.add((module_file, name))
        covered |= {(module_file, span) for span in spans if not span.endswith((".py", "*"))}
    found = set()
    for path in sorted((REPO / "agent").rglob("*.py")):
        for name in re.findall(r"^(EXIT_\w+|\w*EXIT_CODES)\b[^=\n]*=", path.read_text(encoding="utf-8"), re.MULTILINE):
            found.add((path.relative_to(REPO).as_posix(), name))
    assert found, "no exit-code constant found in agent/"
    assert not found - covered, f"exit-code constants no row of docs/architecture.md names: {sorted(found - covered)}"


def test_the_hot_path_exit_table_in_guard_md_is_decision_pys() -> None:
    """docs/guard.md's table of the front ends' exits lists exactly the EXIT_* codes of hotpath/decision.py."""
    rows = markdown_table(doc_text("docs/guard.md"), "| exit | meaning |")
    assert sorted(int(row[0]) for row in rows) == sorted(set(_one_outcome("hot path").values()))


def test_the_guard_command_exit_codes_in_guard_md_are_known() -> None:
    """docs/guard.md's command table uses only known codes, and names the guard commands' own where they apply."""
    own = _one_outcome("guard rollback")
    known = {0} | set(ERROR_CODES.values()) | set(own.values())
    rows = {backticked(row[0])[0].split(" [")[0]: row[2]
            for row in markdown_table(doc_text("docs/guard.md"), "| command | what it does | exit codes |")}
    for command, codes in rows.items():
        assert set(numbers(codes)) <= known, f"docs/guard.md: {command} lists an exit code nothing defines: {codes}"
    violations, rollback_failed = own["EXIT_VIOLATIONS"], own["EXIT_ROLLBACK_FAILED"]
    for command in ("gpuguard policy explain", "gpuguard policy freeze", "gpuguard guard rollback"):
        assert violations in numbers(rows[command]), f"docs/guard.md: {command} does not list {violations}"
    assert rollback_failed in numbers(rows["gpuguard guard rollback"])


def test_the_health_status_table_is_status_exit_codes() -> None:
    """docs/health.md's statuses and exit codes are exactly agent/health/model.py's STATUS_EXIT_CODES."""
    rows = markdown_table(doc_text("docs/health.md"), "| status | exit | meaning |")
    assert {row[0]: int(row[1]) for row in rows} == _one_outcome("health run")


def test_the_status_verdict_table_is_status_exit_codes() -> None:
    """docs/status.md's verdicts and exit codes are exactly agent/status/assess.py's STATUS_EXIT_CODES."""
    rows = markdown_table(doc_text("docs/status.md"), "| verdict | exit | meaning |")
    assert {row[0]: int(row[1]) for row in rows} == _one_outcome("`gpuguard status` (")


def test_the_slurm_exit_table_is_slurms_codes_and_the_config_error() -> None:
    """docs/integrations.md's Slurm exits are slurm.py's EXIT_* and a broken agent.toml's ConfigError code."""
    rows = markdown_table(doc_text("docs/integrations.md"), "| exit | meaning |")
    expected = set(_one_outcome("--slurm").values()) | {ERROR_CODES["ConfigError"]}
    assert sorted(int(row[0]) for row in rows) == sorted(expected)


def test_the_maintenance_exit_table_is_maintenance_pys_codes() -> None:
    """docs/integrations.md's ``gpuguard maintenance`` exits are maintenance.py's EXIT_MAINTENANCE_*."""
    rows = markdown_table(doc_text("docs/integrations.md"), "| exit | what it means |")
    assert sorted(int(row[0]) for row in rows) == sorted(set(_one_outcome("gpuguard maintenance").values()))


# --- the rooms of agent/ ------------------------------------------------------------------------------------------

AGENT = REPO / "agent"
MODULES_HEADER = "| module | what lives there |"
PACKAGES_HEADER = "| package | what lives there |"


def _resolve(token: str, package: Path) -> Path:
    """Where a name in a package's row points: ``agent/...`` from the repository, else inside the package if it is
    there, else from agent/ (``daemon_jobs/nfd.py`` named in another room's row)."""
    if token.startswith("agent/"):
        return REPO / token
    inside = package / token
    return inside if inside.exists() else AGENT / token


def _room_rows() -> Dict[Path, List[Path]]:
    """Package folder -> the files and folders its row in docs/architecture.md names (existing or not)."""
    rooms: Dict[Path, List[Path]] = {}
    for row in markdown_table(doc_text("docs/architecture.md"), PACKAGES_HEADER):
        package = REPO / backticked(row[0])[0]
        assert package not in rooms, f"two rows for {package.relative_to(REPO)}"
        names = [name for name in backticked(row[1]) if name.endswith((".py", "/"))]
        rooms[package] = [_resolve(name, package) for name in names]
    return rooms


def _agent_files() -> List[Path]:
    return sorted(p for p in AGENT.rglob("*.py") if p.name != "__init__.py" and "__pycache__" not in p.parts)


def test_the_module_table_names_every_top_level_module() -> None:
    """docs/architecture.md's table of agent/'s top-level modules names each of them and nothing that is not."""
    named = {REPO / backticked(row[0])[0] for row in markdown_table(doc_text("docs/architecture.md"), MODULES_HEADER)}
    assert sorted(p.name for p in named) == sorted(p.name for p in AGENT.glob("*.py") if p.name != "__init__.py")


def test_every_name_in_the_rooms_tables_exists() -> None:
    """Every file or folder a row of the packages table names exists (a file moved away fails here)."""
    missing = [f"{package.relative_to(REPO)}: {path.relative_to(REPO)}" for package, paths in _room_rows().items()
               for path in [package, *paths] if not path.exists()]
    assert not missing, f"docs/architecture.md names what does not exist: {missing}"


def test_every_module_of_agent_is_in_a_room() -> None:
    """Each module of agent/'s packages is named in the row of its package (or of a package above it)."""
    rooms = _room_rows()
    named = {path for paths in rooms.values() for path in paths}
    unnamed = [p.relative_to(REPO).as_posix() for p in _agent_files()
               if p.parent != AGENT and p not in named]
    assert not unnamed, f"docs/architecture.md's packages table names no row for: {unnamed}"
    folders = sorted({p.parent for p in _agent_files() if p.parent != AGENT})
    roomless = [f.relative_to(REPO).as_posix() for f in folders if f not in rooms and f not in named]
    assert not roomless, f"packages with neither a row nor a mention in one: {roomless}"


def test_the_modules_importing_both_apt_and_dnf_are_the_docs_list() -> None:
    """docs/architecture.md names exactly the modules of agent/ that import both agent.guard.apt and agent.guard.dnf."""
    text = doc_text("docs/architecture.md")
    sentence = re.search(r"The modules that import both:\s(.*?)\.\s", text, re.DOTALL)
    assert sentence, "docs/architecture.md: no 'The modules that import both: ...' sentence"
    in_docs = {name for name in backticked(sentence.group(1)) if name.startswith("agent/")}
    importing = set()
    for name, path in agent_modules().items():
        targets = set(imported_names(path, name))
        if any(t.startswith("agent.guard.apt") for t in targets) and any(t.startswith("agent.guard.dnf")
                                                                         for t in targets):
            importing.add(path.relative_to(REPO).as_posix())
    assert importing, "no module imports both: the check would pass on nothing"
    assert in_docs == importing


def test_the_readme_layout_names_real_paths_and_every_package() -> None:
    """README.md's layout table names only paths that exist, and each package of agent/ (docs/architecture.md has
    every module)."""
    rows = markdown_table(doc_text("README.md"), "| path | room |")
    paths = [name for row in rows for name in backticked(row[0])]
    assert [p for p in paths if not (REPO / p).exists()] == []
    packages = {f"agent/{p.name}/" for p in AGENT.iterdir() if (p / "__init__.py").is_file()}
    assert packages - set(paths) == set(), "README.md's layout leaves out a package of agent/"


def parser_commands(parser: argparse.ArgumentParser, above: Tuple[str, ...] = ()) -> Iterator[Tuple[str, ...]]:
    """Every command and subcommand a parser accepts, as its words from the top (``("hub", "policy", "push")``)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield above + (name,)
                yield from parser_commands(sub, above + (name,))


def command_differences(drawn: List[DrawnCommand], parsed: List[Tuple[str, ...]]) -> List[str]:
    """The commands the parser accepts that the drawing leaves out, and those it draws that the parser lacks."""
    words = {command.words for command in drawn}
    return ([f"not drawn: {' '.join(c)}" for c in sorted(set(parsed) - words)]
            + [f"no such command: {' '.join(c)}" for c in sorted(words - set(parsed))])


def _drawing() -> List[DrawnCommand]:
    text = doc_text("docs/architecture.md")
    assert "\n## The commands\n" in text
    section = text.split("\n## The commands\n", 1)[1].split("\n## ", 1)[0]
    blocks = section.split("```")
    assert len(blocks) == 3, "expected one drawing in docs/architecture.md, 'The commands'"
    return drawn_commands(blocks[1])


def test_the_command_drawing_check_itself() -> None:
    """A drawn tree is read with each command's words; a command the parser has and the drawing lacks, or the other
    way round, is reported (a toy parser)."""
    drawn = drawn_commands("tool\n├── a         a.py\n│   └── x\n└── b\n    └── y\n")
    assert drawn == [DrawnCommand(("a",), "a.py"), DrawnCommand(("a", "x"), ""), DrawnCommand(("b",), ""),
                     DrawnCommand(("b", "y"), "")]
    parser = argparse.ArgumentParser()
    families = parser.add_subparsers()
    families.add_parser("a").add_subparsers().add_parser("x")
    b = families.add_parser("b").add_subparsers()
    b.add_parser("y")
    assert command_differences(drawn, list(parser_commands(parser))) == []
    b.add_parser("z")
    assert command_differences(drawn[:-1], list(parser_commands(parser))) == ["not drawn: b y", "not drawn: b z"]
    assert command_differences(drawn + [DrawnCommand(("c",), "")], [("a",), ("a", "x"), ("b",), ("b", "y")]) == [
        "no such command: c"]


def test_the_command_drawing_is_the_parsers() -> None:
    """docs/architecture.md draws every command and subcommand agent/cli.py's parser accepts (help's, so not the
    internal ``_job``), and no other."""
    assert command_differences(_drawing(), list(parser_commands(cli.build_parser()))) == []


def test_each_drawn_command_family_names_its_module() -> None:
    """Each top-level command of the drawing names the module of agent/commands/ that cli._COMMANDS gives it."""
    families = {c.words[0]: c.note for c in _drawing() if len(c.words) == 1}
    assert families == {name: module.replace(".", "/") + ".py" for name, module in cli._COMMANDS
                        if not name.startswith("_")}
