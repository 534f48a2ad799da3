"""The checkable claims of docs/architecture.md hold: the banned process-spawning calls and where they are allowed.

Each test reads the claim from the document and the fact from where it lives (pyproject.toml, the code), so an
edit to one without the other fails here rather than leaving the document wrong.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Dict, List, Set

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.9 and 3.10
    import tomli as tomllib  # type: ignore[no-redef]

REPO = Path(__file__).resolve().parents[1]
ARCHITECTURE = REPO / "docs/architecture.md"
PYPROJECT = REPO / "pyproject.toml"
BANNED_RULE = "TID251"


def markdown_table(text: str, header: str) -> List[List[str]]:
    """The rows (cells stripped, header and rule left out) of the markdown table whose header line is ``header``."""
    lines = text.splitlines()
    starts = [i for i, line in enumerate(lines) if line.strip() == header]
    assert len(starts) == 1, f"expected one table with header {header!r}, found {len(starts)}"
    rows = []
    for line in lines[starts[0] + 2:]:
        line = line.strip()
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split("|")])
    assert rows, f"the table {header!r} has no rows"
    return rows


def backticked(cell: str) -> List[str]:
    """The `code` spans of a markdown cell or sentence, in order."""
    return re.findall(r"`([^`]+)`", cell)


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
    for pattern in _spawn_allowances_in_pyproject():
        assert list(REPO.glob(pattern)), f"pyproject.toml allows {BANNED_RULE} in {pattern}, which matches nothing"
