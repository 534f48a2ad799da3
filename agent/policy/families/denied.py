"""``denied``: the known-bad versions of the signed deny list in force (agent/bundle/deny.py), never written in TOML.

The section is the deny list's entries (``id``, ``packages``, ``versions``, ``reason``, ``source_url``, ``added``,
``serial``), put into the compiled policy when a list is taken and whenever the policy is compiled. A package of
an entry at a version it denies is refused, whatever the policy's action (a known-bad version is never only a
warning); the refusal names the entry, its reason and its source.
"""

from __future__ import annotations

from agent.hostfacts.package_keys import package_name
from agent.policy.families import TYPE_CHECKING, HostState, Violation, matching, move, no_facts
from agent.policy.spec import describe, matches

if TYPE_CHECKING:  # typing costs milliseconds of the apt hook's start-up budget
    from typing import Any, Dict, List, Mapping, Optional

    from agent.hostfacts.context import HostContext
    from agent.policy.compiled import CompiledPolicy
    from agent.policy.families import CompileSource, FreezeHost


# Where its lines go in ``policy freeze`` output (agent/policy/evaluate.py, Family): it writes none.
FREEZE_PLACE = 100


facts = no_facts


def denial(entry: Mapping[str, Any]) -> str:
    """The words of one entry, as a refusal and a pin say them: id, serial, reason and source."""
    return (f"deny entry '{entry.get('id')}' (deny list serial {entry.get('serial')}, added {entry.get('added')}): "
            f"{entry.get('reason')} ({entry.get('source_url')})")


def denied_by(policy: CompiledPolicy, name: str, version: str, manager: str) -> Optional[Mapping[str, Any]]:
    """The first entry that denies ``name`` at ``version`` (None: none does)."""
    from agent.policy.globs import any_glob

    for entry in policy.rules("denied"):
        if any_glob(list(entry.get("packages") or []))(name) and matches(entry.get("versions", "none"), version,
                                                                         manager):
            return entry
    return None


def check(state: HostState, policy: CompiledPolicy) -> List[Violation]:
    """Every package of an entry, in the set after the change, at a version the entry denies."""
    out = []
    for entry in policy.rules("denied"):
        for key in matching(state.after, list(entry.get("packages") or [])):
            version = state.after[key]
            if not matches(entry.get("versions", "none"), version, state.manager):
                continue
            out.append(Violation(
                rule=f"denied.{entry.get('id')}", action="block",
                message=f"{package_name(key)} {version} is a known-bad version: {denial(entry)}",
                packages={key: move(state, key)},
                hint=f"install a version of {package_name(key)} outside {describe(entry.get('versions', 'none'))}"))
    return out


def explain(policy: CompiledPolicy, installed: Mapping[str, str], manager: str, context: HostContext) -> List[str]:
    """One line per entry."""
    return [f"denied '{entry.get('id')}': {', '.join(entry.get('packages') or [])} at "
            f"{describe(entry.get('versions', 'none'))} [block]: {entry.get('reason')} ({entry.get('source_url')})"
            for entry in policy.rules("denied")]


def compiled(source: CompileSource) -> Dict[str, Any]:
    """``denied``: empty from the TOML policy (the deny list in force fills it, agent/bundle/deny.py)."""
    return {"denied": []}


def guarded(source: CompileSource) -> List[str]:
    """None from the TOML policy."""
    return []


def shape(data: Mapping[str, Any]) -> None:
    from agent.policy.compiled import expect, spec, str_list, table

    expect(isinstance(data["denied"], list), "denied", "not a list")
    for index, entry in enumerate(data["denied"], 1):
        where = f"denied -> {index}"
        e = table(entry, where, ("id", "packages", "versions", "reason", "source_url", "added", "serial"))
        for name in ("id", "reason", "source_url", "added"):
            expect(isinstance(e[name], str) and bool(e[name]), f"{where} -> {name}", "not a non-empty string")
        str_list(e["packages"], f"{where} -> packages", non_empty=True)
        spec(e["versions"], f"{where} -> versions", package_versions=True)
        expect(isinstance(e["serial"], int) and not isinstance(e["serial"], bool), f"{where} -> serial",
               "not a whole number")


def freeze(host: FreezeHost) -> List[str]:
    """None: a deny list is not frozen into a policy."""
    return []
