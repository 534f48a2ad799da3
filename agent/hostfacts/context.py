"""The host context: what every judgement of a host knows about it besides its packages, read once off a root.

The apt hook and the dnf checkers, ``gpuguard policy explain`` and ``policy freeze``, the daemon's compliance check
and the rollback check all judge a host by one :class:`HostContext`, read by :func:`read_host_context` through the
parsers beside this module: os-release's ID and VERSION_ID, the GPUs' gfx targets from the KFD topology, the
versions of the loaded GPU kernel modules and the amdsmi binding pip installed. A caller names the facts it needs
(the evaluator says which a policy reads: ``agent.policy.evaluate.facts_used``) and only those are read, their
parsers imported only then: the apt hook pays nothing for them under a policy without AMD-matrix, NVIDIA or
companion rules.

The package manager is not part of it: it is the version scheme of the installed sets, which each caller reads
with them (the apt hook is dpkg's, the dnf checker rpm's, the snapshot and the rollback backend say which).

Standard library only: the apt hook imports it.
"""

from __future__ import annotations

from agent.records import Record

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs milliseconds of the apt hook's start-up budget
    from typing import Dict, Iterable, Mapping, Optional, Sequence, Tuple

    from agent.hostfacts.alternatives import ActiveTree
    from agent.hostfacts.containers import ContainerStack
    from agent.hostfacts.verified_stacks import VerifiedStacks

# The facts a caller can ask for.
OS_RELEASE = "os_release"  # ID and VERSION_ID of /etc/os-release (else /usr/lib/os-release)
GPU_TARGETS = "gpu_targets"  # the distinct gfx targets of the KFD topology's GPU nodes
NVIDIA_MODULE = "nvidia_module"  # the loaded nvidia module's version (a driver no package carries is judged by it)
AMDGPU_MODULE = "amdgpu_module"  # /sys/module/amdgpu/version: a DKMS build's kernel base (the inbox driver has none)
AMDSMI_BINDING = "amdsmi_binding"  # the amdsmi Python binding pip installed in a system site directory
CONTAINERS = "containers"  # the GPU user space of the running containers (agent/hostfacts/containers.py)
# The hub's verified stacks per registered workload, cached in the state directory (agent/hostfacts/verified_stacks.py)
VERIFIED_STACKS = "verified_stacks"
ACTIVE_TREE = "active_tree"  # the ROCm tree update-alternatives points at (agent/hostfacts/alternatives.py)
EVERY_FACT: Tuple[str, ...] = (OS_RELEASE, GPU_TARGETS, NVIDIA_MODULE, AMDGPU_MODULE, AMDSMI_BINDING, CONTAINERS,
                               VERIFIED_STACKS, ACTIVE_TREE)


class HostContext(Record):
    """The OS (os-release ID and VERSION_ID, None when unknown or not read), the GPU targets (``("gfx950",)``,
    sorted) and the loaded GPU kernel modules with their versions (``(("nvidia", "580.159.04"),)``, sorted by
    module; :meth:`loaded` reads one), the amdsmi binding pip installed (``("7.0.2",
    "/usr/local/lib/python3.12/dist-packages")``, None when none was found or it was not read), the running
    containers' GPU user space (``ContainerStack`` records, sorted by id; empty when none or not read), the hub's
    verified stacks cached on the host (None when not read or not cached; a list with its ``problem`` when
    damaged) and the ROCm tree update-alternatives points at (``ActiveTree``; None when none or not read).

    A Record, not a dataclass: the apt hook builds one.
    """

    __slots__ = ("os_id", "os_version_id", "gpu_targets", "loaded_drivers", "amdsmi_binding", "containers",
                 "verified_stacks", "active_tree")
    os_id: Optional[str]
    os_version_id: Optional[str]
    gpu_targets: Tuple[str, ...]
    loaded_drivers: Tuple[Tuple[str, str], ...]
    amdsmi_binding: Optional[Tuple[str, str]]
    containers: Tuple[ContainerStack, ...]
    verified_stacks: Optional[VerifiedStacks]
    active_tree: Optional[ActiveTree]

    def __init__(self, os_id: Optional[str] = None, os_version_id: Optional[str] = None,
                 gpu_targets: Sequence[str] = (), loaded_drivers: Optional[Mapping[str, str]] = None,
                 amdsmi_binding: Optional[Tuple[str, str]] = None,
                 containers: Sequence[ContainerStack] = (), verified_stacks: Optional[VerifiedStacks] = None,
                 active_tree: Optional[ActiveTree] = None) -> None:
        Record.__init__(self, os_id, os_version_id, tuple(sorted(set(gpu_targets))),
                        tuple(sorted((loaded_drivers or {}).items())), amdsmi_binding, tuple(containers),
                        verified_stacks, active_tree)

    def loaded(self, module: str) -> Optional[str]:
        """The version of the loaded kernel module ``module`` (``nvidia``, ``amdgpu``); None when not loaded or
        not read."""
        for name, version in self.loaded_drivers:
            if name == module:
                return version
        return None


NO_FACTS = HostContext()  # no fact read: what read_host_context gives for no facts asked, and the records' default


def read_host_context(root: str, facts: Iterable[str] = EVERY_FACT) -> HostContext:
    """The context of the host under ``root``, with only ``facts`` read (each one of EVERY_FACT); a fact that
    cannot be read (no os-release, no KFD topology, no module) is left unknown, never an error."""
    wanted = tuple(facts)
    if not wanted:
        return NO_FACTS
    unknown = [f for f in wanted if f not in EVERY_FACT]
    if unknown:
        raise ValueError(f"unknown host facts {unknown!r}; known: {', '.join(EVERY_FACT)}")
    os_id = os_version_id = None
    targets: Tuple[str, ...] = ()
    drivers: Dict[str, str] = {}
    if OS_RELEASE in wanted:
        from agent.hostfacts.os_release import read_os_release

        fields = read_os_release(root) or {}
        os_id, os_version_id = fields.get("ID"), fields.get("VERSION_ID")
    if GPU_TARGETS in wanted:
        from agent.hostfacts.kfd import gpu_targets  # imports os: only where the matrix is judged

        targets = gpu_targets(root)
    if NVIDIA_MODULE in wanted:
        from agent.hostfacts.loaded_modules import loaded_drivers

        drivers.update(loaded_drivers(root))
    if AMDGPU_MODULE in wanted:
        from agent.hostfacts.loaded_modules import module_version

        amdgpu = module_version(root, "amdgpu")
        if amdgpu:
            drivers["amdgpu"] = amdgpu
    binding = None
    if AMDSMI_BINDING in wanted:
        from agent.hostfacts.python_dists import find_distribution

        binding = find_distribution(root, "amdsmi")
    containers: Tuple[ContainerStack, ...] = ()
    if CONTAINERS in wanted:
        from agent.hostfacts.containers import running_containers

        containers = running_containers(root)
    verified = None
    if VERIFIED_STACKS in wanted:
        from agent.hostfacts.verified_stacks import read_verified_stacks
        from agent.statepaths import StatePaths

        verified = read_verified_stacks(root, StatePaths().workloads_verified)
    tree = None
    if ACTIVE_TREE in wanted:
        from agent.hostfacts.alternatives import read_active_tree

        tree = read_active_tree(root)
    return HostContext(os_id, os_version_id, targets, drivers, binding, containers, verified, tree)
