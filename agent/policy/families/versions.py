"""``[[versions]]``: allowed versions of some packages (container toolkits and the like)."""

from __future__ import annotations

from agent.hostfacts.package_keys import package_name
from agent.policy.families import OVERRIDE_HINT, TYPE_CHECKING, HostState, Violation, matching, move, no_facts
from agent.policy.spec import describe, matches

if TYPE_CHECKING:  # typing costs milliseconds of the apt hook's start-up budget
    from typing import Any, Dict, List, Mapping

    from agent.hostfacts.context import HostContext
    from agent.policy.compiled import CompiledPolicy
    from agent.policy.families import CompileSource, FreezeHost


# Where its lines go in ``policy freeze`` output (agent/policy/evaluate.py, Family).
FREEZE_PLACE = 40


facts = no_facts


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


def compiled(source: CompileSource) -> Dict[str, Any]:
    """``versions``: the rules as validated (a list, empty without any)."""
    return {"versions": source.section("versions")}


def guarded(source: CompileSource) -> List[str]:
    """Every rule's packages."""
    return [pattern for rule in source.section("versions") for pattern in rule["packages"]]


def shape(data: Mapping[str, Any]) -> None:
    from agent.policy.compiled import action, expect, optional_str, spec, str_list, table

    expect(isinstance(data["versions"], list), "versions", "not a list")
    for index, rule in enumerate(data["versions"], 1):
        where = f"versions -> {index}"
        r = table(rule, where, ("name", "packages", "allow", "action"))
        optional_str(r["name"], f"{where} -> name")
        str_list(r["packages"], f"{where} -> packages", non_empty=True)
        spec(r["allow"], f"{where} -> allow", package_versions=True)
        action(r["action"], f"{where} -> action")


def freeze(host: FreezeHost) -> List[str]:
    """With point releases, the GPU packages no pairing reads keep their own version series."""
    if not host.point_releases:
        return []
    from agent.policy import releases

    lines: List[str] = []
    for name, version in host.names(host.stack.gpu_other):
        dotted, full = releases.dotted_release(version, parts=2), releases.dotted_release(version) or ""
        if dotted and full.count(".") >= 2:
            allow = f"{dotted}.*"
        elif dotted and "." in dotted:  # 6.0+git20231212...: no third number for "6.0.*" to match
            major, minor = dotted.split(".")
            allow = f">= {dotted}, << {major}.{int(minor) + 1}"
        else:
            allow = version
        lines += ["", "[[versions]]  # a GPU package no pairing reads",
                  host.line("name", name, "named in refusals"),
                  host.line("packages", [name], f"installed {version}"),
                  host.line("allow", allow, "its point releases only" if allow != version else
                            "this exact version (it has no release series)")]
    return lines
