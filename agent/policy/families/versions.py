"""``[[versions]]``: allowed versions of some packages (container toolkits and the like)."""

from __future__ import annotations

from agent.hostfacts.package_keys import package_name
from agent.policy.families import OVERRIDE_HINT, HostState, Violation, matching, move
from agent.policy.spec import describe, matches

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs milliseconds of the apt hook's start-up budget
    from typing import List, Mapping, Tuple

    from agent.hostfacts.context import HostContext
    from agent.policy.compiled import CompiledPolicy


def facts(policy: CompiledPolicy) -> Tuple[str, ...]:
    """No host fact: the rule reads the installed sets only."""
    return ()


def check(state: HostState, policy: CompiledPolicy) -> List[Violation]:
    """Every package of a rule, in the set after the change, at a version the rule allows."""
    out = []
    for index, rule in enumerate(policy.rules("versions")):
        patterns = list(rule.get("packages") or [])
        label = rule.get("name") or f"versions[{index}]"
        for key in matching(state.after, patterns):
            version = state.after[key]
            if matches(rule.get("allow", "any"), version, state.manager):
                continue
            out.append(Violation(
                rule=f"versions.{label}", action=policy.action_for(rule.get("action")),
                message=f"{package_name(key)} {version} is outside the allowed versions of rule '{label}' "
                        f"({describe(rule.get('allow', 'any'))})",
                packages={key: move(state, key)},
                hint=f"install a version of {package_name(key)} matching {describe(rule.get('allow', 'any'))}, "
                     + OVERRIDE_HINT))
    return out


def explain(policy: CompiledPolicy, installed: Mapping[str, str], manager: str, context: HostContext) -> List[str]:
    """One line per version rule."""
    return [f"versions '{rule.get('name') or '-'}': {', '.join(rule.get('packages') or [])} must match "
            f"{describe(rule.get('allow', 'any'))} [{policy.action_for(rule.get('action'))}]"
            for rule in policy.rules("versions")]
