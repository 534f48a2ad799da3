"""The ROCm release of each tree from every source a host has: its version file and rocm-core's header (read by
the ROCm collector, agent/collectors/rocm.py) and its release package (rocm-core, rocm-core6.4.1,
amdrocm-base7.14, amdrocm-core7.14), which only the package database knows. Pure over one snapshot."""

from __future__ import annotations

from typing import TYPE_CHECKING, Dict, Optional, Tuple

from agent.collectors.packages import PackageInfo, find_version
from agent.defaults import ROCM_CORE_PACKAGE, THEROCK_BASE_PACKAGE, THEROCK_CORE_PACKAGE
from agent.frozen import replace
from agent.hostfacts.alternatives import CLASSIC_TREE_PREFIX, THEROCK_TREE_PREFIX

if TYPE_CHECKING:  # pragma: no cover
    from agent.collectors.rocm import RocmInfo
    from agent.snapshot.model import Snapshot



def release_package_names(tree: str, active: bool) -> Tuple[str, ...]:
    """The packages that carry a tree's release, the most telling first: ``/opt/rocm/core-7.14`` ->
    amdrocm-base7.14, amdrocm-core7.14; ``/opt/rocm-6.4.1`` -> rocm-core6.4.1 (and rocm-core when it is the active
    tree); any other active tree (a plain ``/opt/rocm``) -> rocm-core."""
    if tree.startswith(THEROCK_TREE_PREFIX):
        release = tree[len(THEROCK_TREE_PREFIX):]
        return THEROCK_BASE_PACKAGE + release, THEROCK_CORE_PACKAGE + release
    versioned = (ROCM_CORE_PACKAGE + tree[len(CLASSIC_TREE_PREFIX):],) if tree.startswith(CLASSIC_TREE_PREFIX) else ()
    return versioned + ((ROCM_CORE_PACKAGE,) if active else ())


def release_package(packages: Dict[str, PackageInfo], tree: str, active: bool) -> Optional[Tuple[str, str]]:
    """(name, version) of the first installed release package of a tree, else None."""
    for name in release_package_names(tree, active):
        version = find_version(packages, name)
        if version is not None:
            return name, version
    return None


def settled(snap: Snapshot) -> Snapshot:
    """The snapshot with each ROCm tree, and the active release, read from its release package where neither its
    version file nor its header says it (``version_source`` names the package)."""
    from agent.policy.releases import rocm_release

    rocm: Optional[RocmInfo] = snap.rocm.data
    if rocm is None:
        return snap
    packages = snap.packages()
    installs = []
    for tree in rocm.installs:
        found = None if tree.version else release_package(packages, tree.path, tree.path == rocm.active_path)
        installs.append(replace(tree, version=rocm_release(found[1]), version_source=found[0]) if found else tree)
    data = replace(rocm, installs=installs)
    if rocm.version is None and rocm.active_path is not None:
        found = release_package(packages, rocm.active_path, True)
        if found:
            data = replace(data, version=rocm_release(found[1]), version_source=found[0])
    return replace(snap, rocm=replace(snap.rocm, data=data))
