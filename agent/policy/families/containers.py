"""``[containers]``: a driver change must leave every running container's GPU user space usable.

Containers bring their own CUDA or ROCm user space and depend on the host's driver. The host fact
``containers`` (agent/hostfacts/containers.py) gives each running container's image facts; this family judges the
driver the transaction leaves against them:

- NVIDIA: the CUDA release the resulting driver supports (its branch, NVIDIA's minimum-driver table below; a host
  ``cuda-compat-X-Y`` package, forward compatibility on data-center GPUs, raises it to X.Y) must be at least what
  each container's ``NVIDIA_REQUIRE_CUDA`` (else its ``CUDA_VERSION``) asks for: the NVIDIA container toolkit
  refuses to start such a container, and a running one loses its GPUs at the next start.
- AMD: the ROCm release of each container's image must be one AMD's matrix supports on the resulting amdgpu driver
  (the compiled ``matrix`` section's driver -> ROCm rows; without ``require_amd_matrix`` nothing is judged).

Only a change of the driver is judged (moved, installed or removed): a container that already cannot run is the
snapshot's finding, not a reason to refuse an unrelated transaction.
"""

from __future__ import annotations

from agent.defaults import AMD_DRIVER_PACKAGE
from agent.policy import releases
from agent.policy.compiled import DEFAULT_NVIDIA_DRIVER_PACKAGES, NVIDIA_NOT_DRIVER_PARTS
from agent.policy.families import OVERRIDE_HINT, TYPE_CHECKING, HostState, Violation, matching, move

if TYPE_CHECKING:  # typing costs milliseconds of the apt hook's start-up budget
    from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

    from agent.hostfacts.containers import ContainerStack
    from agent.hostfacts.context import HostContext
    from agent.policy.compiled import CompiledPolicy
    from agent.policy.families import CompileSource, FreezeHost

FREEZE_PLACE = 80

# The newest CUDA release each NVIDIA driver branch supports (NVIDIA's CUDA toolkit release notes, "CUDA Toolkit and
# Minimum Required Driver Version", Table 3; 525-555 in ../shared/reference/rocm-compat-facts.md, the later rows as
# `nvidia-smi` reports "CUDA Version" for each branch). A branch newer than the table supports at least its last
# row (backward compatibility): judged by that row, and said so in `policy explain`.
DRIVER_CUDA: Tuple[Tuple[int, str], ...] = (
    (450, "11.0"), (455, "11.1"), (460, "11.2"), (465, "11.3"), (470, "11.4"), (495, "11.5"), (510, "11.6"),
    (515, "11.7"), (520, "11.8"), (525, "12.0"), (530, "12.1"), (535, "12.2"), (545, "12.3"), (550, "12.4"),
    (555, "12.5"), (560, "12.6"), (565, "12.7"), (570, "12.8"), (575, "12.9"), (580, "13.0"), (590, "13.1"),
)
_HINT = "stop or move those containers first (or use an image for the new driver), " + OVERRIDE_HINT


def facts(policy: CompiledPolicy) -> Tuple[str, ...]:
    """The running containers' GPU user space."""
    if not policy.section("containers"):
        return ()
    from agent.hostfacts.context import CONTAINERS

    return (CONTAINERS,)


def _key(release: str) -> Tuple[int, ...]:
    return tuple(int(p) for p in release.split(".") if p.isdecimal())


def cuda_supported(driver: Optional[str]) -> Optional[str]:
    """The newest CUDA release an NVIDIA driver release supports; None below the table or unreadable."""
    branch = releases.dotted_release(driver, 1) if driver else None
    if branch is None or not branch.isdecimal():
        return None
    found = None
    for first, cuda in DRIVER_CUDA:
        if int(branch) >= first:
            found = cuda
    return found


def nvidia_driver(installed: Mapping[str, str], patterns: Sequence[str]) -> Optional[str]:
    """The newest NVIDIA driver release among the installed driver parts; None without any."""
    from agent.hostfacts.package_keys import package_name

    found = [releases.dotted_release(installed[k]) for k in matching(installed, patterns)
             if package_name(k) not in NVIDIA_NOT_DRIVER_PARTS]
    known = [r for r in found if r]
    return max(known, key=_key) if known else None


def _compat(installed: Mapping[str, str]) -> Optional[str]:
    """The newest CUDA release a host forward-compatibility package (``cuda-compat-13-1``) provides."""
    from agent.hostfacts.package_keys import package_name

    best = None
    for key in matching(installed, ("cuda-compat-*",)):
        parts = package_name(key).split("-")
        if len(parts) == 4 and parts[2].isdecimal() and parts[3].isdecimal():
            release = f"{parts[2]}.{parts[3]}"
            if best is None or _key(release) > _key(best):
                best = release
    return best


def driver_globs(policy: CompiledPolicy) -> List[str]:
    """The [nvidia] section's driver globs, else the defaults: the family judges without an [nvidia] section too."""
    return policy.nvidia_packages[0] or list(DEFAULT_NVIDIA_DRIVER_PACKAGES)


def needs_cuda(stack: ContainerStack) -> Optional[str]:
    """The CUDA release a container needs of the driver: NVIDIA_REQUIRE_CUDA's, else its CUDA_VERSION."""
    return stack.require_cuda or stack.cuda_version


def _named(stacks: Sequence[ContainerStack], what: Dict[str, str]) -> str:
    shown = [f"{s.describe()} needs {what[s.container_id]}" for s in stacks[:3]]
    more = f" and {len(stacks) - 3} more" if len(stacks) > 3 else ""
    return "; ".join(shown) + more


def _nvidia(state: HostState, policy: CompiledPolicy, stacks: Sequence[ContainerStack], action: str) -> List[Violation]:
    globs = driver_globs(policy)
    before, after = nvidia_driver(state.before, globs), nvidia_driver(state.after, globs)
    users = [s for s in stacks if needs_cuda(s)]
    if before == after or not users:
        return []
    packages = {k: move(state, k) for k in matching({**state.before, **state.after}, globs)
                if state.before.get(k) != state.after.get(k)}
    supported = cuda_supported(after)
    compat = _compat(state.after)
    if compat is not None and (supported is None or _key(compat) > _key(supported)):
        supported = compat
    if after is None:
        blocked = users
        why = "the transaction removes the NVIDIA driver"
    else:
        blocked = [s for s in users if supported is None or _key(needs_cuda(s) or "0") > _key(supported)]
        why = (f"NVIDIA driver {after} supports CUDA {supported or 'of no release gpuguard knows'}"
               + (f" (with cuda-compat {compat})" if compat else ""))
    if not blocked:
        return []
    need = {s.container_id: f"CUDA {needs_cuda(s)}" for s in blocked}
    return [Violation(rule="containers.cuda", action=action, packages=packages, hint=_HINT,
                      message=f"{why}, which running containers cannot use: {_named(blocked, need)}")]


def _amd(state: HostState, policy: CompiledPolicy, stacks: Sequence[ContainerStack], action: str) -> List[Violation]:
    matrix = policy.section("matrix")
    users = [s for s in stacks if s.rocm_release]
    driver_name = str((policy.section("amd") or {}).get("driver_package") or AMD_DRIVER_PACKAGE)
    before, after = state.before.get(driver_name), state.after.get(driver_name)
    if not matrix or not users or before == after:
        return []
    packages = {driver_name: move(state, driver_name)}
    if after is None:
        blocked = users
        why = f"the transaction removes {driver_name}"
    else:
        driver_series = releases.series(releases.amdgpu_driver_release(after))
        supported = (matrix.get("driver_rocm") or {}).get(driver_series or "")
        if supported is None:
            return []  # the matrix family says the driver is unknown to the matrix
        blocked = [s for s in users if releases.series(s.rocm_release) not in supported]
        why = (f"amdgpu driver {driver_series}.x supports ROCm {', '.join(r + '.x' for r in supported)} by AMD's "
               f"matrix")
    if not blocked:
        return []
    need = {s.container_id: f"ROCm {s.rocm_release}" for s in blocked}
    return [Violation(rule="containers.rocm", action=action, packages=packages, hint=_HINT,
                      message=f"{why}, which running containers cannot use: {_named(blocked, need)}")]


def check(state: HostState, policy: CompiledPolicy) -> List[Violation]:
    """The resulting driver against every running container that brings CUDA or ROCm user space."""
    section = policy.section("containers")
    if not section or state.context is None or not state.context.containers:
        return []
    action = policy.action_for(section.get("action"))
    stacks = state.context.containers
    return _nvidia(state, policy, stacks, action) + _amd(state, policy, stacks, action)


def explain(policy: CompiledPolicy, installed: Mapping[str, str], manager: str, context: HostContext) -> List[str]:
    """The running containers with GPU user space, and what the installed driver gives them."""
    section = policy.section("containers")
    if not section:
        return []
    action = policy.action_for(section.get("action"))
    stacks = context.containers
    if not stacks:
        return [f"containers: no running container brings CUDA or ROCm user space [{action}]"]
    driver = nvidia_driver(installed, driver_globs(policy))
    supported = cuda_supported(driver)
    beyond = driver is not None and supported == DRIVER_CUDA[-1][1] and _key(driver)[:1] > (DRIVER_CUDA[-1][0],)
    lines = [f"containers: {len(stacks)} running with GPU user space; a driver change must keep them usable "
             f"[{action}]"]
    for stack in stacks:
        what = ", ".join(v for v in (f"CUDA {needs_cuda(stack)}" if needs_cuda(stack) else "",
                                     f"ROCm {stack.rocm_release}" if stack.rocm_release else "") if v)
        lines.append(f"  {stack.describe()}: {what}")
    if driver is not None:
        note = " (newer than gpuguard's table: judged by its last row)" if beyond else ""
        lines.append(f"  NVIDIA driver {driver} supports CUDA {supported or '?'}{note}")
    if any(s.rocm_release for s in stacks) and not policy.section("matrix"):
        lines.append("  ROCm images are not judged: the policy has no require_amd_matrix")
    return lines


def compiled(source: CompileSource) -> Dict[str, Any]:
    """``containers``: the section as validated; no key at all without one."""
    section = source.section("containers")
    return {"containers": section} if section is not None else {}


def guarded(source: CompileSource) -> List[str]:
    """None of its own: it judges the driver packages the amd and nvidia families guard."""
    return []


def shape(data: Mapping[str, Any]) -> None:
    from agent.policy.compiled import action, table

    section = table(data["containers"], "containers", ("action",))
    action(section["action"], "containers -> action")


def freeze(host: FreezeHost) -> List[str]:
    """``[containers]`` on wherever the host runs a GPU driver: running images keep their GPU user space."""
    if not (host.amd or host.nvidia):
        return []
    running = len(host.context.containers)
    return ["", "[containers]  # a driver change must leave running containers' CUDA/ROCm user space usable",
            f"# {running} running container(s) with GPU user space now"]
