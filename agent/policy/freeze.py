"""``gpuguard policy freeze``: a policy that keeps a host on what it runs now, as commented TOML (pure).

agent/commands/policy.py reads the host into :class:`FreezeFacts` (installed guarded packages, running kernel, the host
context of agent/hostfacts/context.py: os-release and the loaded GPU modules); :func:`render_freeze` sorts the
packages into the driver/ROCm or NVIDIA driver/CUDA pairing, the kernels, the rest of the GPU stack and the other
guarded packages, and writes a policy in the policy model's own fields (agent/policy/model.py) with a comment on
every line saying what it pins and why.

A host whose installed driver is not the one loaded (the driver moved and the host was not rebooted) is refused
with :class:`FreezeRefused`, unless ``accept_inconsistent``; then the policy says so.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from agent.defaults import AMD_DRIVER_PACKAGE, DEFAULT_POLICY_DIR, ROCM_CORE_PACKAGE, THEROCK_BASE_PACKAGE
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
    gpu_other: Dict[str, str]  # other GPU packages (container toolkit, cuda-compat, firmware): no pairing reads them
    rest: Dict[str, str]  # other guarded packages (dkms, headers, kernel meta packages)


def _name_series(name: str) -> Optional[str]:
    """The CUDA release a versioned name carries (``cuda-toolkit-13-0`` -> ``13.0``), as the evaluator reads it."""
    head, _, minor = name.rpartition("-")
    major = head.rpartition("-")[2]
    return f"{major}.{minor}" if minor.isdecimal() and major.isdecimal() else None


def _sort(facts: FreezeFacts) -> _Stack:
    kernel_glob, amd_glob = any_glob(DEFAULT_KERNEL_PACKAGES), any_glob(AMD_STACK_PACKAGES)
    rocm_glob = any_glob(releases.rocm_package_patterns(ROCM_CORE_PACKAGE))
    nvidia_glob, cuda_glob = any_glob(DEFAULT_NVIDIA_DRIVER_PACKAGES), any_glob(DEFAULT_CUDA_PACKAGES)
    gpu_glob = any_glob(("nvidia-*", "libnvidia-*", "cuda-*", "libcuda*", "kmod-nvidia*", "firmware-amd-graphics",
                         "firmware-nvidia-*", "datacenter-gpu-manager*", "dcgm-exporter", "libamd-smi*",
                         "python3-amdsmi*"))
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
    return stack


def _judged_cuda(name: str, version: str) -> bool:
    """Whether the NVIDIA pairing judges this CUDA package by its version (``cuda-compat-13-0`` is versioned after
    the driver, ``580.95.05``, and is not)."""
    named = _name_series(name)
    release = releases.dotted_release(version) or "unknown"
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
    lines = _header(facts, options, name, amd, nvidia, inconsistent)
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
    if amd:
        lines += _amd_lines(facts, stack, options, kernels, inconsistent)
    if nvidia:
        lines += _nvidia_lines(facts, stack, options)
    lines += ["", "[kernel]  # kernels: new ones must be on this list (those installed stay allowed)"]
    lines += _array("allow", kernels, "any other kernel is refused" if not options.kernel_series else
                    "kernels of these series only")
    lines += _versions_lines(stack, options)
    lines += _companion_lines(facts)
    frozen = _frozen(stack, options)
    if frozen:
        lines += ["", "[frozen]  # must not move at all: no upgrade, downgrade, reinstall at another build or removal"]
        lines += _array("packages", frozen, "the rest of the GPU stack, at the builds installed now")
    return "\n".join(lines) + "\n"


def _names(found: Mapping[str, str]) -> List[Tuple[str, str]]:
    return list(dict.fromkeys((package_name(k), v) for k, v in sorted(found.items())))


def _header(facts: FreezeFacts, options: FreezeOptions, name: str, amd: bool, nvidia: bool,
            inconsistent: Sequence[str]) -> List[str]:
    host = f"{facts.hostname} ({facts.context.os_id or '?'} {facts.context.os_version_id or '?'})"
    lines = [f"# gpuguard policy '{name}': host {host} frozen as it was"
             + (f" on {facts.date}" if facts.date else "") + " by `gpuguard policy freeze`."]
    widened = [w for w, on in (("point releases", options.point_releases), ("a kernel series", options.kernel_series))
               if on]
    pinned = [what for what, on in (("the amdgpu driver and ROCm", amd), ("the NVIDIA driver and CUDA", nvidia))
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


def _amd_lines(facts: FreezeFacts, stack: _Stack, options: FreezeOptions, kernels: Sequence[Tuple[str, str]],
               inconsistent: Sequence[str]) -> List[str]:
    lines = ["", "[amd]  # the amdgpu driver and ROCm",
             _line("driver_package", AMD_DRIVER_PACKAGE,
                   "its version carries the driver release (1:6.8.5.60202-... is 6.2.2)"),
             _line("rocm_package", ROCM_CORE_PACKAGE, f"its version carries the ROCm release (TheRock's "
                                                      f"{THEROCK_BASE_PACKAGE}<release> is judged beside it)")]
    rocm_releases = {k: releases.rocm_release(v) for k, v in stack.rocm.items()}
    known_rocm = sorted(r for r in rocm_releases.values() if r)
    if len({releases.series(r) for r in rocm_releases.values()}) > 1:
        lines.append(_line("side_by_side", True, "several ROCm releases are installed side by side now"))
    lines += ["", "[[amd.pairing]]  # the one allowed pairing: the installed one",
              _line("name", "frozen", "named in refusals")]
    loaded = facts.context.loaded("amdgpu")
    driver = stack.amd_driver
    if driver is None:
        lines.append(_line("amdgpu", "none", f"no {AMD_DRIVER_PACKAGE} is installed (ROCm runs on the kernel's own "
                                             f"amdgpu driver"
                                             + (f", loaded module {loaded}" if loaded else "") + "): installing one "
                                             "is refused"))
    else:
        release = releases.amdgpu_driver_release(driver)
        where = f"{AMD_DRIVER_PACKAGE} {driver}" + (f", loaded module {loaded}" if loaded and not inconsistent else "")
        if release is None:
            lines.append(_line("amdgpu", "any", f"{where} carries no release code: the exact build below pins it"))
        elif options.point_releases:
            lines.append(_line("amdgpu", f"{releases.series(release)}.*",
                               f"driver {releases.series(release)} point releases (installed: {release}, {where})"))
        else:
            lines.append(_line("amdgpu", release, f"driver release {release} ({where})"))
    if not stack.rocm:
        lines.append(_line("rocm", "none", f"no {ROCM_CORE_PACKAGE} or {THEROCK_BASE_PACKAGE} is installed: "
                                           f"installing ROCm is refused"))
    elif any(r is None for r in rocm_releases.values()):
        lines.append(_line("rocm", "any", "a ROCm package carries no release: the exact builds below pin it"))
    elif options.point_releases:
        lines.append(_line("rocm", _spec([f"{releases.series(r)}.*" for r in known_rocm]),
                           f"ROCm point releases (installed: {_listing(stack.rocm)})"))
    else:
        lines.append(_line("rocm", _spec(known_rocm),
                           f"ROCm release ({_listing(stack.rocm)})"))
    exact_driver = driver is not None and (not options.point_releases or releases.amdgpu_driver_release(driver)
                                           is None)
    if exact_driver:
        lines.append(_line("amdgpu_package", driver, "this exact build: any other driver build is refused"
                                                     + (f" ({AMD_FIRMWARE} must stay at the same build)"
                                                        if stack.amd_firmware else "")))
    exact_rocm = stack.rocm and (not options.point_releases or any(r is None for r in rocm_releases.values()))
    if exact_rocm:
        lines.append(_line("rocm_package", _spec(sorted(stack.rocm.values())),
                           (f"this exact build of {package_name(next(iter(stack.rocm)))}" if len(stack.rocm) == 1
                            else f"these exact builds ({_listing(stack.rocm)})") + ": any other ROCm build is refused"))
    if driver is not None and kernels:
        lines.append(_line("kernels", [k for k, _ in kernels],
                           "the kernels DKMS builds this driver for (as [kernel] allow below)"))
    return lines


def _nvidia_lines(facts: FreezeFacts, stack: _Stack, options: FreezeOptions) -> List[str]:
    lines = ["", "[nvidia]  # the NVIDIA driver and CUDA"]
    cuda = {k: releases.dotted_release(v) or "unknown" for k, v in stack.cuda.items()}
    if len({releases.series(r) for r in cuda.values()}) > 1:
        lines.append(_line("side_by_side", True, "several CUDA releases are installed side by side now"))
    lines += ["", "[[nvidia.pairing]]  # the one allowed pairing: the installed one",
              _line("name", "frozen", "named in refusals")]
    loaded = facts.context.loaded("nvidia")
    parts = {k: _driver_release(v) for k, v in stack.nvidia_parts.items()}
    if parts:
        release = next(iter(parts.values()))
        where = f"every driver package: {_listing(stack.nvidia_parts, 2)}" + (
            "; and the loaded module" if loaded == release else "")
    elif loaded:
        release = loaded
        where = "no package carries it: the loaded nvidia module is judged"
    else:
        release = None
        where = ""
    if release is None:
        lines.append(_line("driver", "none", "no NVIDIA driver package and no loaded module: installing a driver is "
                                             "refused"))
    elif options.point_releases:
        branch = releases.series(release, 1)
        lines.append(_line("driver", f"{branch}.*", f"driver branch {branch} updates (now {release}; {where})"))
    else:
        lines.append(_line("driver", release, f"driver release {release} ({where})"))
    if not cuda:
        lines.append(_line("cuda", "none", "no CUDA package is installed: installing CUDA is refused"))
    elif options.point_releases:
        lines.append(_line("cuda", _spec([f"{releases.series(r)}.*" for r in sorted(cuda.values())]),
                           f"CUDA point releases (installed: {_listing(stack.cuda)})"))
    else:
        lines.append(_line("cuda", _spec(sorted(cuda.values())),
                           f"every CUDA release installed ({_listing(stack.cuda)})"))
    return lines


def _versions_lines(stack: _Stack, options: FreezeOptions) -> List[str]:
    """With point releases, the GPU packages no pairing reads keep their own version series."""
    if not options.point_releases:
        return []
    lines: List[str] = []
    for name, version in _names(stack.gpu_other):
        dotted = releases.dotted_release(version, parts=2)
        allow = f"{dotted}.*" if dotted and "." in dotted else version
        lines += ["", "[[versions]]  # a GPU package no pairing reads",
                  _line("name", name, "named in refusals"),
                  _line("packages", [name], f"installed {version}"),
                  _line("allow", allow, "its point releases only" if allow != version else
                        "this exact version (it has no release series)")]
    return lines


def _frozen(stack: _Stack, options: FreezeOptions) -> List[Tuple[str, str]]:
    """Exact builds: every GPU package that the pairing does not pin at its exact build. With point releases
    none: AMD's and NVIDIA's packages depend on each other at exact versions and follow the pairing."""
    if options.point_releases:
        return []
    found = {**stack.amd_other, **stack.nvidia_parts, **stack.cuda, **stack.gpu_other}
    return [(n, f"installed {v}") for n, v in _names(found)]


def _companion_lines(facts: FreezeFacts) -> List[str]:
    """``[companions]``: each rule on where the host has its packages and they agree now; off, saying why, where
    they already disagree (fix the host, then turn it on) or the host has none of them."""
    installed = facts.installed
    names = {package_name(k) for k in installed}
    binding = facts.context.amdsmi_binding
    driver = list(DEFAULT_NVIDIA_DRIVER_PACKAGES)
    present = {
        "fabricmanager": any_glob(companions.FABRICMANAGER_PACKAGES),
        "dcgm": any_glob(companions.DCGM_PACKAGES),
        "dcgm_exporter": any_glob(companions.DCGM_EXPORTER_PACKAGES),
        "amdsmi": any_glob(companions.AMDSMI_BINDING_PACKAGES + companions.AMDSMI_LIBRARY_PACKAGES),
    }
    found = {
        "fabricmanager": companions.fabricmanager(installed, driver, facts.context.loaded("nvidia"),
                                                  tuple(NVIDIA_NOT_DRIVER_PARTS)),
        "dcgm": companions.dcgm(installed),
        "dcgm_exporter": companions.dcgm_exporter(installed),
        "amdsmi": companions.amdsmi(installed, binding),
    }
    have = {rule: any(match(n) for n in names) or (rule == "amdsmi" and binding is not None)
            for rule, match in present.items()}
    if not any(have.values()):
        return []
    lines = ["", "[companions]  # packages that must stay paired with what they serve"]
    for rule in companions.RULE_FIELDS:
        what = companions.DESCRIPTIONS[f"companion.{rule}"]
        if not have[rule]:
            lines.append(_line(rule, False, f"none of its packages is installed now ({what})"))
        elif found[rule]:
            lines.append(_line(rule, False, f"OFF: the host disagrees now ({found[rule][0].message}); put it right, "
                                            f"then set true"))
        else:
            lines.append(_line(rule, True, what))
    return lines
