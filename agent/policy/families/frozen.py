"""``[frozen]``: packages that must not move at all (install, upgrade, downgrade or removal)."""

from __future__ import annotations

from agent.hostfacts.package_keys import package_name
from agent.policy.families import OVERRIDE_HINT, HostState, Violation, matching

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs milliseconds of the apt hook's start-up budget
    from typing import List, Mapping, Tuple

    from agent.hostfacts.context import HostContext
    from agent.policy.compiled import CompiledPolicy


def facts(policy: CompiledPolicy) -> Tuple[str, ...]:
    """No host fact: the rule reads the installed sets only."""
    return ()


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
