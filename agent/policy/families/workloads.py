"""``[workloads]``: a driver/ROCm/CUDA change only to a stack on which the team's workloads have passed somewhere in
the fleet: the fallback path for models not verified on a stack (issue 44).

The hub keeps, per registered workload, the stacks on which a health check of it passed (docs/hub.md, "Verified
stacks"); the host caches that list (host fact ``verified_stacks``, agent/hostfacts/verified_stacks.py). A
transaction that moves the NVIDIA driver, the amdgpu driver or the ROCm release is judged by the stack it leaves:

- NVIDIA: the driver release (``nvidia 580.159.04``; the CUDA release the driver serves follows from it);
- AMD: the amdgpu DKMS kernel base (``amdgpu 6.10.5``, what the loaded module reports) and the ROCm release of the
  policy's ROCm package (``ROCm 6.3.1``).

Each workload named in ``verified`` must have a verified stack that matches every part the transaction leaves
(a part the host does not have is not compared); else the change is refused naming the workloads and the stack. No
cached list, or one that cannot be read, refuses every such change (fail closed), saying why. A transaction that
leaves none of those parts (it removes the driver) or leaves them as they were is not judged here.
"""

from __future__ import annotations

from agent.defaults import AMD_DRIVER_PACKAGE, ROCM_CORE_PACKAGE
from agent.policy import releases
from agent.policy.families import OVERRIDE_HINT, TYPE_CHECKING, HostState, Violation, matching, move
from agent.policy.families.containers import driver_globs, nvidia_driver

if TYPE_CHECKING:  # typing costs milliseconds of the apt hook's start-up budget
    from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

    from agent.hostfacts.context import HostContext
    from agent.hostfacts.verified_stacks import VerifiedStack
    from agent.policy.compiled import CompiledPolicy
    from agent.policy.families import CompileSource, FreezeHost

FREEZE_PLACE = 90
_HINT = ("run the workloads on this stack on a canary host first (its health check reports them to the hub; the "
         "daemon's next policy fetch brings the hub's list), " + OVERRIDE_HINT)

def facts(policy: CompiledPolicy) -> Tuple[str, ...]:
    """The hub's verified stacks, cached on the host."""
    if not policy.section("workloads"):
        return ()
    from agent.hostfacts.context import VERIFIED_STACKS

    return (VERIFIED_STACKS,)


def _amd_names(policy: CompiledPolicy) -> Tuple[str, str]:
    """The [amd] section's driver and ROCm package names, else the defaults: judged without an [amd] section too."""
    amd = policy.section("amd") or {}
    return (str(amd.get("driver_package") or AMD_DRIVER_PACKAGE), str(amd.get("rocm_package") or ROCM_CORE_PACKAGE))


def stack_of(installed: Mapping[str, str], policy: CompiledPolicy) -> Tuple[Optional[str], Optional[str],
                                                                               Optional[str]]:
    """The NVIDIA driver release, the amdgpu kernel base and the ROCm release an installed set has."""
    driver_name, rocm_name = _amd_names(policy)
    amdgpu = [releases.amdgpu_kernel_base(installed[k]) for k in matching(installed, [driver_name])]
    rocm = [releases.rocm_release(installed[k]) for k in matching(installed, [rocm_name])]
    return (nvidia_driver(installed, driver_globs(policy)), next((r for r in amdgpu if r), None),
            max((r for r in rocm if r), key=_key, default=None))


def _key(release: str) -> Tuple[int, ...]:
    return tuple(int(p) for p in release.split(".") if p.isdecimal())


def describe(stack: Tuple[Optional[str], Optional[str], Optional[str]]) -> str:
    nvidia, amdgpu, rocm = stack
    return ", ".join(v for v in (f"nvidia {nvidia}" if nvidia else "", f"amdgpu {amdgpu}" if amdgpu else "",
                                 f"ROCm {rocm}" if rocm else "") if v)


def _words(text: Optional[str]) -> Dict[str, str]:
    """``amdgpu 6.10.5 nvidia 580.159.04`` -> {"amdgpu": "6.10.5", "nvidia": "580.159.04"} (the health check's
    stack texts: a name, then its release)."""
    parts = (text or "").split()
    return {parts[i].lower(): parts[i + 1] for i in range(0, len(parts) - 1, 2)}


def matches(verified: VerifiedStack, stack: Tuple[Optional[str], Optional[str], Optional[str]]) -> bool:
    """Whether a verified stack has every part ``stack`` has, release for release."""
    nvidia, amdgpu, rocm = stack
    drivers, user_space = _words(verified.driver), _words(verified.gpu_stack)
    if nvidia is not None and releases.dotted_release(drivers.get("nvidia")) != nvidia:
        return False
    if amdgpu is not None and releases.dotted_release(drivers.get("amdgpu"), 3) != amdgpu:
        return False
    return rocm is None or releases.dotted_release(user_space.get("rocm"), 3) == rocm


def check(state: HostState, policy: CompiledPolicy) -> List[Violation]:
    """The stack the transaction leaves against each named workload's verified stacks."""
    section = policy.section("workloads")
    if not section:
        return []
    before, after = stack_of(state.before, policy), stack_of(state.after, policy)
    if before == after or after == (None, None, None):
        return []
    action = policy.action_for(section.get("action"))
    driver_name, rocm_name = _amd_names(policy)
    moved = {k: move(state, k) for k in matching({**state.before, **state.after},
                                                 [*driver_globs(policy), driver_name, rocm_name])
             if state.before.get(k) != state.after.get(k)}
    names: Sequence[str] = section["verified"]
    cached = state.context.verified_stacks if state.context is not None else None
    if cached is None or cached.problem is not None:
        why = cached.problem if cached is not None and cached.problem else "no verified list is cached on this host"
        return [Violation(rule="workloads.unverifiable", action=action, packages=moved, hint=_HINT,
                          message=f"the change to {describe(after)} cannot be checked against the workloads "
                                  f"{', '.join(names)}: {why}")]
    missing = [n for n in names if not any(matches(v, after) for v in cached.stacks_of(n))]
    if not missing:
        return []
    return [Violation(rule="workloads.unverified", action=action, packages=moved, hint=_HINT,
                      message=f"workload{'s' if len(missing) > 1 else ''} {', '.join(missing)} never passed on "
                              f"{describe(after)} anywhere in the fleet (the hub's verified list of "
                              f"{cached.fetched_at or 'unknown time'})")]


def explain(policy: CompiledPolicy, installed: Mapping[str, str], manager: str, context: HostContext) -> List[str]:
    """The named workloads, and whether the installed stack is verified for each."""
    section = policy.section("workloads")
    if not section:
        return []
    action = policy.action_for(section.get("action"))
    lines = [f"workloads: a driver/ROCm/CUDA change only to a stack where {', '.join(section['verified'])} "
             f"passed somewhere in the fleet [{action}]"]
    cached = context.verified_stacks
    if cached is None or cached.problem is not None:
        lines.append(f"  verified list: {cached.problem if cached is not None else 'none cached'} "
                     "(every such change is refused)")
        return lines
    stack = stack_of(installed, policy)
    for name in section["verified"]:
        known = cached.stacks_of(name)
        here = any(matches(v, stack) for v in known)
        lines.append(f"  {name}: {len(known)} verified stack(s); the installed {describe(stack) or 'stack'} "
                     f"{'is' if here else 'is not'} one of them")
    return lines


def compiled(source: CompileSource) -> Dict[str, Any]:
    """``workloads``: the section as validated; no key at all without one."""
    section = source.section("workloads")
    return {"workloads": section} if section is not None else {}


def guarded(source: CompileSource) -> List[str]:
    """None of its own: it judges the driver and ROCm packages the amd and nvidia families guard."""
    return []


def shape(data: Mapping[str, Any]) -> None:
    from agent.policy.compiled import action, expect, str_list, table
    from agent.wire import workload_name_ok

    section = table(data["workloads"], "workloads", ("verified", "action"))
    action(section["action"], "workloads -> action")
    str_list(section["verified"], "workloads -> verified", non_empty=True)
    expect(all(workload_name_ok(n) for n in section["verified"]), "workloads -> verified", "not workload names")


def freeze(host: FreezeHost) -> List[str]:
    """Nothing: which workloads a fleet runs is not on the host to see."""
    return []
