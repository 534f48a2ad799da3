"""Evaluate a package state change against a compiled policy: pure, standard library only.

Input: the installed set before and after a change (a transaction, or what dpkg did behind apt's back), plus the
host's context (agent/hostfacts/context.py: OS, GPU targets, loaded GPU modules), of which each caller reads the
facts :func:`facts_used` names. Output: every violation with its rule, the packages involved, a message that names the
pinned pairing being broken, the action the policy attaches to it and a hint on how to proceed. The apt hook,
the dnf plugin, ``gpuguard policy explain`` and the rollback watcher all call :func:`evaluate`.

The rules come in families, one module each under agent/policy/families/ (the protocol :class:`Family`), run in the
order of their table, :data:`FAMILIES` (agent/policy/families/__init__.py). A family whose section the compiled
policy lacks is neither imported nor run: the apt hook loads only the families its policy uses.
"""

from __future__ import annotations

from agent.policy.families import FAMILIES, OVERRIDE_HINT, HostState, Violation, forget_indexes, indexing

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs milliseconds of the apt hook's start-up budget
    from typing import Any, Dict, List, Mapping, Protocol, Sequence, Tuple

    from agent.hostfacts.context import HostContext
    from agent.policy.compiled import CompiledPolicy
    from agent.policy.families import CompileSource, FreezeHost

    class Family(Protocol):
        """One rule family's module (agent/policy/families/<name>.py): what it reads of the host, its check, its
        ``policy explain`` lines, its compiled form, the globs it guards, the shape check of its compiled part and
        its ``policy freeze`` lines. The module's name is the compiled policy's section key; a policy without that
        section neither imports nor runs it. Its pydantic model, if it has a TOML section, is
        agent/policy/sections/<name>.py (agent/policy/model.py)."""

        # Where its lines go in ``policy freeze`` output, lowest first: the file reads the pairings first, then the
        # kernels and the rest (the table's order is the order rules are judged in).
        FREEZE_PLACE: int

        def facts(self, policy: CompiledPolicy) -> Tuple[str, ...]:
            """The host facts (names from agent.hostfacts.context) the check reads under ``policy``."""

        def check(self, state: HostState, policy: CompiledPolicy) -> List[Violation]:
            """Every violation of this family's rules in the state after the change."""

        def explain(self, policy: CompiledPolicy, installed: Mapping[str, str], manager: str,
                    context: HostContext) -> List[str]:
            """The lines ``gpuguard policy explain`` prints for this family's rules on a host."""

        def compiled(self, source: CompileSource) -> Dict[str, Any]:
            """The compiled document's keys this family writes (its section: None or [] when absent)."""

        def guarded(self, source: CompileSource) -> List[str]:
            """The package globs the policy guards because of this family's section."""

        def shape(self, data: Mapping[str, Any]) -> None:
            """Check this family's part of a decoded compiled document (present: neither None nor []); raise
            agent.policy.compiled.ShapeProblem on the first thing wrong."""

        def freeze(self, host: FreezeHost) -> List[str]:
            """This family's lines of ``policy freeze`` output (none when the host has nothing it pins)."""

__all__ = ["FAMILIES", "OVERRIDE_HINT", "HostState", "Violation", "evaluate", "facts_used", "family", "introduced",
           "used_families"]

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
