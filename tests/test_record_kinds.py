"""Each of the five record kinds is declared only where docs/architecture.md's "Which record kind where" table says.

Classes are read from the source (ast): a base ``Record``, ``Frozen``, ``FrozenModel`` or ``NamedTuple``, or a
``@frozen_record`` / ``@dataclass`` decorator. The table's last column names folders and files (``agent/hub/``,
``agent/host.py``), "the hot path only" or "anywhere off the hot path"; the hot path is tests/test_imports.py's.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Dict, List, Set, Tuple

import pytest

from tests.doctext import REPO, backticked, doc_text, markdown_table
from tests.test_imports import agent_modules, hot_path_closure

HEADER = "| kind | use it for | declared in |"
# The table's first column (its first `code` span) -> the kind's name below.
KINDS = {"Record": "record", "Frozen": "frozen", "FrozenModel": "model", "dataclasses": "dataclass",
         "NamedTuple": "namedtuple"}


def _name(node: ast.expr) -> str:
    """The last name of ``X``, ``mod.X`` or ``X(...)``."""
    if isinstance(node, ast.Call):
        return _name(node.func)
    if isinstance(node, ast.Attribute):
        return node.attr
    return node.id if isinstance(node, ast.Name) else ""


def kinds_declared(source: str) -> List[Tuple[str, str]]:
    """(kind, class name) for every record-kind class declared in ``source``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.ClassDef):
            continue
        bases = {_name(base) for base in node.bases}
        decorators = {_name(decorator) for decorator in node.decorator_list}
        for kind, hit in (("record", "Record" in bases), ("frozen", "frozen_record" in decorators),
                          ("model", "FrozenModel" in bases), ("dataclass", "dataclass" in decorators),
                          ("namedtuple", "NamedTuple" in bases)):
            if hit:
                found.append((kind, node.name))
    return found


def _rules() -> Dict[str, str]:
    """Kind -> the table's "declared in" cell."""
    rules = {}
    for row in markdown_table(doc_text("docs/architecture.md"), HEADER):
        rules[KINDS[backticked(row[0])[0]]] = row[2]
    assert set(rules) == set(KINDS.values()), f"the table has a row for each of the five kinds: {sorted(rules)}"
    return rules


@pytest.fixture(scope="module")
def declared() -> List[Tuple[str, str, str, bool]]:
    """(kind, class, file, on the hot path) for every record-kind class in agent/."""
    modules = agent_modules()
    hot = hot_path_closure(modules)
    out = []
    for name, path in sorted(modules.items()):
        for kind, cls in kinds_declared(path.read_text(encoding="utf-8")):
            out.append((kind, cls, path.relative_to(REPO).as_posix(), name in hot))
    return out


def test_the_reader_sees_each_kind() -> None:
    """Each way of declaring a kind is recognised, bare or qualified, with or without arguments."""
    source = ("class A(Record): pass\n@frozen_record\nclass B(Frozen): pass\nclass C(models.FrozenModel): pass\n"
              "@dataclasses.dataclass(frozen=True)\nclass D: pass\n@dataclass\nclass E: pass\n"
              "class F(typing.NamedTuple): pass\nclass G(Exception): pass\n")
    assert kinds_declared(source) == [("record", "A"), ("frozen", "B"), ("model", "C"), ("dataclass", "D"),
                                      ("dataclass", "E"), ("namedtuple", "F")]


def test_every_kind_is_in_use(declared: List[Tuple[str, str, str, bool]]) -> None:
    """The scan finds classes of all five kinds, so the placement check below runs on something."""
    assert {kind for kind, _cls, _file, _hot in declared} == set(KINDS.values())


def test_each_kind_is_declared_only_where_the_table_says(declared: List[Tuple[str, str, str, bool]]) -> None:
    """A class of a kind outside the places its row names is a finding (move it, or change the kind or the table)."""
    rules = _rules()
    wrong: List[str] = []
    for kind, cls, file, hot in declared:
        where = rules[kind]
        if where == "the hot path only":
            ok = hot
        elif where == "anywhere off the hot path":
            ok = not hot
        else:
            places = backticked(where)
            assert places, f"docs/architecture.md: {kind}: no place named in {where!r}"
            ok = not hot and any(file == place or (place.endswith("/") and file.startswith(place)) for place in places)
        if not ok:
            wrong.append(f"{file}: {cls} is a {kind}, which the table declares in: {where}")
    assert not wrong, "\n".join(wrong)


def test_the_places_the_table_names_exist() -> None:
    """Every folder and file in the table's last column exists, so a move cannot leave the table pointing nowhere."""
    for cell in _rules().values():
        missing: Set[str] = {place for place in backticked(cell) if not Path(REPO, place).exists()}
        assert not missing, f"docs/architecture.md names {sorted(missing)}, which do not exist"
