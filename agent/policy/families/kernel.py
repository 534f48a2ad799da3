"""``[kernel]``: the kernels a host may install (new kernels only: those installed stay allowed)."""

from __future__ import annotations

from agent.hostfacts.package_keys import package_name
from agent.policy.families import OVERRIDE_HINT, HostState, Violation, kernels, move
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
    section = policy.section("kernel")
    if not section or section.get("allow") is None:
        return []
    patterns = policy.kernel_packages
    before = kernels(state.before, patterns, state.manager)
    after = kernels(state.after, patterns, state.manager)
    out = []
    allowed = describe(section["allow"])
    for release, key in sorted(after.items()):
        if release in before or matches(section["allow"], release):
            continue
        out.append(Violation(
            rule="kernel.allow", action=policy.action_for(section.get("action")),
            message=f"kernel {release} ({package_name(key)} {state.after[key]}) is not on the allowed kernel list "
                    f"({allowed})",
            packages={key: move(state, key)},
            hint="hold the kernel (and its meta package) back, add the kernel to [kernel] allow once the GPU driver "
                 "builds for it, " + OVERRIDE_HINT))
    return out


def explain(policy: CompiledPolicy, installed: Mapping[str, str], manager: str, context: HostContext) -> List[str]:
    """The kernel allow list and its action."""
    kernel = policy.section("kernel")
    if not kernel or kernel.get("allow") is None:
        return []
    return [f"kernels: new kernels must match {describe(kernel['allow'])} [{policy.action_for(kernel.get('action'))}]"]
