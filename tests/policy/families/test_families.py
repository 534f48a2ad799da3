"""The ordered table of rule families is what evaluate runs, in its documented order, and nothing beside it."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List

import pytest

from agent.policy import evaluate as evaluate_module
from agent.policy.compiled import CompiledPolicy
from agent.policy.evaluate import FAMILIES, HostState, Violation, evaluate, facts_used, family

REPO = Path(__file__).resolve().parents[3]
FAMILY_DIR = REPO / "agent" / "policy" / "families"


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


@pytest.mark.parametrize("name", FAMILIES)
def test_each_family_has_facts_check_and_explain(name: str) -> None:
    """Every family module offers the three functions of the Family protocol."""
    module = family(name)
    for function in ("facts", "check", "explain"):
        assert callable(getattr(module, function, None)), f"{name}.{function}"


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
    policy = CompiledPolicy({k: v for k, v in data.items() if k not in ("nvidia", "matrix", "companions")})
    evaluate(HostState({}, {}), policy)
    assert called == [n for n in FAMILIES if n not in ("nvidia", "matrix", "companions")]
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
