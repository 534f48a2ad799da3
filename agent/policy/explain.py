"""``gpuguard policy explain``: what a host is pinned to and what it may do, as lines of text (pure).

The CLI (agent/commands/policy.py) reads the host (installed guarded packages, package manager, the host context of
agent/hostfacts/context.py, open override windows) into :class:`HostFacts`; :func:`explain` turns policy and facts
into lines, judging the host by the same context as the apt hook.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import List, Mapping, Optional, Protocol, Sequence

from agent.hostfacts.context import NO_FACTS, HostContext
from agent.hostfacts.package_keys import package_name
from agent.policy import releases
from agent.policy.compiled import CompiledPolicy, guarded_names
from agent.policy.evaluate import HostState, Violation, describe_pairing, evaluate, matching_pairing
from agent.policy.globs import any_glob
from agent.policy.spec import describe


class OverrideWindow(Protocol):
    """What ``explain`` shows of an open override window (the guard's OverrideWindow has these and more)."""

    @property
    def id(self) -> str: ...

    @property
    def expires_at(self) -> dt.datetime: ...

    @property
    def reason(self) -> str: ...

    @property
    def opened_by(self) -> str: ...


@dataclass(frozen=True)
class HostFacts:
    """What ``explain`` needs to know about the host."""

    installed: Mapping[str, str]  # guarded package key -> installed version
    manager: str  # "dpkg" or "rpm"
    context: HostContext = NO_FACTS  # OS, GPU targets, loaded GPU modules
    windows: Sequence[OverrideWindow] = ()
    windows_problem: Optional[str] = None  # why the override windows could not be read


@dataclass(frozen=True)
class Explanation:
    """The lines to print and the violations the host has now under the policy."""

    lines: List[str]
    violations: List[Violation]


def explain(policy: CompiledPolicy, facts: HostFacts) -> Explanation:
    """The pinned pairings, the moves the policy allows, the rules, and the host's current compliance."""
    installed = facts.installed
    lines = [f"policy '{policy.name}' ({', '.join(policy.sources) or policy.path}); default action {policy.action}, "
             f"fail-safe {policy.failsafe}", f"host: {facts.context.os_id or '?'} {facts.context.os_version_id or '?'}"]
    lines += _amd_lines(policy, installed, facts.manager)
    kernel = policy.section("kernel")
    if kernel and kernel.get("allow") is not None:
        lines.append(f"kernels: new kernels must match {describe(kernel['allow'])} "
                     f"[{policy.action_for(kernel.get('action'))}]")
    nvidia = policy.section("nvidia")
    module = facts.context.loaded("nvidia") if nvidia else None
    if module:
        packaged = guarded_names(list(installed), policy.nvidia_packages[0])
        lines.append(f"NVIDIA: loaded module {module}"
                     + (f"; driver packages: {', '.join(packaged)}" if packaged
                        else " (no driver package: the policy judges the running module)"))
    for pairing in (nvidia or {}).get("pairings") or []:
        lines.append(f"NVIDIA: may use driver {describe(pairing.get('driver', 'any'))} with CUDA "
                     f"{describe(pairing.get('cuda', 'any'))} ('{pairing.get('name')}')")
    if nvidia and nvidia.get("pairings"):
        lines.append("NVIDIA: every driver part must be one build; several CUDA releases side by side are "
                     + ("allowed" if nvidia.get("side_by_side") else "refused (side_by_side = false)"))
    for rule in policy.rules("versions"):
        lines.append(f"versions '{rule.get('name') or '-'}': {', '.join(rule.get('packages') or [])} must match "
                     f"{describe(rule.get('allow', 'any'))} [{policy.action_for(rule.get('action'))}]")
    frozen = policy.section("frozen")
    if frozen and frozen.get("packages"):
        lines.append(f"frozen (must not move): {', '.join(frozen['packages'])} "
                     f"[{policy.action_for(frozen.get('action'))}]")
    companions = policy.section("companions")
    if companions:
        from agent.policy.companions import DESCRIPTIONS, RULE_FIELDS

        for field in (f for f in RULE_FIELDS if companions.get(f)):
            lines.append(f"companion.{field}: {DESCRIPTIONS['companion.' + field]} "
                         f"[{policy.action_for(companions.get('action'))}]")
    matrix = policy.section("matrix")
    if matrix:
        lines.append(f"AMD compatibility matrix required (recorded {matrix.get('recorded')})")
    state = HostState.standing(installed, facts.manager, facts.context)
    violations = evaluate(state, policy)
    lines.append("current state: " + ("compliant" if not violations else f"{len(violations)} violation(s)"))
    lines += [f"  {v.rule} [{v.action}]: {v.message}" for v in violations]
    if facts.windows_problem:
        lines.append(f"override windows unreadable: {facts.windows_problem}")
    for window in facts.windows:
        lines.append(f"override window {window.id} open until {window.expires_at.isoformat(timespec='seconds')} "
                     f"({window.reason!r}, by {window.opened_by}): violating changes are let through")
    return Explanation(lines, violations)


def _amd_lines(policy: CompiledPolicy, installed: Mapping[str, str], manager: str) -> List[str]:
    amd = policy.section("amd")
    if not amd or not amd.get("pairings"):
        return []
    driver_name, rocm_name = policy.amd_packages
    driver = installed.get(driver_name)
    carries_rocm = any_glob(releases.rocm_package_patterns(rocm_name))
    rocms = {k: v for k, v in sorted(installed.items()) if carries_rocm(package_name(k))}  # classic and TheRock
    rocm_text = ", ".join(f"{package_name(k)} {v} (ROCm {releases.rocm_release(v) or '-'})" for k, v in rocms.items())
    lines = [f"AMD: {driver_name} {driver or '(not installed)'} (driver "
             f"{releases.amdgpu_driver_release(driver) or '-'}), {rocm_text or rocm_name + ' (not installed)'}"]
    versions: List[Optional[str]] = [*rocms.values()] or [None]
    pinned = next((p for p in amd["pairings"] if all(matching_pairing([p], driver, v, manager) is not None
                                                     for v in versions)), None)
    if pinned is not None:
        lines.append(f"  pinned pairing: {describe_pairing(pinned)}")
    elif driver is None and not rocms:
        lines.append("  pinned pairing: none (neither package is installed)")
    else:
        lines.append("  pinned pairing: none matches the installed pair (violation)")
    for pairing in amd["pairings"]:
        kernels = f"; kernels {describe(pairing['kernels'])}" if pairing.get("kernels") is not None else ""
        lines.append(f"  may move to {describe_pairing(pairing)}{kernels} "
                     f"[{policy.action_for(pairing.get('action'), amd.get('action'))}]")
    lines.append(f"  changing only one of {driver_name}/{rocm_name} must land in one of these pairings")
    return lines
