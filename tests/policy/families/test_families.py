"""The ordered table of rule families is what evaluate, compile, the compiled document's check, freeze and the
policy model run, in its documented order, and nothing beside it."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import typing
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping

import pytest

from agent.policy import evaluate as evaluate_module
from agent.policy import model as model_module
from agent.policy.compiled import CompiledPolicy, check_compiled
from agent.policy.evaluate import FAMILIES, HostState, Violation, evaluate, facts_used, family
from agent.policy.freeze import FreezeFacts, render_freeze
from agent.policy.load import compile_policy, guarded_patterns, load_policy
from agent.policy.model import SECTIONS, Policy

REPO = Path(__file__).resolve().parents[3]
FAMILY_DIR = REPO / "agent" / "policy" / "families"
SECTION_DIR = REPO / "agent" / "policy" / "sections"
# A policy with a section for every family that has one (the matrix family's switch needs AMD's matrix: not here).
EVERY_SECTION_TOML = """
[policy]
name = "all"
[amd]
[[amd.pairing]]
name = "p"
amdgpu = "6.2.*"
rocm = "6.2.*"
[kernel]
allow = "6.8.*"
[nvidia]
[[nvidia.pairing]]
name = "n"
driver = "580.*"
cuda = "13.*"
[[versions]]
packages = ["nvidia-container-toolkit"]
allow = "1.17.*"
[[bake]]
family = "driver"
min_age_days = 7
[frozen]
packages = ["dkms"]
[companions]
dcgm = false
[containers]
[workloads]
verified = ["resnet-train"]
"""


def every_section() -> CompiledPolicy:
    """A compiled policy with every family's section present (what is in them does not matter here)."""
    data: Dict[str, Any] = {"name": "all", "action": "block", "kernel_packages": [], "guarded": []}
    data.update({name: {"present": True} for name in FAMILIES})
    data["versions"] = [{"packages": ["x"], "allow": "any"}]
    return CompiledPolicy(data)


def test_every_family_module_is_in_the_table_exactly_once() -> None:
    """Each module of agent/policy/families/ is named once in FAMILIES, and FAMILIES names no other."""
    modules = sorted(p.stem for p in FAMILY_DIR.glob("*.py") if p.name != "__init__.py")
    assert modules, "no family module found"
    assert len(FAMILIES) == len(set(FAMILIES))
    assert sorted(FAMILIES) == modules


def test_the_table_order_is_the_documented_one() -> None:
    """docs/architecture.md names the family modules in the order FAMILIES runs them."""
    text = (REPO / "docs" / "architecture.md").read_text(encoding="utf-8")
    documented = [m for m in re.findall(r"`families/(\w+)\.py`", text) if m != "__init__"]
    assert documented, "docs/architecture.md names no family module"
    assert tuple(documented) == FAMILIES


def protocol_members() -> Dict[str, str]:
    """The members of the Family protocol (agent/policy/evaluate.py) as ``{name: "function" or "constant"}``."""
    tree = ast.parse((REPO / "agent" / "policy" / "evaluate.py").read_text(encoding="utf-8"))
    found = [node for node in ast.walk(tree) if isinstance(node, ast.ClassDef) and node.name == "Family"]
    assert len(found) == 1, "no Family protocol in agent/policy/evaluate.py"
    members = {}
    for node in found[0].body:
        if isinstance(node, ast.FunctionDef):
            members[node.name] = "function"
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            members[node.target.id] = "constant"
    return members


def test_the_protocol_has_every_part_of_a_family() -> None:
    """The Family protocol names the facts, check, explain, compiled form, guarded globs, shape check and freeze
    output of a family, and where its freeze lines go."""
    assert set(protocol_members()) == {"FREEZE_PLACE", "facts", "check", "explain", "compiled", "guarded", "shape",
                                       "freeze"}


@pytest.mark.parametrize("name", FAMILIES)
def test_each_family_provides_every_protocol_member(name: str) -> None:
    """Every family module has each function and constant of the Family protocol."""
    module = family(name)
    for member, kind in protocol_members().items():
        value = getattr(module, member, None)
        if kind == "function":
            assert callable(value), f"{name}.{member}"
        else:
            assert isinstance(value, int) and not isinstance(value, bool), f"{name}.{member}"


def test_freeze_places_are_distinct() -> None:
    """No two families share a FREEZE_PLACE, so the order of policy freeze's sections is defined."""
    places = [family(name).FREEZE_PLACE for name in FAMILIES]
    assert len(places) == len(set(places))


def spy(monkeypatch: pytest.MonkeyPatch, member: str, called: List[str]) -> None:
    """Replace ``member`` of every family by a wrapper that records the family's name and calls the original."""
    for name in FAMILIES:
        original: Callable[..., Any] = getattr(family(name), member)

        def wrapper(*args: Any, name: str = name, original: Callable[..., Any] = original) -> Any:
            called.append(name)
            return original(*args)

        monkeypatch.setattr(family(name), member, wrapper)


def every_section_loaded(tmp_path: Path) -> Any:
    """The policy EVERY_SECTION_TOML, loaded."""
    path = tmp_path / "all.toml"
    path.write_text(EVERY_SECTION_TOML, encoding="utf-8")
    return load_policy(str(path))


def test_compile_writes_each_family_once_in_table_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """compile_policy asks every family of the table for its compiled part (and for its guarded globs) once, in
    table order, and the compiled document has each family's key."""
    loaded = every_section_loaded(tmp_path)
    compiled: List[str] = []
    guarded: List[str] = []
    spy(monkeypatch, "compiled", compiled)
    spy(monkeypatch, "guarded", guarded)
    data = compile_policy(loaded)
    assert compiled == list(FAMILIES) and guarded == list(FAMILIES)
    assert set(FAMILIES) <= set(data)
    guarded.clear()
    guarded_patterns(loaded.policy)
    assert guarded == list(FAMILIES)


def test_the_compiled_check_runs_each_present_family_in_table_order(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """check_compiled runs the shape check of every family whose section is present, in table order, and not
    that of a family whose section is absent (the hook imports only the families its policy has)."""
    data = compile_policy(every_section_loaded(tmp_path))
    called: List[str] = []
    spy(monkeypatch, "shape", called)
    check_compiled(data, "<test>")
    # no require_amd_matrix: matrix is None; no deny list in force: denied is [] (only a deny list fills it)
    assert called == [name for name in FAMILIES if name not in ("matrix", "denied")]
    called.clear()
    check_compiled({**data, "nvidia": None, "versions": [], "companions": None}, "<test>")
    assert called == [name for name in FAMILIES
                      if name not in ("nvidia", "versions", "matrix", "companions", "denied")]


def test_freeze_writes_each_family_once_in_freeze_place_order(monkeypatch: pytest.MonkeyPatch) -> None:
    """render_freeze asks every family of the table for its lines once, ordered by FREEZE_PLACE."""
    called: List[str] = []
    spy(monkeypatch, "freeze", called)
    render_freeze(FreezeFacts(installed={"linux-image-6.8.0-45-generic": "6.8.0-45.45"},
                              running_kernel="6.8.0-45-generic", hostname="h"))
    assert called == sorted(FAMILIES, key=lambda name: family(name).FREEZE_PLACE)


def test_every_section_module_is_a_family_of_the_table() -> None:
    """Each module of agent/policy/sections/ is named after a family of FAMILIES, and model.py found each one."""
    modules = sorted(p.stem for p in SECTION_DIR.glob("*.py") if p.name != "__init__.py")
    assert modules, "no section module found"
    assert set(modules) <= set(FAMILIES)
    assert sorted(SECTIONS) == modules
    assert list(SECTIONS) == [name for name in FAMILIES if name in SECTIONS]


def test_the_policy_model_has_exactly_the_tables_sections() -> None:
    """Policy's fields are [policy], each family's section (from its module's FIELD) in table order, and
    [health]; nothing else."""
    assert list(Policy.model_fields) == ["policy", *SECTIONS, "health"]
    for name, section in SECTIONS.items():
        assert Policy.model_fields[name].annotation == section.FIELD[0], name


def declared_fields() -> Mapping[str, Any]:
    """The fields of the TYPE_CHECKING declaration of Policy in agent/policy/model.py (mypy's view), their
    annotations evaluated."""
    tree = ast.parse((REPO / "agent" / "policy" / "model.py").read_text(encoding="utf-8"))
    found = [node for node in ast.walk(tree) if isinstance(node, ast.ClassDef) and node.name == "Policy"]
    assert len(found) == 1, "no declaration of Policy in agent/policy/model.py"
    names: Dict[str, Any] = {**vars(typing), **vars(model_module)}
    for section in SECTIONS.values():
        names.update(vars(section))
    return {node.target.id: eval(ast.unparse(node.annotation), names)  # our own source, parsed above
            for node in found[0].body if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)}


def test_the_declaration_mypy_reads_is_the_assembled_model() -> None:
    """The TYPE_CHECKING declaration of Policy names the same fields, with the same types, as the model assembled
    from the table: a family missing from either fails here."""
    declared = declared_fields()
    assert list(declared) == [name for name in Policy.model_fields if name != "policy"]
    for name, annotation in declared.items():
        assert annotation == Policy.model_fields[name].annotation, name


def test_rule_count_is_the_sum_over_the_sections(tmp_path: Path) -> None:
    """rule_count adds each section module's count (two pairings, the kernel allow list, one version rule, one
    frozen package, three companion rules on, the containers rule, the workloads rule, the bake rule)."""
    assert every_section_loaded(tmp_path).policy.rule_count() == 2 + 1 + 1 + 1 + 3 + 1 + 1 + 1


def test_evaluate_runs_each_family_in_table_order(monkeypatch: pytest.MonkeyPatch) -> None:
    """evaluate calls every family's check once, in FAMILIES order, and returns their violations in that order."""
    called: List[str] = []
    for name in FAMILIES:
        def check(state: HostState, policy: CompiledPolicy, name: str = name) -> List[Violation]:
            called.append(name)
            return [Violation(rule=name, action="block", message=name)]

        monkeypatch.setattr(family(name), "check", check)
    violations = evaluate(HostState({}, {}), every_section())
    assert called == list(FAMILIES)
    assert [v.rule for v in violations] == list(FAMILIES)


def test_a_family_whose_section_is_absent_is_not_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without its section a family's check is not called and its facts are not asked for."""
    called: List[str] = []
    for name in FAMILIES:
        def check(state: HostState, policy: CompiledPolicy, name: str = name) -> List[Violation]:
            called.append(name)
            return []

        monkeypatch.setattr(family(name), "check", check)
    data = every_section().data
    policy = CompiledPolicy({k: v for k, v in data.items()
                             if k not in ("nvidia", "matrix", "companions", "containers", "workloads")})
    evaluate(HostState({}, {}), policy)
    assert called == [n for n in FAMILIES
                      if n not in ("nvidia", "matrix", "companions", "containers", "workloads")]
    assert facts_used(policy) == ()


def test_the_hook_imports_only_the_families_its_policy_uses() -> None:
    """On a bare interpreter, evaluating a policy with [frozen] only imports the frozen family and no other."""
    code = ("import sys; sys.path.insert(0, sys.argv[1])\n"
            "from agent.policy.compiled import CompiledPolicy\n"
            "from agent.policy.evaluate import HostState, evaluate\n"
            "policy = CompiledPolicy({'name': 'f', 'kernel_packages': [], 'frozen': {'packages': ['a*']}})\n"
            "print(len(evaluate(HostState({'ab': '1'}, {'ab': '2'}), policy)))\n"
            "print(' '.join(sorted(m for m in sys.modules if m.startswith('agent.policy.families.'))))")
    result = subprocess.run([sys.executable, "-I", "-S", "-c", code, str(REPO)], capture_output=True, text=True,
                            timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split("\n")[:2] == ["1", "agent.policy.families.frozen"]


def test_the_evaluator_module_holds_no_family() -> None:
    """agent/policy/evaluate.py defines no check of its own: the families' checks live in their modules."""
    assert not [name for name in vars(evaluate_module) if name.startswith("_check")]
