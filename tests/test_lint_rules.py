"""Lint rules ruff cannot express: collectors read files only through the Host seam.

The ``subprocess`` half of the rule is ruff's banned-api table (pyproject.toml,
``[tool.ruff.lint.flake8-tidy-imports.banned-api]``). Raw file reads are checked here because ruff's banned-api
does not see a bare builtin ``open(...)`` and cannot tell ``Path.read_text`` from ``host.read_text``. Collectors
read through the Host (``host.read_text``, ``host.exists``, ``host.list_dir`` ...) so tests can point them at a
fixture tree; a raw read would read the test machine instead.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import List

import pytest

REPO = Path(__file__).resolve().parents[1]
COLLECTORS = sorted((REPO / "agent/collectors").glob("*.py"))

# Calls of these names (bare or as module attributes) read files without the Host.
_RAW_FUNCTIONS = {"open", "io.open", "os.open", "os.fdopen", "os.read", "codecs.open"}
# Methods of pathlib.Path (or of any file-like object) that read or open: allowed only on the Host itself.
_RAW_METHODS = {"read_text", "read_bytes", "open"}


def _dotted(node: ast.expr) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return ""


def _is_host(node: ast.expr) -> bool:
    """``host``, ``self.host``, ``rt.host``...: the receiver is the Host seam."""
    return _dotted(node).split(".")[-1] == "host"


def raw_reads(source: str, filename: str = "<source>") -> List[str]:
    """``line: call`` for every raw file read in source."""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        if not isinstance(node, ast.Call):
            continue
        name = _dotted(node.func)
        if name in _RAW_FUNCTIONS:
            found.append(f"{node.lineno}: {name}()")
        elif isinstance(node.func, ast.Attribute) and node.func.attr in _RAW_METHODS and not _is_host(node.func.value):
            found.append(f"{node.lineno}: {name or '<expr>.' + node.func.attr}()")
    return found


def test_the_rule_sees_raw_reads() -> None:
    """The rule finds open(), io.open, os.open and Path reads, and lets reads through the host pass."""
    source = ("import io, os\nfrom pathlib import Path\n"
              "open('/etc/os-release')\nPath('/x').read_text()\nhost.path('/y').read_bytes()\nio.open('/z')\n"
              "os.open('/w', 0)\nwith Path('/v').open() as f: pass\n"
              "host.read_text('/ok')\nself.host.read_text('/ok')\n")
    assert [line.split(":")[0] for line in raw_reads(source)] == ["3", "4", "5", "6", "7", "8"]


def test_there_are_collectors_to_check() -> None:
    """The collector glob finds the collectors, so the check below cannot pass on none."""
    assert len(COLLECTORS) > 5


@pytest.mark.parametrize("path", COLLECTORS, ids=lambda p: p.name)
def test_collectors_read_files_only_through_the_host(path: Path) -> None:
    """Each collector reads files only through the Host seam."""
    found = raw_reads(path.read_text(), str(path))
    assert not found, (f"{path.relative_to(REPO)} reads files without the Host seam: {'; '.join(found)}. "
                       "Collectors read through host.read_text / host.read_first_line / host.list_dir "
                       "(agent/host.py) so tests can point them at a fixture root.")
