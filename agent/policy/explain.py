"""``gpuguard policy explain``: what a host is pinned to and what it may do, as lines of text (pure).

The CLI (agent/commands/policy.py) reads the host (installed guarded packages, package manager, the host context of
agent/hostfacts/context.py, open override windows) into :class:`HostFacts`; :func:`explain` turns policy and facts
into lines (each rule family's own, agent/policy/families/), judging the host by the same context as the apt hook.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import List, Mapping, Optional, Protocol, Sequence

from agent.hostfacts.context import NO_FACTS, HostContext
from agent.policy.compiled import CompiledPolicy
from agent.policy.evaluate import HostState, Violation, evaluate, used_families


class ShownWindow(Protocol):
    """What ``explain`` shows of an open override window (the guard's OverrideWindow has these and more)."""

    @property
    def id(self) -> str: ...

    @property
    def expires_at(self) -> dt.datetime: ...

    @property
    def reason(self) -> str: ...

    @property
    def opened_by(self) -> str: ...


_MOVES_SHOWN = 10  # moves since the known-good set named in full; the rest are counted


@dataclass(frozen=True)
class HostFacts:
    """What ``explain`` needs to know about the host."""

    installed: Mapping[str, str]  # guarded package key -> installed version
    manager: str  # "dpkg" or "rpm"
    context: HostContext = NO_FACTS  # OS, GPU targets, loaded GPU modules
    windows: Sequence[ShownWindow] = ()
    windows_problem: Optional[str] = None  # why the override windows could not be read
    # The guard's last known-good set (key -> version), None when none was recorded: a bypass since then (dpkg -i,
    # dpkg -r --force-depends) is judged as the change from it, as ``guard rollback`` judges it; what the rollback
    # would undo (action rollback) is a current violation.
    known_good: Optional[Mapping[str, str]] = None
    known_good_problem: Optional[str] = None  # why the known-good set could not be read


@dataclass(frozen=True)
class Explanation:
    """The lines to print and the violations the host has now under the policy."""

    lines: List[str]
    violations: List[Violation]


def tables_line(policy: CompiledPolicy) -> str:
    """The compatibility tables gpuguard judges this policy with, each with its date and origin: the dcgm-exporter
    table when the companions rule reads it and the TheRock release table (each the package's or a signed bundle's,
    with its version, date, origin and newest row: a newer release is reported as unknown to it), and AMD's matrix
    when the policy compiles it in."""
    from agent.policy import companions, table_unknown

    parts = []
    compiled_table = (policy.section("knowledge") or {}).get(companions.EXPORTER_TABLE_NAME)
    if compiled_table is not None:
        parts.append(companions.exporter_table(compiled_table).named())
    therock = table_unknown.compiled_therock_table(policy.section("knowledge"))
    if therock is not None:
        parts.append(therock.named())
    matrix = policy.section("matrix")
    if matrix:
        parts.append(f"AMD compatibility matrix recorded {matrix.get('recorded')}")
    return "gpuguard's compatibility tables: " + ("; ".join(parts) or "none (no rule of this policy reads one)")


def explain(policy: CompiledPolicy, facts: HostFacts) -> Explanation:
    """The pinned pairings, the moves the policy allows, the rules, and the host's current compliance."""
    installed = facts.installed
    lines = [f"policy '{policy.name}' ({', '.join(policy.sources) or policy.path}); default action {policy.action}, "
             f"fail-safe {policy.failsafe}", f"host: {facts.context.os_id or '?'} {facts.context.os_version_id or '?'}",
             tables_line(policy)]
    for module in used_families(policy):  # each family's own lines, in table order
        lines += module.explain(policy, installed, facts.manager, facts.context)
    state = HostState.standing(installed, facts.manager, facts.context)
    violations = evaluate(state, policy)
    if facts.known_good_problem:
        lines.append(f"known-good set unreadable: {facts.known_good_problem}")
    if facts.known_good is not None:
        since = HostState(dict(facts.known_good), dict(installed), facts.manager, facts.context)
        changed = since.changed()
        if changed:
            moves = [f"{k} {facts.known_good.get(k) or '(not installed)'} -> {installed.get(k) or '(removed)'}"
                     for k in sorted(changed)]
            shown = ", ".join(moves[:_MOVES_SHOWN]) + (f" and {len(moves) - _MOVES_SHOWN} more"
                                                       if len(moves) > _MOVES_SHOWN else "")
            lines.append(f"since the known-good set: {shown}")
            moved = [v for v in evaluate(since, policy) if v.touches(changed)]
            # what guard rollback would undo is a violation now; what it only reports is said, not counted (a host
            # changed behind the guard and then frozen stays compliant under a blocking policy)
            undone = [v for v in moved if v.action == "rollback"]
            lines += [f"  reported by the guard, not undone: {v.rule} [{v.action}]: {v.message}"
                      for v in moved if v.action != "rollback"]
            rules = {v.rule for v in undone}
            violations = undone + [v for v in violations if v.rule not in rules]
    lines.append("current state: " + ("compliant" if not violations else f"{len(violations)} violation(s)"))
    lines += [f"  {v.rule} [{v.action}]: {v.message}" for v in violations]
    if facts.windows_problem:
        lines.append(f"override windows unreadable: {facts.windows_problem}")
    for window in facts.windows:
        lines.append(f"override window {window.id} open until {window.expires_at.isoformat(timespec='seconds')} "
                     f"({window.reason!r}, by {window.opened_by}): violating changes are let through")
    return Explanation(lines, violations)

