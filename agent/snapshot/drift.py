"""Pure analysis of one snapshot: installed-but-not-loaded drivers, pending reboots, missing DKMS builds, companions
that disagree with what they serve, GPU containers that a systemd daemon-reload would cut off.

Every rule reads only the snapshot, so it runs the same on a live host, a fixture and a stored JSON file.
"""

from __future__ import annotations

import fnmatch
from typing import TYPE_CHECKING, Any, Dict, List, Mapping, Optional, Tuple

from agent.collectors.container_cgroups import FIX as DEV_CHAR_FIX
from agent.collectors.packages import PackageInfo, find_version
from agent.collectors.rocm import VERSION_FILE, VERSION_HEADER
from agent.defaults import AMD_DRIVER_PACKAGE, ROCM_CORE_PACKAGE, THEROCK_BASE_PACKAGE
from agent.hostfacts.alternatives import THEROCK_TREE_PREFIX
from agent.hostfacts.package_keys import package_name
from agent.snapshot.rocm_release import release_package
from agent.versions import upstream_dotted

if TYPE_CHECKING:  # pragma: no cover
    from agent.policy.companions import ExporterTable
    from agent.policy.table_unknown import TheRockTable
    from agent.snapshot.model import Finding, Severity, Snapshot

# Packages whose version is the NVIDIA driver's own (not toolkits or container tools).
NVIDIA_DRIVER_PACKAGES = ("libnvidia-compute-*", "nvidia-driver-*", "nvidia-driver", "nvidia-dkms-*",
                          "nvidia-kernel-common-*", "nvidia-kernel-source-*", "nvidia-utils-*", "nvidia-open",
                          "nvidia-open-*", "kmod-nvidia*", "nvidia-kmod-*", "nvidia-kernel-dkms",
                          "nvidia-driver-libs", "nvidia-driver-cuda-libs")
GPU_DKMS_MODULES = ("amdgpu", "nvidia")


def _finding(kind: str, severity: "Severity", component: str, message: str, **details: Optional[str]) -> "Finding":
    from agent.snapshot.model import Finding

    return Finding(kind=kind, severity=severity, component=component, message=message,
                   details={k: v for k, v in details.items() if v is not None})


def _amdgpu_findings(snap: "Snapshot", packages: Dict[str, PackageInfo]) -> List["Finding"]:
    amd = snap.amdgpu.data
    installed = find_version(packages, AMD_DRIVER_PACKAGE)
    if amd is None or installed is None:
        return []
    installed_base = upstream_dotted(installed, 3)
    if amd.driver_kind == "inbox":
        return [_finding("driver_installed_not_loaded", "critical", "amdgpu",
                         f"{AMD_DRIVER_PACKAGE} {installed} is installed but the kernel's inbox amdgpu driver is "
                         "loaded",
                         installed=installed, loaded=amd.driver_version or "inbox")]
    if amd.driver_kind == "dkms" and amd.driver_version and installed_base \
            and upstream_dotted(amd.driver_version, 3) != installed_base:
        return [_finding("driver_installed_not_loaded", "warning", "amdgpu",
                         f"{AMD_DRIVER_PACKAGE} {installed} is installed but amdgpu {amd.driver_version} is loaded; "
                         "a reboot or module reload is pending", installed=installed, loaded=amd.driver_version)]
    return []


def _nvidia_findings(snap: "Snapshot", packages: Dict[str, PackageInfo]) -> List["Finding"]:
    nv = snap.nvidia.data
    if nv is None or not nv.driver_version:
        return []
    loaded = upstream_dotted(nv.driver_version)
    out = []
    for key in sorted(packages):
        name = key.split(":", 1)[0]
        if not any(fnmatch.fnmatchcase(name, p) for p in NVIDIA_DRIVER_PACKAGES):
            continue
        version = packages[key].version
        if upstream_dotted(version) not in (None, loaded):
            out.append(_finding("driver_installed_not_loaded", "warning", "nvidia",
                                f"{name} {version} is installed but nvidia {nv.driver_version} is loaded "
                                "(\"Driver/library version mismatch\" until reboot)",
                                package=name, installed=version, loaded=nv.driver_version))
    return out


def _kernel_findings(snap: "Snapshot") -> List["Finding"]:
    kernel = snap.kernel.data
    if kernel is None or not kernel.reboot_pending or kernel.next_boot is None:
        return []
    out = [_finding("reboot_pending", "info", "kernel",
                    f"next boot uses kernel {kernel.next_boot}, running {kernel.running_release}",
                    running=kernel.running_release, next_boot=kernel.next_boot)]
    dkms = snap.dkms.data
    if dkms is not None:
        for module in GPU_DKMS_MODULES:
            running_builds = dkms.states_for(module, kernel.running_release)
            next_builds = dkms.states_for(module, kernel.next_boot)
            if running_builds and not next_builds:
                out.append(_finding(
                    "dkms_missing_for_next_boot", "critical", module,
                    f"{module} is built for the running kernel {kernel.running_release} but not for the next "
                    f"boot's kernel {kernel.next_boot}: the next boot would come up without the GPU driver",
                    module=module, running=kernel.running_release, next_boot=kernel.next_boot,
                    version=running_builds[0].version))
    return out


def _rocm_findings(snap: "Snapshot", packages: Dict[str, PackageInfo]) -> List["Finding"]:
    rocm = snap.rocm.data
    if rocm is None:
        return []
    out = []
    installed = find_version(packages, ROCM_CORE_PACKAGE)
    classic_active = rocm.active_path is not None and not rocm.active_path.startswith(THEROCK_TREE_PREFIX)
    if classic_active and rocm.version is not None and rocm.version_source is None and installed is not None and \
            upstream_dotted(rocm.version, 3) != upstream_dotted(installed, 3):
        out.append(_finding("rocm_version_mismatch", "warning", "rocm",
                            f"/opt/rocm says ROCm {rocm.version} but package {ROCM_CORE_PACKAGE} is {installed}",
                            on_disk=rocm.version, package=installed))
    for tree in rocm.installs:
        if tree.version is None or tree.version_source is not None:
            continue  # read from the header or a package: nothing on disk to hold against them
        if tree.header_version is not None and upstream_dotted(tree.version, 3) != tree.header_version:
            out.append(_finding("rocm_version_mismatch", "warning", "rocm",
                                f"{tree.path}/{VERSION_FILE} says ROCm {tree.version} but {tree.path}/{VERSION_HEADER} "
                                f"says {tree.header_version}", on_disk=tree.version, header=tree.header_version))
        # /opt/rocm/core-X.Y belongs to amdrocm-baseX.Y (or amdrocm-coreX.Y), /opt/rocm-X.Y.Z to rocm-coreX.Y.Z:
        # file and package must agree (the active classic tree is held against rocm-core above as well)
        found = release_package(packages, tree.path, False)
        if found is not None and upstream_dotted(tree.version, 3) != upstream_dotted(found[1], 3):
            out.append(_finding("rocm_version_mismatch", "warning", "rocm",
                                f"{tree.path} says ROCm {tree.version} but package {found[0]} is {found[1]}",
                                on_disk=tree.version, package=found[1]))
    return out


# Companion rule -> (severity, component): fabric manager at another build leaves an NVSwitch system's GPUs unusable.
_COMPANION_KINDS: Dict[str, Tuple["Severity", str]] = {
    "companion.fabricmanager": ("critical", "nvidia"), "companion.dcgm": ("warning", "dcgm"),
    "companion.dcgm_exporter": ("warning", "dcgm"), "companion.amdsmi": ("warning", "amdsmi")}


def _pip_binding(snap: "Snapshot") -> Optional[Tuple[str, str]]:
    """(version, site directory) of the amdsmi binding pip installed, as the ROCm section reports it."""
    binding = snap.rocm.data.amdsmi_binding if snap.rocm.data is not None else None
    return (binding.version, binding.site_directory) if binding is not None else None


def _active_release(snap: "Snapshot") -> Optional[str]:
    """The release of the tree update-alternatives points at (``10.0``), as the ROCm section reports it."""
    from agent.hostfacts.alternatives import tree_release

    chosen = snap.rocm.data.alternative if snap.rocm.data is not None else None
    return tree_release(chosen.target) if chosen is not None else None


def _companion_findings(snap: "Snapshot", packages: Dict[str, PackageInfo],
                        exporter_table: Optional["ExporterTable"]) -> List["Finding"]:
    """Companions that already disagree with what they serve (agent/policy/companions.py, the rules the guard
    refuses such a change by): fabric manager or NSCQ not the driver's build, DCGM's packages of two releases,
    dcgm-exporter beside a DCGM of another series, an amdsmi binding (a package, or pip's) of another ROCm release."""
    from agent.policy import companions
    from agent.policy.compiled import DEFAULT_NVIDIA_DRIVER_PACKAGES, NVIDIA_NOT_DRIVER_PARTS

    installed = {key: info.version for key, info in packages.items()}
    nv = snap.nvidia.data
    loaded = upstream_dotted(nv.driver_version) if nv is not None and nv.driver_version else None
    found = [*companions.fabricmanager(installed, DEFAULT_NVIDIA_DRIVER_PACKAGES, loaded,
                                       tuple(NVIDIA_NOT_DRIVER_PARTS)),
             *companions.dcgm(installed),
             *(companions.dcgm_exporter(installed, exporter_table) if exporter_table is not None else []),
             *companions.amdsmi(installed, _pip_binding(snap), active_release=_active_release(snap))]
    out = []
    for item in found:
        severity, component = _COMPANION_KINDS[item.rule]
        out.append(_finding("companion_mismatch", severity, component, item.message, rule=item.rule,
                            packages=" ".join(f"{k}={installed[k]}" for k in item.packages if k in installed)))
    return out


def _amd_releases(snap: "Snapshot", packages: Dict[str, PackageInfo]) -> Tuple[Dict[str, Optional[str]],
                                                                                 Dict[str, Optional[str]]]:
    """(every ROCm release series present: release package key or tree path -> series; the TheRock ones alone)."""
    from agent.policy import releases
    from agent.policy.globs import any_glob

    rocm: Dict[str, Optional[str]] = {}
    therock: Dict[str, Optional[str]] = {}
    carries_release = any_glob(releases.rocm_package_patterns(ROCM_CORE_PACKAGE))
    for key in sorted(k for k in packages if carries_release(package_name(k))):
        found = releases.series(releases.rocm_release(packages[key].version))
        rocm[key] = found
        if package_name(key).startswith(THEROCK_BASE_PACKAGE):
            therock[key] = found
    for tree in snap.rocm.data.installs if snap.rocm.data is not None else ():
        found = releases.series(upstream_dotted(tree.version, 3)) if tree.version else None
        rocm[tree.path] = found
        if tree.path.startswith(THEROCK_TREE_PREFIX):
            therock[tree.path] = found
    return rocm, therock


def _table_unknown_findings(snap: "Snapshot", packages: Dict[str, PackageInfo], matrix: Optional[Mapping[str, Any]],
                            exporter_table: Optional["ExporterTable"],
                            therock_table: Optional["TheRockTable"]) -> List["Finding"]:
    """Versions newer than a compatibility table of gpuguard's knows (agent/policy/table_unknown.py: AMD's matrix,
    the TheRock release table and the dcgm-exporter table in use where there is one): reported as info naming the
    table and its date (and the knowledge table's origin), never judged. The TheRock table is read (the package's,
    when none is given) only where a TheRock release is installed: a snapshot elsewhere never parses it."""
    from agent.policy import companions, releases, table_unknown

    installed = {key: info.version for key, info in packages.items()}
    rocm, therock = _amd_releases(snap, packages)
    unreadable: List["Finding"] = []
    if therock_table is None and any(therock.values()):
        from agent.errors import GpuguardError
        from agent.policy.knowledge_files import therock_table_in_use

        try:
            therock_table = therock_table_in_use()
        except GpuguardError as exc:
            unreadable = [_finding("knowledge_unreadable", "warning", "rocm", f"gpuguard's TheRock release table "
                                   f"cannot be read ({exc}): no TheRock release is reported as newer than it; "
                                   f"reinstall gpuguard")]
    found = [*(companions.unknown_to_table(installed, exporter_table) if exporter_table is not None else []),
             *(table_unknown.therock(therock, therock_table) if therock_table is not None else [])]
    if matrix is not None:
        driver_key = next((k for k in sorted(installed) if package_name(k) == AMD_DRIVER_PACKAGE), None)
        drivers = {driver_key: releases.series(releases.amdgpu_driver_release(installed[driver_key]))} \
            if driver_key else {}
        gpus = [g.gfx_target for g in snap.amdgpu.data.gpus if g.gfx_target] if snap.amdgpu.data is not None else []
        found += table_unknown.amd_matrix(matrix, rocm, drivers, gpus)
    origins = {companions.EXPORTER_TABLE_NAME: exporter_table.origin if exporter_table is not None else None,
               table_unknown.THEROCK: therock_table.origin if therock_table is not None else None}
    return [*(_finding("unknown_to_table", "info", item.component, item.message, table=item.table,
                       version=item.version, newest=item.newest, table_dated=item.dated,
                       table_origin=origins.get(item.table),
                       packages=" ".join(f"{k}={installed[k]}" for k in item.packages) or None)
              for item in found), *unreadable]


def _package_state_findings(packages: Dict[str, PackageInfo]) -> List["Finding"]:
    return [_finding("package_not_fully_installed", "warning", "packages",
                     f"{key} {info.version} is in state {info.state}", package=key, state=info.state)
            for key, info in sorted(packages.items()) if info.state != "installed"]


def _container_cgroup_findings(snap: "Snapshot") -> List["Finding"]:
    """The systemd cgroup driver with the NVIDIA toolkit and NVIDIA devices that have no /dev/char link."""
    info = snap.container_cgroups.data
    if info is None or not info.nvidia_container_toolkit or not info.dev_char_missing:
        return []
    runtimes = info.systemd_cgroup_runtimes
    if not runtimes:
        return []
    return [_finding(
        "gpu_containers_lose_devices_on_daemon_reload", "warning", "containers",
        f"{' and '.join(runtimes)} use{'s' if len(runtimes) == 1 else ''} the systemd cgroup driver with the NVIDIA "
        f"container toolkit, and {len(info.dev_char_missing)} NVIDIA device(s) have no /dev/char link: any "
        "`systemctl daemon-reload` (package scripts run them) can cut the GPUs off running containers (\"Failed to "
        f"initialize NVML: Unknown Error\"); fix: {DEV_CHAR_FIX}, and a udev rule that runs it when the driver "
        "loads (NVIDIA's container toolkit docs)",
        runtimes=",".join(runtimes), missing=" ".join(info.dev_char_missing), fix=DEV_CHAR_FIX,
        docker_cgroup_driver_source=info.docker_cgroup_driver_source if "docker" in runtimes else None)]


def analyze(snap: "Snapshot", matrix: Optional[Mapping[str, Any]] = None,
            exporter_table: Optional["ExporterTable"] = None,
            therock_table: Optional["TheRockTable"] = None) -> List["Finding"]:
    """Every finding the snapshot supports, in a stable order; ``matrix`` is AMD's matrix in its compiled form
    (agent/policy/matrix.py), to report what is newer than it (none: not judged against it); ``exporter_table``:
    gpuguard's dcgm-exporter table in use (None: the package's, agent/policy/knowledge_files.py, read only where DCGM
    or dcgm-exporter is installed: a snapshot elsewhere never parses it; when it cannot be read, a warning finding
    says so and the table's findings are left out, never the snapshot); ``therock_table``: the TheRock release table
    in use, likewise (None: the package's, read only where a TheRock release is installed)."""
    from agent.policy import companions
    from agent.policy.globs import any_glob

    packages = snap.packages()
    unreadable: List["Finding"] = []
    dcgm = any_glob(companions.DCGM_PACKAGES + companions.DCGM_EXPORTER_PACKAGES)
    if exporter_table is None and any(dcgm(package_name(key)) for key in packages):
        from agent.errors import GpuguardError
        from agent.policy.knowledge_files import exporter_table_in_use

        try:
            exporter_table = exporter_table_in_use()
        except GpuguardError as exc:
            unreadable = [_finding("knowledge_unreadable", "warning", "dcgm", f"gpuguard's dcgm-exporter table "
                                   f"cannot be read ({exc}): dcgm-exporter is not judged; reinstall gpuguard")]
    unknown = [*_table_unknown_findings(snap, packages, matrix, exporter_table, therock_table), *unreadable]
    return [*_kernel_findings(snap), *_amdgpu_findings(snap, packages), *_rocm_findings(snap, packages),
            *_nvidia_findings(snap, packages), *_companion_findings(snap, packages, exporter_table), *unknown,
            *_container_cgroup_findings(snap), *_package_state_findings(packages)]
