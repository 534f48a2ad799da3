"""The import rules the layout depends on: the floors, no cycle in agent/, no two top-level packages importing each
other, apt/ and dnf/ apart, policy/ pure, a stdlib-only hot path."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Optional, Set, Tuple

import pytest

from tests.doctext import backticked

AGENT = Path(__file__).resolve().parents[1] / "agent"
ARCHITECTURE = AGENT.parent / "docs" / "architecture.md"
CONTRIBUTING = AGENT.parent / "CONTRIBUTING.md"

# The floors of agent/, lowest first (docs/architecture.md, "Floors"): a module imports from its own floor or below.
# A name stands for a module or a package with everything in it; the longest name that covers a module decides.
FLOORS: Dict[str, int] = {
    # F0 ground: leaves every floor may use
    "agent": 0, "agent.errors": 0, "agent.records": 0, "agent.frozen": 0, "agent.strictjson": 0, "agent.files": 0,
    "agent.defaults": 0, "agent.log": 0, "agent.models": 0, "agent.validation": 0, "agent.statepaths": 0,
    "agent.rollback_coverage": 0, "agent.wire": 0,
    "agent.versions": 0, "agent.tomlreader": 0, "agent.jsonrecord": 0, "agent.hostfacts": 0,
    # F1 seams, and the policy engine (pure: the ground floor and itself, test_policy_is_pure)
    "agent.host": 1, "agent.gpu_libraries": 1, "agent.configfile": 1, "agent.policy": 1,
    # F2
    "agent.collectors": 2,
    # F3 areas
    "agent.snapshot": 3, "agent.guard": 3, "agent.health": 3, "agent.report": 3,
    "agent.bundle": 3,
    # F4: what composes the areas
    "agent.status": 4, "agent.integrations": 4, "agent.config": 4,
    # F5: the daemon's jobs, the hub, the command families
    "agent.daemon_jobs": 5, "agent.hub": 5, "agent.commands": 5,
    # F6 top
    "agent.cli": 6, "agent.daemon": 6, "agent.__main__": 6,
}
# Inside agent/guard/ the rule once more: the hot path, the neutral modules apt and dnf share, apt and dnf, what
# reads through both (installed sets), rollback and zypper (whose hook decides with the dnf checker), then the
# manager that builds tools and backends from settings.
GUARD_STEPS: Dict[str, int] = {
    "agent.guard.hotpath": 1,
    "agent.guard": 2, "agent.guard.locks": 2, "agent.guard.pin_records": 2, "agent.guard.settings": 2,
    "agent.guard.rollback.backend": 2, "agent.guard.rollback.kept": 2,
    "agent.guard.apt": 3, "agent.guard.dnf": 3,
    "agent.guard.installed": 4, "agent.guard.rollback": 4, "agent.guard.zypper": 4,
    "agent.guard.manager": 5,
}
# Upward imports that are allowed, each with its reason (the same list in docs/architecture.md, "Floors"); at most
# MAX_UPWARD. An entry no import uses any more fails test_no_module_imports_a_higher_floor: delete it then.
ALLOWED_UPWARD: Dict[Tuple[str, str], str] = {
    ("agent.commands.run", "agent.daemon"):
        "gpuguard run is the daemon: its handler hands the process to run_daemon, the top of what it runs",
}
MAX_UPWARD = 4

# What runs inside every apt, dnf and zypper transaction: the apt hook, the dnf4 checker, the dnf5 action, the
# zypper guard's rpm plugin hook and commit plugin, and the folder they share. Everything these import,
# transitively, must be the standard library or agent code obeying the same.
HOT_PATH_ENTRIES = ("agent.guard.apt.hook", "agent.guard.dnf.check", "agent.guard.dnf.dnf5_action",
                    "agent.guard.zypper.rpm_hook", "agent.guard.zypper.commit_plugin")
HOT_PATH_FOLDERS = ("agent.guard.hotpath", "agent.hostfacts", "agent.policy.families")


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


def top_level(name: str) -> str:
    """The direct child of agent/ that ``name`` is or is in: ``agent.guard.apt.hook`` -> ``agent.guard``."""
    return ".".join(name.split(".")[:2])


def mutual_imports(edges: Dict[str, Set[str]]) -> List[str]:
    """Each pair of top-level packages (or modules) of agent/ that import each other, with one import each way."""
    example: Dict[Tuple[str, str], str] = {}
    for source, targets in sorted(edges.items()):
        for target in sorted(targets):
            one, other = top_level(source), top_level(target)
            if "agent" not in (one, other) and one != other:
                example.setdefault((one, other), f"{source} imports {target}")
    return [f"{one} <-> {other}: {example[one, other]}; {example[other, one]}"
            for one, other in sorted(example) if one < other and (other, one) in example]


def test_mutual_imports_finds_a_pair() -> None:
    """The mutual-import finder itself: a.x -> b.y with b.z -> a.w is a pair; one way, or inside one package, is not."""
    pair = {"agent.a.x": {"agent.b.y"}, "agent.b.z": {"agent.a.w"}, "agent.a.w": set(), "agent.b.y": set()}
    assert mutual_imports(pair) == ["agent.a <-> agent.b: agent.a.x imports agent.b.y; agent.b.z imports agent.a.w"]
    assert mutual_imports({"agent.a.x": {"agent.b.y"}, "agent.b.y": {"agent.c"}, "agent.c": set()}) == []
    assert mutual_imports({"agent.a.x": {"agent.a.y"}, "agent.a.y": {"agent.a.x"}}) == []


def test_no_two_top_level_packages_import_each_other() -> None:
    """No two direct children of agent/ (guard/ and bundle/, status/ and integrations/, ...) import each other,
    function-level and TYPE_CHECKING imports included: what both need moves down or to one side."""
    assert mutual_imports(agent_edges(agent_modules())) == []


@pytest.mark.parametrize("one,other", [("agent.guard.apt", "agent.guard.dnf"), ("agent.guard.dnf", "agent.guard.apt")])
def test_apt_and_dnf_never_import_each_other(one: str, other: str) -> None:
    """guard/apt/ and guard/dnf/ meet only in guard/installed.py, guard/manager.py and the neutral modules."""
    modules = agent_modules()
    offenders = sorted(f"{name} imports {target}" for name, targets in agent_edges(modules).items()
                       if name.startswith(one + ".") for target in targets if target.startswith(other))
    assert offenders == []


def covering(table: Dict[str, int], name: str) -> Optional[int]:
    """The value of the longest name in ``table`` that is ``name`` or a package above it; None when none is."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        found = table.get(".".join(parts[:end]))
        if found is not None:
            return found
    return None


def is_upward(source: str, target: str, floor_of: Callable[[str], Optional[int]] = lambda m: covering(FLOORS, m),
              step_of: Callable[[str], Optional[int]] = lambda m: covering(GUARD_STEPS, m)) -> bool:
    """Whether importing ``target`` from ``source`` goes up a floor (or up a step inside agent/guard/)."""
    source_floor, target_floor = floor_of(source), floor_of(target)
    assert source_floor is not None and target_floor is not None, (source, target)
    if target_floor != source_floor:
        return target_floor > source_floor
    source_step, target_step = step_of(source), step_of(target)
    return source_step is not None and target_step is not None and target_step > source_step


def upward_imports(edges: Dict[str, Set[str]]) -> List[Tuple[str, str]]:
    return sorted((name, target) for name, targets in edges.items() for target in targets if is_upward(name, target))


def test_the_floor_rule_itself() -> None:
    """Up a floor is upward, down or level is not, and inside agent/guard/ the steps count (a toy table)."""
    floors = {"a": 0, "b": 1, "b.g": 1}
    steps = {"b.g.low": 1, "b.g": 2}

    def upward(source: str, target: str) -> bool:
        return is_upward(source, target, lambda m: covering(floors, m), lambda m: covering(steps, m))

    assert upward("a.x", "b.y") and not upward("b.y", "a.x") and not upward("b.y", "b.z")
    assert upward("b.g.low.x", "b.g.top") and not upward("b.g.top", "b.g.low.x") and not upward("b.y", "b.g.low")


def test_every_module_has_a_floor_and_every_floor_names_a_module() -> None:
    """Each module of agent/ is on a floor, and each name in FLOORS and GUARD_STEPS is a module or package."""
    modules = agent_modules()
    assert [m for m in modules if covering(FLOORS, m) is None] == []
    assert sorted(set(FLOORS) | set(GUARD_STEPS)) == sorted(n for n in set(FLOORS) | set(GUARD_STEPS) if n in modules)


def test_no_module_imports_a_higher_floor() -> None:
    """No import (module- or function-level, TYPE_CHECKING blocks included) goes up a floor but the allowed ones,
    and every allowed one is still there."""
    found = upward_imports(agent_edges(agent_modules()))
    unexplained = [f"{source} imports {target}" for source, target in found if (source, target) not in ALLOWED_UPWARD]
    assert unexplained == [], ("imports that go up a floor (move the leaf down or hand the dependency in):\n"
                               + "\n".join(unexplained))
    assert sorted(set(ALLOWED_UPWARD) - set(found)) == []


def test_at_most_four_upward_imports_each_with_its_reason_in_the_docs() -> None:
    """The allowed upward imports are few, each has a reason, and docs/architecture.md lists the same ones."""
    assert len(ALLOWED_UPWARD) <= MAX_UPWARD
    text = ARCHITECTURE.read_text(encoding="utf-8")
    assert "\n## Floors\n" in text
    section = text.split("\n## Floors\n", 1)[1].split("\n## ", 1)[0]
    for (source, target), reason in ALLOWED_UPWARD.items():
        assert reason.strip() and f"`{source}` imports `{target}`" in section, (source, target)
    assert section.count("` imports `") == len(ALLOWED_UPWARD)


def test_policy_is_pure() -> None:
    """agent/policy/ imports the ground floor and itself only: no Host, settings, collectors, guard or report."""
    modules = agent_modules()
    offenders = sorted(f"{name} imports {target}" for name, targets in agent_edges(modules).items()
                       if name.startswith("agent.policy") for target in targets
                       if not target.startswith("agent.policy") and covering(FLOORS, target) != 0)
    assert offenders == []


def loads(start: str, modules: Dict[str, Path]) -> Set[str]:
    """The modules of agent/ that importing ``start`` can load, at any depth: what each imports (function-level and
    TYPE_CHECKING imports included) and the packages above each, whose ``__init__`` importing it runs."""
    edges = agent_edges(modules)
    todo, seen = [start], set()
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            parts = name.split(".")
            todo.extend(".".join(parts[:end]) for end in range(1, len(parts)) if ".".join(parts[:end]) in modules)
            todo.extend(edges[name])
    return seen


def test_alert_webhooks_load_nothing_of_the_dashboard() -> None:
    """agent/hub/alerts.py words an event through agent/hub/describe.py and loads no module of agent/hub/dashboard/
    (the renderer included), at any depth."""
    modules = agent_modules()
    loaded = loads("agent.hub.alerts", modules)
    assert "agent.hub.describe" in loaded and "agent.hub.store" in loaded
    assert sorted(m for m in loaded if m.startswith("agent.hub.dashboard")) == []
    assert "agent.hub.dashboard.render" in loads("agent.hub.app", modules)  # the walk does reach the renderer


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


def hot_path_modules(modules: Dict[str, Path]) -> Set[str]:
    """The hot path as a process loads it: the closure above and every package above one of its modules, whose
    ``__init__`` importing it runs."""
    closure = hot_path_closure(modules)
    return closure | {".".join(name.split(".")[:end]) for name in closure for end in range(1, name.count(".") + 1)}


def named_as_in_the_docs(names: Set[str]) -> Set[str]:
    """Module names as the documents list them: a module of HOT_PATH_FOLDERS by its folder (which is named whole)."""
    return {next((folder for folder in HOT_PATH_FOLDERS if name.startswith(folder + ".")), name) for name in names}


def documented_hot_path(text: str, start: str, end: str) -> Set[str]:
    """The agent modules a document names between ``start`` and ``end`` (paths or dotted names), as dotted names."""
    flat = " ".join(text.split())
    assert flat.count(start) == 1, f"expected {start!r} once"
    section = flat.split(start, 1)[1]
    assert end in section, f"expected {end!r} after {start!r}"
    names = set()
    for span in backticked(start + section.split(end, 1)[0]):
        if span == "agent" or span.startswith(("agent.", "agent/")):
            dotted = span.strip("/").replace("/", ".")
            names.add(dotted[:-len(".py")] if dotted.endswith(".py") else dotted)
    return names


def hot_path_differences(documented: Set[str], computed: Set[str]) -> List[str]:
    """What a document's hot-path list leaves out of the computed one, and what it names that is not on it."""
    real = named_as_in_the_docs(computed)
    return ([f"missing: {name}" for name in sorted(real - documented)]
            + [f"not on the hot path: {name}" for name in sorted(documented - real)])


def test_the_hot_path_list_comparison_itself() -> None:
    """A list naming a folder, a file path and dotted modules matches; one leaving a module out or naming an extra
    one does not (a toy text and closure)."""
    text = "x The hot path is `agent/guard/hotpath/`, `agent/guard/apt/hook.py` and `agent.errors`, `agent`. Stop"
    listed = documented_hot_path(text, "The hot path is", "Stop")
    assert listed == {"agent.guard.hotpath", "agent.guard.apt.hook", "agent.errors", "agent"}
    computed = {"agent.guard.hotpath.entry", "agent.guard.apt.hook", "agent.errors", "agent"}
    assert hot_path_differences(listed, computed) == []
    assert hot_path_differences(listed, computed | {"agent.files"}) == ["missing: agent.files"]
    assert hot_path_differences(listed | {"agent.log"}, computed) == ["not on the hot path: agent.log"]


@pytest.mark.parametrize("document,start,end", [
    (ARCHITECTURE, "The hot path is", "The launchers"),
    (CONTRIBUTING, "So `agent/guard/hotpath/`", "import the standard library only:"),
])
def test_the_documented_hot_path_is_the_computed_one(document: Path, start: str, end: str) -> None:
    """docs/architecture.md ("Rules") and CONTRIBUTING.md name every module the hot path loads, the package
    ``__init__`` files included, and nothing else."""
    listed = documented_hot_path(document.read_text(encoding="utf-8"), start, end)
    assert hot_path_differences(listed, hot_path_modules(agent_modules())) == []
