"""Readers for the claims documents make: markdown tables, `code` spans, and the error tree drawn in a docstring.

Shared by the tests that compare a document with the code (tests/test_docs_claims.py, tests/test_errors.py).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Dict, Iterator, List, Match, NamedTuple, Optional, Tuple

REPO = Path(__file__).resolve().parents[1]


def doc_text(relative: str) -> str:
    """The text of a document of the repository, e.g. ``docs/architecture.md``."""
    return (REPO / relative).read_text(encoding="utf-8")


def markdown_table(text: str, header: str) -> List[List[str]]:
    """The rows (cells stripped, header and rule left out) of the one markdown table whose header line is ``header``."""
    lines = text.splitlines()
    starts = [i for i, line in enumerate(lines) if line.strip() == header]
    assert len(starts) == 1, f"expected one table with header {header!r}, found {len(starts)}"
    rows = []
    for line in lines[starts[0] + 2:]:
        line = line.strip()
        if not line.startswith("|"):
            break
        rows.append([cell.strip().replace("\\|", "|") for cell in re.split(r"(?<!\\)\|", line.strip("|"))])
    assert rows, f"the table {header!r} has no rows"
    return rows


def backticked(text: str) -> List[str]:
    """The `code` spans of a markdown cell or sentence, in order."""
    return re.findall(r"`([^`]+)`", text)


def numbers(text: str) -> List[int]:
    """Every whole number written in ``text``, in order (``0, 2 (bad window), 4`` -> [0, 2, 4])."""
    return [int(n) for n in re.findall(r"(?<![\w.])(\d+)(?![\w.])", text)]


def coded_words(text: str) -> List[Tuple[int, str]]:
    """The ``N word`` pairs of a list such as ``0 pass, 20 regression`` -> [(0, "pass"), (20, "regression")]."""
    return [(int(n), word) for n, word in re.findall(r"(?<![\w.])(\d+) (\w+)", text)]


class DrawnClass(NamedTuple):
    """One line of a drawn error tree: the class, its parent in the drawing (None for the root), its exit code."""

    name: str
    parent: Optional[str]
    exit_code: int
    text: str


class ListedClass(NamedTuple):
    """One entry of a docstring's list of exceptions outside the tree: the class, its file, the reason."""

    name: str
    file: str
    reason: str


def _walk_tree(text: str, pattern: str, what: str) -> Iterator[Tuple[Match[str], List[str]]]:
    """Each line of a tree drawn with ``├──``/``└──`` that ``pattern`` matches (group 1 its indent, group 2 its
    name), with the names of the lines it stands under, the top one first."""
    stack: List[str] = []
    for line in text.splitlines():
        match = re.match(pattern, line)
        if not match:
            continue
        depth = len(match.group(1)) // 4 + (1 if "──" in line else 0)
        del stack[depth:]
        assert len(stack) == depth, f"{what}: {line.strip()!r} is indented under nothing"
        yield match, list(stack)
        stack.append(match.group(2))


def drawn_tree(doc: str) -> List[DrawnClass]:
    """The tree lines of a docstring (``    ├── Name   exit N   text``), each with the parent its indent gives."""
    return [DrawnClass(match.group(2), above[-1] if above else None, int(match.group(3)), match.group(4))
            for match, above in _walk_tree(doc, r"^    ((?:[│ ]   )*)(?:[├└]── )?(\w+)\s+exit (\d+)\s+(.*)$",
                                           "the drawn tree")]


def drawn_exit_codes(doc: str) -> Dict[str, int]:
    """Class name -> exit code, as the drawn tree says."""
    return {cls.name: cls.exit_code for cls in drawn_tree(doc)}


def listed_outside(doc: str) -> List[ListedClass]:
    """A docstring's ``    Name (agent/file.py): reason`` lines: the exceptions kept outside the tree."""
    return [ListedClass(*match.groups()) for match in
            re.finditer(r"^    (\w+) \((agent/[\w/]+\.py)\): (.+)$", doc, re.MULTILINE)]


class DrawnCommand(NamedTuple):
    """One line of a drawn command tree: the command's words from the top (``("hub", "policy", "push")``) and what
    the line says after it (a module path, or empty)."""

    words: Tuple[str, ...]
    note: str


def drawn_commands(block: str) -> List[DrawnCommand]:
    """The lines of a command tree drawn as ``├── name   note`` under one top line, each with its words from the
    top command down (the top line itself left out)."""
    return [DrawnCommand(tuple(above[1:] + [match.group(2)]), (match.group(3) or "").strip())
            for match, above in _walk_tree(block, r"^((?:[│ ]   )*)(?:[├└]── )?(\S+)(?:\s+(.*))?$",
                                           "the drawn commands") if above]
