"""The import rules the layout depends on: no cycle in agent/, apt/ and dnf/ apart, a stdlib-only hot path."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Set

import pytest

AGENT = Path(__file__).resolve().parents[1] / "agent"

# What runs inside every apt and dnf transaction: the apt hook, the dnf4 checker, the dnf5 action, and the folder
# they share. Everything these import, transitively, must be the standard library or agent code obeying the same.
HOT_PATH_ENTRIES = ("agent.guard.apt.hook", "agent.guard.dnf.check", "agent.guard.dnf.dnf5_action")
HOT_PATH_FOLDERS = ("agent.guard.hotpath", "agent.hostfacts")


def module_name(path: Path) -> str:
    parts = path.relative_to(AGENT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def agent_modules() -> Dict[str, Path]:
    return {module_name(p): p for p in sorted(AGENT.rglob("*.py"))}


def imported_names(path: Path, name: str) -> Iterator[str]:
    """Every module an import statement in the file names (at any depth, type-checking blocks included)."""
    is_package = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = name.split(".") if is_package else name.split(".")[:-1]
                package = package[:len(package) - (node.level - 1)]
                base = ".".join(package + ([node.module] if node.module else []))
            yield base
            yield from (f"{base}.{alias.name}" for alias in node.names)


def agent_edges(modules: Dict[str, Path]) -> Dict[str, Set[str]]:
    return {name: {m for m in imported_names(path, name) if m in modules and m != name}
            for name, path in modules.items()}


def find_cycle(edges: Dict[str, Set[str]]) -> Optional[List[str]]:
    """One import cycle as a path of module names, or None."""
    state: Dict[str, int] = {}
    stack: List[str] = []

    def visit(node: str) -> Optional[List[str]]:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(edges[node]):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return None

    for start in sorted(edges):
        if start not in state:
            found = visit(start)
            if found:
                return found
    return None


def test_find_cycle_finds_a_cycle() -> None:
    """The cycle finder itself: a -> b -> c -> a is reported, a DAG is not."""
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_no_import_cycle_in_agent() -> None:
    """No module of agent/ imports itself back through others (function-level imports included)."""
    cycle = find_cycle(agent_edges(agent_modules()))
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


@pytest.mark.parametrize("one,other", [("agent.guard.apt", "agent.guard.dnf"), ("agent.guard.dnf", "agent.guard.apt")])
def test_apt_and_dnf_never_import_each_other(one: str, other: str) -> None:
    """agent/guard/apt/ and agent/guard/dnf/ meet only in agent/guard/manager.py and the neutral modules."""
    modules = agent_modules()
    offenders = sorted(f"{name} imports {target}" for name, targets in agent_edges(modules).items()
                       if name.startswith(one + ".") for target in targets if target.startswith(other))
    assert offenders == []


def hot_path_closure(modules: Dict[str, Path]) -> Set[str]:
    edges = agent_edges(modules)
    todo = list(HOT_PATH_ENTRIES) + [m for m in modules if m.startswith(HOT_PATH_FOLDERS)]
    seen: Set[str] = set()
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo.extend(edges[name])
    return seen


def test_hot_path_imports_only_the_standard_library() -> None:
    """Every module the apt hook and the dnf checkers can import, at any depth, needs only the standard library."""
    modules = agent_modules()
    closure = hot_path_closure(modules)
    assert set(HOT_PATH_ENTRIES) <= closure and "agent.policy.evaluate" in closure
    stdlib = set(sys.stdlib_module_names) | {"__future__"}
    offenders = []
    for name in sorted(closure):
        for target in imported_names(modules[name], name):
            top = target.split(".", 1)[0]
            if top not in stdlib and top != "agent":
                offenders.append(f"{name} imports {target}")
    assert offenders == [], "the hot path must import the standard library only:\n" + "\n".join(offenders)


def test_hot_path_entries_load_on_a_bare_interpreter() -> None:
    """``python3 -I -S`` (no site-packages, as the packaged hook runs) imports the entries and nothing else."""
    code = ("import sys; sys.path.insert(0, sys.argv[1]); before = set(sys.modules)\n"
            f"for name in {HOT_PATH_ENTRIES!r}: __import__(name)\n"
            "extra = sorted(m.split('.')[0] for m in set(sys.modules) - before)\n"
            "print(' '.join(sorted(set(e for e in extra if e not in sys.stdlib_module_names and e != 'agent'))))")
    result = subprocess.run([sys.executable, "-I", "-S", "-c", code, str(AGENT.parent)], capture_output=True,
                            text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == ""
