"""Every test says in its docstring what behaviour it proves (CONTRIBUTING.md: a one-sentence docstring each).

Read from the source (ast), so a test is seen whether or not pytest would collect it here (chroot, packaging, ...).
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import List, Tuple

TESTS = Path(__file__).resolve().parent


def undocumented(source: str, filename: str = "<source>") -> List[str]:
    """``line: name`` of every test function (``test*``, top level or in a class) without a docstring."""
    found: List[Tuple[int, str]] = []
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test"):
            if not (ast.get_docstring(node) or "").strip():
                found.append((node.lineno, node.name))
    return [f"{line}: {name}" for line, name in sorted(found)]


def test_the_check_sees_tests_without_a_docstring() -> None:
    """Functions, methods and async tests without a docstring (or with a blank one) are found; others are not."""
    source = ('def test_a():\n    """Proves a."""\n\ndef test_b():\n    pass\n\nclass TestC:\n'
              '    def test_c(self):\n        pass\n\nasync def test_d():\n    """ """\n\ndef helper():\n    pass\n')
    assert undocumented(source) == ["4: test_b", "8: test_c", "11: test_d"]


def test_every_test_has_a_docstring() -> None:
    """No test function under tests/ lacks the docstring saying what it proves."""
    files = sorted(TESTS.rglob("test_*.py"))
    assert len(files) > 100, "the glob found too few test files to mean anything"
    missing = [f"{path.relative_to(TESTS.parent)}:{where}" for path in files
               for where in undocumented(path.read_text(encoding="utf-8"), str(path))]
    assert not missing, "tests without a docstring (one sentence: what behaviour the test proves):\n" + \
        "\n".join(missing)
