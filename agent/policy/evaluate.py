"""Evaluate a package state change against a compiled policy: pure, standard library only.

Input: the installed set before and after a change (a transaction, or what dpkg did behind apt's back), plus the
host's context (agent/hostfacts/context.py: OS, GPU targets, loaded GPU modules), of which each caller reads the
facts :func:`facts_used` names. Output: every violation with its rule, the packages involved, a message that names the
pinned pairing being broken, the action the policy attaches to it and a hint on how to proceed. The apt hook,
the dnf plugin, ``gpuguard policy explain`` and the rollback watcher all call :func:`evaluate`.

The rules come in families, one module each under agent/policy/families/ (its check, the host facts it reads, its
explain lines), run in the order of :data:`FAMILIES`. A family whose section the compiled policy lacks is neither
imported nor run: the apt hook loads only the families its policy uses.
"""

from __future__ import annotations

from agent.policy.families import OVERRIDE_HINT, HostState, Violation, forget_indexes, indexing

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs milliseconds of the apt hook's start-up budget
    from typing import List, Sequence, Tuple

    from agent.policy.compiled import CompiledPolicy
    from agent.policy.families import Family

__all__ = ["FAMILIES", "OVERRIDE_HINT", "HostState", "Violation", "evaluate", "facts_used", "family", "introduced",
           "used_families"]

# The rule families in the order they are judged (and a violation is reported): each name is a module of
# agent/policy/families/ and the compiled policy's section key it judges.
FAMILIES: Tuple[str, ...] = ("frozen", "amd", "kernel", "nvidia", "versions", "matrix", "companions")


def family(name: str) -> Family:
    """The module of one family of :data:`FAMILIES` (imported on first use)."""
    module: Family = __import__("agent.policy.families." + name, None, None, ("check",))
    return module


def used_families(policy: CompiledPolicy) -> List[Family]:
    """The families whose section the policy has, in table order."""
    data = policy.data
    return [family(name) for name in FAMILIES if data.get(name)]


def facts_used(policy: CompiledPolicy) -> Tuple[str, ...]:
    """The host facts :func:`evaluate` reads under ``policy`` (names from agent.hostfacts.context, in the order of
    its EVERY_FACT): what the families it uses read; none when they read none (then the context module is not even
    imported: the apt hook's common case)."""
    wanted = {fact for module in used_families(policy) for fact in module.facts(policy)}
    if not wanted:
        return ()
    from agent.hostfacts.context import EVERY_FACT

    return tuple(fact for fact in EVERY_FACT if fact in wanted)


def evaluate(state: HostState, policy: CompiledPolicy) -> List[Violation]:
    """Every violation of ``policy`` in the state after the change (old ones included; see ``touches``)."""
    indexing(state)
    try:
        out: List[Violation] = []
        for module in used_families(policy):
            out += module.check(state, policy)
        return out
    finally:
        forget_indexes()


def introduced(violations: Sequence[Violation], state: HostState) -> List[Violation]:
    """The violations this change is involved in (the others were there before it)."""
    bases = {k.split(":", 1)[0] for k in state.changed()}  # once, not once per violation
    return [v for v in violations if v.touches_names(bases)]
