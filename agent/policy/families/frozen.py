"""``[frozen]``: packages that must not move at all (install, upgrade, downgrade or removal)."""

from __future__ import annotations

from agent.hostfacts.package_keys import package_name
from agent.policy.families import OVERRIDE_HINT, TYPE_CHECKING, HostState, Violation, matching, no_facts

if TYPE_CHECKING:  # typing costs milliseconds of the apt hook's start-up budget
    from typing import Any, Dict, List, Mapping

    from agent.hostfacts.context import HostContext
    from agent.policy.compiled import CompiledPolicy
    from agent.policy.families import CompileSource, FreezeHost


# Where its lines go in ``policy freeze`` output (agent/policy/evaluate.py, Family).
FREEZE_PLACE = 60


facts = no_facts


def check(state: HostState, policy: CompiledPolicy) -> List[Violation]:
    section = policy.section("frozen")
    if not section or not section.get("packages"):
        return []
    patterns = list(section["packages"])
    out = []
    for key in sorted(set(matching(state.before, patterns)) | set(matching(state.after, patterns))):
        old, new = state.before.get(key), state.after.get(key)
        if old == new:
            continue
        out.append(Violation(
            rule="frozen", action=policy.action_for(section.get("action")),
            message=f"{package_name(key)} is frozen by policy '{policy.name}' and must not move "
                    f"({old or '(not installed)'} -> {new or '(removed)'})",
            packages={key: f"{old or '(not installed)'} -> {new or '(removed)'}"},
            hint=f"keep {package_name(key)} at {old or 'its current state'}, remove it from [frozen] packages, "
                 + OVERRIDE_HINT))
    return out


def explain(policy: CompiledPolicy, installed: Mapping[str, str], manager: str, context: HostContext) -> List[str]:
    """The frozen packages and their action."""
    frozen = policy.section("frozen")
    if not frozen or not frozen.get("packages"):
        return []
    return [f"frozen (must not move): {', '.join(frozen['packages'])} [{policy.action_for(frozen.get('action'))}]"]


def compiled(source: CompileSource) -> Dict[str, Any]:
    """``frozen``: the section as validated, or None."""
    return {"frozen": source.section("frozen")}


def guarded(source: CompileSource) -> List[str]:
    """The frozen packages."""
    section = source.section("frozen")
    return list(section["packages"]) if section else []


def shape(data: Mapping[str, Any]) -> None:
    from agent.policy.compiled import action, str_list, table

    frozen = table(data["frozen"], "frozen", ("packages", "action"))
    str_list(frozen["packages"], "frozen -> packages")
    action(frozen["action"], "frozen -> action")


def freeze(host: FreezeHost) -> List[str]:
    """Exact builds: every GPU package that the pairing does not pin at its exact build. With point releases
    none: AMD's and NVIDIA's packages depend on each other at exact versions and follow the pairing."""
    if host.point_releases:
        return []
    stack = host.stack
    found = {**stack.amd_other, **stack.nvidia_parts, **stack.cuda, **stack.gpu_other}
    frozen = [(n, f"installed {v}") for n, v in host.names(found)]
    if not frozen:
        return []
    return ["", "[frozen]  # must not move at all: no upgrade, downgrade, reinstall at another build or removal",
            *host.array("packages", frozen, "the rest of the GPU stack, at the builds installed now")]
