"""What the policy pins, package by package: the records behind apt preferences and dnf versionlock alike (pure).

- frozen: every installed build of a frozen package is held (``priority`` 1001);
- forbidden: every available build that no allowed state can contain is kept out (``priority`` -1): a driver or
  ROCm release in no pairing, a kernel that is not allowed, a version outside a version rule.

agent/guard/apt/preferences.py renders them as apt preferences, agent/guard/dnf/versionlock.py as versionlock
entries.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from typing import List, Mapping, Optional, Sequence, Tuple

from agent.policy import releases
from agent.policy.compiled import CompiledPolicy
from agent.policy.evaluate import matching_pairing
from agent.policy.spec import matches


@dataclass(frozen=True)
class Pin:
    """One pin: ``priority`` 1001 holds an installed build (frozen), -1 keeps a build out (forbidden)."""

    package: str
    version: str
    priority: int
    why: str


def glob_prefix(pattern: str) -> str:
    for i, ch in enumerate(pattern):
        if ch in "*?[":
            return pattern[:i]
    return pattern


def names_to_query(policy: CompiledPolicy) -> Tuple[List[str], List[str]]:
    """(exact names, glob patterns) whose available versions the pins depend on."""
    patterns: List[str] = []
    amd = policy.section("amd")
    if amd and amd.get("pairings"):
        patterns += list(policy.amd_packages)
    kernel = policy.section("kernel")
    if (kernel and kernel.get("allow") is not None) or (amd and any(p.get("kernels") is not None
                                                                    for p in amd.get("pairings") or [])):
        patterns += policy.kernel_packages
        patterns += list(RPM_KERNEL_COMPANIONS)
    nvidia = policy.section("nvidia")
    if nvidia and nvidia.get("pairings"):
        driver_patterns, cuda_patterns = policy.nvidia_packages
        patterns += driver_patterns + cuda_patterns
    for rule in policy.rules("versions"):
        patterns += list(rule.get("packages") or [])
    exact = [p for p in dict.fromkeys(patterns) if p == glob_prefix(p)]
    globs = [p for p in dict.fromkeys(patterns) if p != glob_prefix(p)]
    return exact, globs


def _match_any(name: str, patterns: Sequence[str]) -> bool:
    return any(fnmatch.fnmatchcase(name, p) for p in patterns)


def _name(key: str) -> str:
    """The package name of an installed-set key whose rpm install-only form is ``name@version``."""
    return key.split("@", 1)[0]


def pin_records(policy: CompiledPolicy, installed: Mapping[str, str], available: Mapping[str, Sequence[str]],
                manager: str = "dpkg") -> Tuple[List[Pin], List[Pin]]:
    """(frozen, forbidden) records, for apt preferences and dnf versionlock alike (pure).

    ``installed``: guarded packages and their installed versions (rpm kernels keyed ``name@version``);
    ``available``: versions the repositories offer per name.
    """
    frozen_pins: List[Pin] = []
    forbidden: List[Pin] = []
    frozen = policy.section("frozen") or {}
    for name in sorted(installed):
        if _match_any(_name(name).split(":", 1)[0], frozen.get("packages") or []):
            frozen_pins.append(Pin(_name(name).split(":", 1)[0], installed[name], 1001, "frozen by policy"))
    amd = policy.section("amd") or {}
    pairings = [p for p in amd.get("pairings") or [] if isinstance(p, dict)]
    driver_name, rocm_name = policy.amd_packages
    kernel = policy.section("kernel") or {}
    kernel_patterns = policy.kernel_packages
    nvidia = policy.section("nvidia") or {}
    nv_pairings = [p for p in nvidia.get("pairings") or [] if isinstance(p, dict)]
    installed_builds = {(_name(k), v) for k, v in installed.items()}
    for name in sorted(available):
        for version in available[name]:
            if (name, version) in installed_builds:
                continue  # never pin away what is installed: the hook and rollback handle the installed set
            why = _forbidden_reason(name, version, manager, pairings, driver_name, rocm_name, kernel,
                                    kernel_patterns, nvidia, nv_pairings, policy, installed)
            if why:
                forbidden.append(Pin(name, version, -1, why))
    if manager == "rpm":
        forbidden += _kernel_companions(forbidden, available, installed_builds)
    return frozen_pins, forbidden


# rpm kernels come as several install-only packages of one build: kernel-modules, -modules-core and -modules-extra
# require the kernel-core of their build (``kernel-uname-r``). A forbidden kernel-core alone would leave dnf a new
# kernel-modules it cannot install, and dnf upgrade (best=True) gives up with exit 1.
RPM_KERNEL_COMPANIONS = ("kernel-modules*",)


def _kernel_companions(forbidden: List[Pin], available: Mapping[str, Sequence[str]],
                       installed_builds: set) -> List[Pin]:
    """The companion packages of every forbidden rpm kernel build, at that build, kept out with it."""
    kernels = {p.version: p for p in forbidden if p.package in releases.RPM_KERNEL_NAMES}
    out = []
    for name in sorted(available):
        if not _match_any(name, RPM_KERNEL_COMPANIONS):
            continue
        for version in available[name]:
            if version in kernels and (name, version) not in installed_builds:
                out.append(Pin(name, version, -1, f"goes with {kernels[version].package} {version}: "
                                                  f"{kernels[version].why}"))
    return out


def _forbidden_reason(name: str, version: str, manager: str, pairings: List[dict], driver_name: str,
                      rocm_name: str, kernel: Mapping, kernel_patterns: List[str], nvidia: Mapping,
                      nv_pairings: List[dict], policy: CompiledPolicy, installed: Mapping[str, str]) -> Optional[str]:
    release: Optional[str]
    for package, release_of, key, label in ((driver_name, releases.amdgpu_driver_release, "amdgpu", "driver release"),
                                            (rocm_name, releases.rocm_release, "rocm", "ROCm release")):
        if pairings and name == package:
            release = release_of(version) or "unknown"
            if not any(matches(p.get(key, "any"), release) and (p.get(f"{key}_package") is None or
                                                               matches(p[f"{key}_package"], version, manager))
                       for p in pairings):
                return f"{label} {release} is in no allowed AMD pairing"
    # dpkg names every kernel apart (linux-image-6.1.0-28-amd64); rpm kernels share a name and the installed
    # builds were skipped by the caller, so every other rpm kernel build is a new kernel.
    if _match_any(name, kernel_patterns) and (manager == "rpm" or name not in installed):
        release = releases.kernel_release_of(name, version, manager=manager)
        if release:
            if kernel.get("allow") is not None and not matches(kernel["allow"], release):
                return f"kernel {release} is not on the allowed kernel list"
            driver = installed.get(driver_name)
            rocm = installed.get(rocm_name)
            current = matching_pairing(pairings, driver, rocm, manager) if pairings else None
            if current is not None and current.get("kernels") is not None and not matches(current["kernels"],
                                                                                          release):
                return f"kernel {release} is not supported by the pinned AMD pairing '{current.get('name')}'"
    if nv_pairings:
        if _match_any(name, policy.nvidia_packages[0]):
            release = releases.dotted_release(version)
            if not any(matches(p.get("driver", "any"), release) for p in nv_pairings):
                return f"NVIDIA driver {release} is in no allowed pairing"
        if _match_any(name, policy.nvidia_packages[1]):
            release = releases.dotted_release(version)
            if not any(matches(p.get("cuda", "any"), release) for p in nv_pairings):
                return f"CUDA {release} is in no allowed pairing"
    for index, rule in enumerate(policy.rules("versions")):
        if _match_any(name, list(rule.get("packages") or [])) and not matches(rule.get("allow", "any"), version,
                                                                               manager):
            return f"outside version rule '{rule.get('name') or index}'"
    return None
