"""``gpuguard policy freeze``: a policy that keeps a host on what it runs now, as commented TOML (pure).

agent/commands/policy.py reads the host into :class:`FreezeFacts` (installed guarded packages, running kernel, the host
context of agent/hostfacts/context.py: os-release and the loaded GPU modules); :func:`render_freeze` sorts the
packages into the driver/ROCm or NVIDIA driver/CUDA pairing, the kernels, the rest of the GPU stack and the other
guarded packages, and writes a policy in the policy model's own fields (agent/policy/model.py) with a comment on
every line saying what it pins and why: the header, ``[policy]`` and ``guarded`` here, each rule family's section
by the family's ``freeze`` (agent/policy/families/), in the order of their ``FREEZE_PLACE``.

A host whose installed driver is not the one loaded (the driver moved and the host was not rebooted) is refused
with :class:`FreezeRefused`, unless ``accept_inconsistent``; then the policy says so.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from agent.defaults import (
    AMD_DRIVER_PACKAGE,
    DEFAULT_POLICY_DIR,
    DISTRIBUTION_CUDA_PACKAGES,
    DISTRIBUTION_ROCM_PACKAGES,
    NVIDIA_GL_PACKAGES,
    ROCM_CORE_PACKAGE,
    THEROCK_BASE_PACKAGE,
)
from agent.hostfacts.context import NO_FACTS, HostContext
from agent.hostfacts.package_keys import package_name
from agent.policy import companions, releases
from agent.policy.compiled import (
    AMD_STACK_PACKAGES,
    DEFAULT_CUDA_PACKAGES,
    DEFAULT_GUARDED,
    DEFAULT_KERNEL_PACKAGES,
    DEFAULT_NVIDIA_DRIVER_PACKAGES,
    NVIDIA_NOT_DRIVER_PARTS,
)
from agent.policy.evaluate import FAMILIES, family
from agent.policy.globs import any_glob

AMD_FIRMWARE = AMD_DRIVER_PACKAGE + "-firmware"
# Every package a freeze reads: what the guard protects by default and what the pairing rules judge.
FREEZE_PACKAGES: Tuple[str, ...] = tuple(dict.fromkeys(
    (*DEFAULT_GUARDED, *DEFAULT_KERNEL_PACKAGES, *DEFAULT_NVIDIA_DRIVER_PACKAGES, *DEFAULT_CUDA_PACKAGES,
     *(p for rule in companions.RULE_FIELDS for p in companions.family(f"companion.{rule}")))))
SUGGESTED_PATH = f"{DEFAULT_POLICY_DIR}/50-freeze.toml"


class FreezeRefused(ValueError):
    """The host cannot be frozen as it is; the message is one line saying what differs and how to proceed."""


@dataclass(frozen=True)
class FreezeFacts:
    """What the host is now: guarded package key -> version, the package manager (``dpkg``/``rpm``), the running
    kernel (``uname -r``), the host context (OS, the loaded ``nvidia`` and ``amdgpu`` modules' versions) and name."""

    installed: Mapping[str, str]
    manager: str = "dpkg"
    running_kernel: Optional[str] = None
    context: HostContext = NO_FACTS
    hostname: str = "unknown"
    date: str = ""  # when the facts were read (YYYY-MM-DD), for the header
    # gpuguard's dcgm-exporter table in use (agent/policy/knowledge_files.py); None: the package's
    exporter_table: Optional[companions.ExporterTable] = None


@dataclass(frozen=True)
class FreezeOptions:
    """How wide the freeze is: exact builds by default; point releases and/or a kernel series when asked."""

    name: Optional[str] = None
    point_releases: bool = False
    kernel_series: bool = False
    accept_inconsistent: bool = False


@dataclass
class _Stack:
    """The installed packages sorted by the rule that pins them (key -> version)."""

    kernels: Dict[str, Tuple[str, str]]  # kernel release -> (package key, version)
    amd_driver: Optional[str]
    amd_firmware: Optional[str]
    rocm: Dict[str, str]
    amd_other: Dict[str, str]
    nvidia_parts: Dict[str, str]  # key -> version (the driver release is its leading dotted number)
    cuda: Dict[str, str]  # key -> version, only packages the pairing judges by their version
    gpu_other: Dict[str, str]  # other GPU packages (container toolkit, cuda-compat, firmware, the distribution's ROCm
    # and CUDA libraries): no pairing reads them
    rest: Dict[str, str]  # other guarded packages (dkms, headers, kernel meta packages)


@dataclass(frozen=True)
class _Host:
    """What the families' ``freeze`` read (agent/policy/families/__init__.py, ``FreezeHost``): the facts, the
    options, the sorted stack, the kernel allow entries, and this module's TOML writers."""

    facts: FreezeFacts
    options: FreezeOptions
    stack: _Stack
    kernels: List[Tuple[str, str]]
    inconsistent: List[str]
    amd: bool
    nvidia: bool

    @property
    def installed(self) -> Mapping[str, str]:
        return self.facts.installed

    @property
    def context(self) -> HostContext:
        return self.facts.context

    @property
    def exporter_table(self) -> companions.ExporterTable:
        if self.facts.exporter_table is not None:
            return self.facts.exporter_table
        from agent.policy.knowledge_files import exporter_table_in_use

        return exporter_table_in_use()

    @property
    def point_releases(self) -> bool:
        return self.options.point_releases

    @property
    def kernel_series(self) -> bool:
        return self.options.kernel_series

    def line(self, key: str, value: object, comment: str) -> str:
        return _line(key, value, comment)

    def array(self, key: str, items: Sequence[Tuple[str, str]], comment: str) -> List[str]:
        return _array(key, items, comment)

    def spec(self, values: Sequence[str]) -> object:
        return _spec(values)

    def listing(self, found: Mapping[str, str], limit: int = 3) -> str:
        return _listing(found, limit)

    def names(self, found: Mapping[str, str]) -> List[Tuple[str, str]]:
        return _names(found)


def _name_series(name: str) -> Optional[str]:
    """The CUDA release a versioned name carries (``cuda-toolkit-13-0`` -> ``13.0``), as the evaluator reads it."""
    head, _, minor = name.rpartition("-")
    major = head.rpartition("-")[2]
    return f"{major}.{minor}" if minor.isdecimal() and major.isdecimal() else None


def _sort(facts: FreezeFacts) -> _Stack:
    kernel_glob, amd_glob = any_glob(DEFAULT_KERNEL_PACKAGES), any_glob(AMD_STACK_PACKAGES)
    rocm_glob = any_glob(releases.rocm_package_patterns(ROCM_CORE_PACKAGE))
    distro_glob = any_glob(DISTRIBUTION_ROCM_PACKAGES)
    nvidia_glob, cuda_glob = any_glob(DEFAULT_NVIDIA_DRIVER_PACKAGES), any_glob(DEFAULT_CUDA_PACKAGES)
    gpu_glob = any_glob(("nvidia-*", "libnvidia-*", "cuda-*", "libcuda*", "kmod-nvidia*", "firmware-amd-graphics",
                         "firmware-nvidia-*", "datacenter-gpu-manager*", "dcgm-exporter", "libamd-smi*",
                         "python3-amdsmi*", *DISTRIBUTION_CUDA_PACKAGES, *NVIDIA_GL_PACKAGES))
    stack = _Stack({}, None, None, {}, {}, {}, {}, {}, {})
    for key, version in sorted(facts.installed.items()):
        name = package_name(key)
        release = releases.kernel_release_of(key, version, manager=facts.manager) if kernel_glob(name) else None
        if release:
            stack.kernels.setdefault(release, (key, version))
        elif name == AMD_DRIVER_PACKAGE and stack.amd_driver is None:
            stack.amd_driver = version
        elif name == AMD_FIRMWARE and stack.amd_firmware is None:
            stack.amd_firmware = version
        elif rocm_glob(name):
            stack.rocm[key] = version
        elif distro_glob(name):  # Debian's and Ubuntu's ROCm: each library has its own version, no pairing reads it
            stack.gpu_other[key] = version
        elif amd_glob(name):
            stack.amd_other[key] = version
        elif nvidia_glob(name) and name not in NVIDIA_NOT_DRIVER_PARTS:
            stack.nvidia_parts[key] = version
        elif cuda_glob(name) and _judged_cuda(name, version):
            stack.cuda[key] = version
        elif gpu_glob(name):
            stack.gpu_other[key] = version
        else:
            stack.rest[key] = version
    if stack.amd_driver is None and not stack.rocm:
        # no AMD release package for them to move with (Debian's rocminfo, rocm-smi, amd-smi): each on its own
        stack.gpu_other.update(stack.amd_other)
        stack.amd_other.clear()
    return stack


def _judged_cuda(name: str, version: str) -> bool:
    """Whether the NVIDIA pairing judges this CUDA package by its version (``cuda-compat-13-0`` is versioned after
    the driver, ``580.95.05``, and is not)."""
    named = _name_series(name)
    release = releases.cuda_release(version) or "unknown"
    return named is None or releases.series(release, 1) == releases.series(named, 1)


def _toml(value: object) -> str:
    """A TOML value: a basic string (JSON's escapes are TOML's), a bool, or a one-line array of strings."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(json.dumps(v) for v in value) + "]"
    return json.dumps(value)


def _line(key: str, value: object, comment: str) -> str:
    return f"{key} = {_toml(value)}  # {comment}"


def _array(key: str, items: Sequence[Tuple[str, str]], comment: str) -> List[str]:
    """A multi-line array, one commented item per line."""
    return [f"{key} = [  # {comment}", *(f"  {json.dumps(v)},  # {why}" for v, why in items), "]"]


def _spec(values: Sequence[str]) -> object:
    unique = list(dict.fromkeys(values))
    return unique[0] if len(unique) == 1 else unique


def _listing(found: Mapping[str, str], limit: int = 3) -> str:
    shown = [f"{package_name(k)} {v}" for k, v in sorted(found.items())]
    return ", ".join(shown[:limit]) + (f" and {len(shown) - limit} more" if len(shown) > limit else "")


def _driver_release(version: str) -> str:
    return releases.dotted_release(version) or "unknown"


def kernel_series(release: str, manager: str = "dpkg") -> str:
    """The kernel series glob of a release: ``6.8.0-45-generic`` -> ``6.8.0-*-generic``, ``6.1.0-26-amd64`` ->
    ``6.1.0-*-amd64``, rpm ``5.14.0-570.12.1.el9_6`` -> ``5.14.0-*`` (the upstream version; ABI and build vary)."""
    upstream, sep, rest = release.partition("-")
    if not sep:
        return release
    abi, dash, flavour = rest.partition("-")
    if manager != "rpm" and dash and abi.isdecimal() and flavour:
        return f"{upstream}-*-{flavour}"
    return f"{upstream}-*"


def check_consistent(facts: FreezeFacts, options: FreezeOptions) -> List[str]:
    """Inconsistencies between what is installed and what is loaded, as lines for the policy's header (with
    ``accept_inconsistent``); FreezeRefused otherwise, and always for a driver whose packages are not one build."""
    stack = _sort(facts)
    found: List[str] = []
    if stack.amd_driver and stack.amd_firmware and not releases.amdgpu_same_build(stack.amd_driver,
                                                                                 stack.amd_firmware):
        raise FreezeRefused(f"{AMD_DRIVER_PACKAGE} {stack.amd_driver} and {AMD_FIRMWARE} {stack.amd_firmware} are "
                            f"not one build: finish or undo the driver change (install both at one version), "
                            f"then freeze")
    parts = {k: _driver_release(v) for k, v in stack.nvidia_parts.items()}
    if len(set(parts.values())) > 1:
        by_release: Dict[str, List[str]] = {}
        for key, release in sorted(parts.items()):
            by_release.setdefault(release, []).append(package_name(key))
        listed = "; ".join(f"{r}: {', '.join(names)}" for r, names in sorted(by_release.items()))
        raise FreezeRefused(f"the NVIDIA driver's packages are not one build ({listed}): finish or undo the driver "
                            f"change (every part at one release), then freeze")
    amd_loaded = facts.context.loaded("amdgpu")
    amd_base = releases.amdgpu_kernel_base(stack.amd_driver) if stack.amd_driver else None
    # from 31.40 the module reports its release code too (6.19.14.31400000): the kernel base is what it builds
    if amd_loaded and amd_base and releases.dotted_release(amd_loaded, parts=3) != amd_base:
        found.append(f"the loaded amdgpu module is {amd_loaded}, the installed {AMD_DRIVER_PACKAGE} {stack.amd_driver} "
                     f"builds {amd_base}")
    nvidia_loaded = facts.context.loaded("nvidia")
    if nvidia_loaded and parts and nvidia_loaded not in parts.values():
        found.append(f"the loaded nvidia module is {nvidia_loaded}, the installed NVIDIA driver is "
                     f"{next(iter(parts.values()))} ({_listing(stack.nvidia_parts, 2)})")
    if found and not options.accept_inconsistent:
        raise FreezeRefused(f"the installed driver is not the loaded one: {'; '.join(found)}; reboot into the "
                            f"installed driver and freeze again, or pass --accept-inconsistent to freeze the "
                            f"installed packages (what the next boot loads)")
    return found


def render_freeze(facts: FreezeFacts, options: FreezeOptions = FreezeOptions()) -> str:
    """The policy TOML that keeps this host where it is; FreezeRefused when the host is inconsistent."""
    inconsistent = check_consistent(facts, options)
    stack = _sort(facts)
    amd = bool(stack.amd_driver or stack.rocm)
    nvidia = bool(stack.nvidia_parts or stack.cuda or facts.context.loaded("nvidia"))
    name = options.name or f"freeze-{facts.hostname}"
    kernels = _kernel_allow(facts, stack, options)
    distro_glob = any_glob(DISTRIBUTION_ROCM_PACKAGES)
    distro_rocm = {k: v for k, v in stack.gpu_other.items() if distro_glob(package_name(k))}
    lines = _header(facts, options, name, amd, nvidia, inconsistent, distro_rocm)
    if options.point_releases and stack.amd_other:
        lines.insert(2, f"# With point releases, {', '.join(n for n, _ in _names(stack.amd_other))} are not pinned on "
                        f"their own: AMD's packages depend on {ROCM_CORE_PACKAGE} (TheRock's on "
                        f"{THEROCK_BASE_PACKAGE}<release>) at exact versions and move with it.")
    lines += ["", "[policy]  # the whole policy",
              _line("name", name, "shown in every refusal and by policy explain"),
              _line("action", "block", "a violating apt or dnf transaction is refused before anything changes "
                                       "(rollback would also undo what bypasses them, e.g. dpkg -i)"),
              _line("failsafe", "block-guarded", "without a readable compiled policy, changes to guarded packages "
                                                 "are refused")]
    if stack.rest:
        lines += _array("guarded", [(n, f"installed {v}") for n, v in _names(stack.rest)],
                        "installed now and named by no rule below: the fail-safe protects them, the known-good "
                        "set holds them")
    host = _Host(facts, options, stack, kernels, inconsistent, amd, nvidia)
    for module in sorted((family(name) for name in FAMILIES), key=lambda module: module.FREEZE_PLACE):
        lines += module.freeze(host)
    return "\n".join(lines) + "\n"


def _names(found: Mapping[str, str]) -> List[Tuple[str, str]]:
    return list(dict.fromkeys((package_name(k), v) for k, v in sorted(found.items())))


def _header(facts: FreezeFacts, options: FreezeOptions, name: str, amd: bool, nvidia: bool,
            inconsistent: Sequence[str], distro_rocm: Mapping[str, str]) -> List[str]:
    host = f"{facts.hostname} ({facts.context.os_id or '?'} {facts.context.os_version_id or '?'})"
    lines = [f"# gpuguard policy '{name}': host {host} frozen as it was"
             + (f" on {facts.date}" if facts.date else "") + " by `gpuguard policy freeze`."]
    widened = [w for w, on in (("point releases", options.point_releases), ("a kernel series", options.kernel_series))
               if on]
    pinned = [what for what, on in (("the amdgpu driver and ROCm", amd), ("the NVIDIA driver and CUDA", nvidia),
                                    (f"ROCm as the distribution packages it ({_listing(distro_rocm)})",
                                     bool(distro_rocm) and not amd))
              if on]
    if pinned:
        lines.append(f"# It pins {' and '.join(pinned)} at "
                     + ("their installed builds" if not options.point_releases else "their installed release series")
                     + ", and the kernels; " + ("widened to " + " and ".join(widened) + "." if widened else
                                                 "any other build is refused."))
    else:
        lines.append("# No GPU driver was found (no amdgpu-dkms or ROCm package, no NVIDIA driver or CUDA package, "
                     "no loaded nvidia module): it freezes the kernels only.")
        amdgpu = facts.context.loaded("amdgpu")
        if amdgpu:
            lines.append(f"# The loaded amdgpu module {amdgpu} comes from no package: "
                         f"there is no driver package to pin.")
    for line in inconsistent:
        lines.append(f"# INCONSISTENT when frozen (--accept-inconsistent): {line}; this policy pins the installed "
                     f"packages, which the next boot loads.")
    lines += [f"# Save it as {SUGGESTED_PATH}, check it with `gpuguard policy check FILE`, then run",
              "# `gpuguard policy compile` and `gpuguard pin apply`. Files in policy.d merge: pairings of other files",
              "# are alternatives to the ones here, so keep this the only file that has pairings."]
    return lines


def _kernel_allow(facts: FreezeFacts, stack: _Stack, options: FreezeOptions) -> List[Tuple[str, str]]:
    running = releases.policy_kernel_release(facts.running_kernel, facts.manager) if facts.running_kernel else None
    found: Dict[str, List[str]] = {}
    for release, (key, version) in sorted(stack.kernels.items()):
        found.setdefault(release, []).append(f"installed ({package_name(key)} {version})")
    if running:
        found.setdefault(running, []).insert(0, "running")
        if len(found[running]) == 1:
            found[running].append("no installed package carries it")
    if not options.kernel_series:
        return [(release, ", ".join(why)) for release, why in sorted(found.items())]
    series: Dict[str, List[str]] = {}
    for release in sorted(found):
        series.setdefault(kernel_series(release, facts.manager), []).append(release)
    return [(glob, f"the series of {', '.join(members)}") for glob, members in sorted(series.items())]
