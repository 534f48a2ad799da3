"""One home per fact: a default, a file name or a rule written out in agent/ once, where a test can check it."""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path
from typing import Iterator, List, Tuple

import pytest

AGENT = Path(__file__).resolve().parents[1] / "agent"


def _docstring_nodes(tree: ast.AST) -> set:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def string_constants(path: Path) -> Iterator[Tuple[int, str]]:
    """(line, text) of every string literal in the file that is not a docstring (f-string parts included)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    docstrings = _docstring_nodes(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            yield node.lineno, node.value


@functools.lru_cache(maxsize=1)
def agent_constants() -> Tuple[Tuple[str, str], ...]:
    """(``path:line``, text) of every string literal in agent/, docstrings left out, parsed once per run."""
    return tuple((f"{path.relative_to(AGENT.parent)}:{line}", text) for path in sorted(AGENT.rglob("*.py"))
                 for line, text in string_constants(path))


def homes(pattern: str) -> List[str]:
    """``path:line`` of every string literal in agent/ (docstrings left out) that matches ``pattern``."""
    regex = re.compile(pattern)
    return [where for where, text in agent_constants() if regex.search(text)]


def test_string_constants_leave_docstrings_out(tmp_path: Path) -> None:
    """The scanner sees literals and f-string parts, not module, class or function docstrings."""
    source = tmp_path / "sample.py"
    source.write_text('"""/var/lib/x in a docstring."""\n\ndef f(a):\n    """Also /var/lib/x."""\n'
                      '    return "/var/lib/x" + f"{a}/var/lib/x"\n')
    assert [text for _, text in string_constants(source)] == ["/var/lib/x", "/var/lib/x"]


@pytest.mark.parametrize("name", ["policy.compiled.json", "overrides.json", "audit.log", "guard-events.jsonl",
                                  "guard-events.position.json", "guard-events.quarantine.jsonl", "known-good.json",
                                  "known-good.before-change.json", "rollback-authorization.json",
                                  "health-rollback.json", "reboot-required.pkgs", "outbox.sqlite3",
                                  "last-snapshot.json", "health-deferral.json", "rollback.dnf", "probe-home",
                                  "baselines.json", "gpuguard.prom", ".result.json"])
def test_a_state_file_is_named_only_in_statepaths(name: str) -> None:
    """Each file of the state directory is named in agent/statepaths.py and in no other module's code."""
    found = homes(re.escape(name))
    assert found and all(h.startswith("agent/statepaths.py:") for h in found), found
