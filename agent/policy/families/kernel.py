"""``[kernel]``: the kernels a host may install (new kernels only: those installed stay allowed)."""

from __future__ import annotations

from agent.hostfacts.package_keys import package_name
from agent.policy.families import OVERRIDE_HINT, TYPE_CHECKING, HostState, Violation, kernels, move, no_facts
from agent.policy.spec import describe, matches

if TYPE_CHECKING:  # typing costs milliseconds of the apt hook's start-up budget
    from typing import Any, Dict, List, Mapping

    from agent.hostfacts.context import HostContext
    from agent.policy.compiled import CompiledPolicy
    from agent.policy.families import CompileSource, FreezeHost


# Where its lines go in ``policy freeze`` output (agent/policy/evaluate.py, Family).
FREEZE_PLACE = 30


facts = no_facts


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


def packages(source: CompileSource) -> List[str]:
    """The kernel package globs: the [kernel] section's, or the defaults when the policy has none (the amd
    family guards them too)."""
    section = source.section("kernel")
    if section:
        return list(section["packages"])
    from agent.policy.compiled import DEFAULT_KERNEL_PACKAGES

    return list(DEFAULT_KERNEL_PACKAGES)


def compiled(source: CompileSource) -> Dict[str, Any]:
    """``kernel``, the section as validated or None, and ``kernel_packages``, the globs every kernel rule reads
    (the amd family's kernels too; a policy-wide field, checked with the others by agent/policy/compiled.py)."""
    return {"kernel": source.section("kernel"), "kernel_packages": packages(source)}


def guarded(source: CompileSource) -> List[str]:
    """The kernel packages, with a [kernel] section."""
    return packages(source) if source.section("kernel") is not None else []


def shape(data: Mapping[str, Any]) -> None:
    from agent.policy.compiled import action, spec, str_list, table

    kernel = table(data["kernel"], "kernel", ("packages", "allow", "action"))
    if kernel["packages"] is not None:
        str_list(kernel["packages"], "kernel -> packages")
    if kernel["allow"] is not None:
        spec(kernel["allow"], "kernel -> allow")
    action(kernel["action"], "kernel -> action")


def freeze(host: FreezeHost) -> List[str]:
    """``[kernel] allow``: the installed and running kernels (or their series)."""
    return ["", "[kernel]  # kernels: new ones must be on this list (those installed stay allowed)",
            *host.array("allow", host.kernels, "any other kernel is refused" if not host.kernel_series else
                        "kernels of these series only")]
