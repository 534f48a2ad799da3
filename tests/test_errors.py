"""The error tree drawn in agent/errors.py's docstring is the real one: every public exception of agent/ is in it
(name, parent, exit code) or in the docstring's short list of exceptions kept outside it, each with its reason.

The classes are found by importing every module of agent/ (but the standalone probe and ``__main__``) in a child
interpreter, so a class added anywhere, or moved, is seen without anyone listing it here.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Dict, NamedTuple, Optional

import pytest

import agent.errors
from tests.doctext import DrawnClass, drawn_tree, listed_outside

REPO = Path(__file__).resolve().parents[1]
ROOT = "GpuguardError"

_DISCOVER = r"""
import importlib, inspect, json, pkgutil, sys
import agent
found = []
for info in pkgutil.walk_packages(agent.__path__, "agent."):
    if info.name in ("agent.__main__", "agent.health.probe"):
        continue
    module = importlib.import_module(info.name)
    for name, obj in vars(module).items():
        if (inspect.isclass(obj) and issubclass(obj, BaseException) and obj.__module__ == module.__name__
                and not name.startswith("_")):
            found.append({"name": name, "file": module.__file__, "parent": obj.__bases__[0].__name__,
                          "ancestors": [c.__name__ for c in obj.__mro__], "exit_code": getattr(obj, "exit_code", None)})
json.dump(found, sys.stdout)
"""


class RealClass(NamedTuple):
    """A public exception class of agent/ as imported: where it is defined, its first base, its exit code."""

    name: str
    file: str
    parent: str
    is_gpuguard_error: bool
    exit_code: Optional[int]


@pytest.fixture(scope="module")
def real_classes() -> Dict[str, RealClass]:
    """Every public exception class defined in agent/, by name (names are unique, asserted here)."""
    done = subprocess.run([sys.executable, "-c", _DISCOVER], cwd=REPO, capture_output=True, text=True, timeout=60,
                          check=False)
    assert done.returncode == 0, done.stderr
    classes: Dict[str, RealClass] = {}
    for entry in json.loads(done.stdout):
        assert entry["name"] not in classes, f"two public exceptions named {entry['name']}: names must be unique"
        classes[entry["name"]] = RealClass(entry["name"], Path(entry["file"]).relative_to(REPO).as_posix(),
                                           entry["parent"], ROOT in entry["ancestors"], entry["exit_code"])
    assert ROOT in classes and len(classes) > 10, f"discovery found too little: {sorted(classes)}"
    return classes


DOC = agent.errors.__doc__ or ""


def test_the_tree_and_the_list_are_found_in_the_docstring() -> None:
    """The parser reads the whole drawing (root first) and the whole list, so no check below runs on nothing."""
    drawn = drawn_tree(DOC)
    assert drawn[0] == DrawnClass(ROOT, None, 1, drawn[0].text)
    assert len(drawn) == DOC.count("── ") + 1, "a line of the tree was not parsed"
    assert len(listed_outside(DOC)) >= 1


def test_the_parser_gives_each_drawn_class_its_parent() -> None:
    """Indentation in the drawing is what gives a class its parent, down to the third level."""
    doc = ("    A      exit 1   root\n    ├── B  exit 2   b\n    │   └── C  exit 2   c\n"
           "    │       └── D  exit 2   d\n    └── E  exit 3   e\n")
    assert [(c.name, c.parent) for c in drawn_tree(doc)] == [("A", None), ("B", "A"), ("C", "B"), ("D", "C"),
                                                             ("E", "A")]


def test_each_drawn_class_exists_with_its_parent_and_exit_code(real_classes: Dict[str, RealClass]) -> None:
    """Every class drawn is a real class of agent/ whose direct base and exit_code are the drawing's."""
    drawn = drawn_tree(DOC)
    assert len(drawn) > 10 and len({c.name for c in drawn}) == len(drawn), "a class is drawn twice (or none)"
    for cls in drawn:
        real = real_classes.get(cls.name)
        assert real is not None, f"errors.py draws {cls.name}, which no module of agent/ defines"
        assert (real.parent if cls.parent else None) == cls.parent, \
            f"{cls.name} derives from {real.parent}, the tree draws it under {cls.parent}"
        assert real.exit_code == cls.exit_code, \
            f"{cls.name}.exit_code is {real.exit_code}, the tree says {cls.exit_code}"


def test_a_drawn_class_outside_errors_py_names_its_file(real_classes: Dict[str, RealClass]) -> None:
    """A class drawn in the tree but defined beside its use says in which file, and that file is the right one."""
    for cls in drawn_tree(DOC):
        real = real_classes[cls.name]
        if real.file != "agent/errors.py":
            assert f"({real.file})" in cls.text, f"errors.py: {cls.name} is defined in {real.file}; the tree says not"


def test_every_gpuguard_error_is_drawn(real_classes: Dict[str, RealClass]) -> None:
    """No subclass of GpuguardError anywhere in agent/ is missing from the drawn tree."""
    drawn = {c.name for c in drawn_tree(DOC)}
    missing = sorted(name for name, real in real_classes.items() if real.is_gpuguard_error and name not in drawn)
    assert not missing, f"agent/errors.py's tree does not draw {missing}"


def test_every_other_public_exception_is_listed_with_its_reason(real_classes: Dict[str, RealClass]) -> None:
    """An exception that is not a GpuguardError is in the docstring's list, with its real file and a reason."""
    listed = {c.name: c for c in listed_outside(DOC)}
    assert listed, "the docstring's list of exceptions outside the tree was not found"
    others = sorted(name for name, real in real_classes.items() if not real.is_gpuguard_error)
    assert sorted(listed) == others, ("exceptions outside the tree must each be listed in agent/errors.py's docstring "
                                      f"(and only those): listed {sorted(listed)}, found {others}")
    for name, entry in listed.items():
        assert entry.file == real_classes[name].file, \
            f"{name} is defined in {real_classes[name].file}, not {entry.file}"
        assert len(entry.reason.split()) >= 4, f"{name}: the list says why it stays outside the tree"
