"""Render the policy as apt preferences: defence in depth for tools that skip the hook.

``gpuguard pin apply`` writes ``/etc/apt/preferences.d/gpuguard-*.pref``:

- ``gpuguard-frozen.pref``: ``Pin-Priority: 1001`` on the installed version of every frozen package. apt keeps
  it as the candidate, and ``apt-get --allow-downgrades full-upgrade`` even brings it back.
- ``gpuguard-forbidden.pref``: ``Pin-Priority: -1`` on every available version that no allowed state can contain
  (a driver or ROCm release in no pairing, a kernel that is not allowed, a version outside a version rule). apt
  never picks such a version as a candidate.

Both are soft guards: an explicit ``apt-get install pkg=version`` overrides them (the hook still refuses it), and
the first specific record matching a version wins. Only files that start with the gpuguard header are ever
rewritten or removed. Versions are listed exactly (from ``apt-cache madison``), so rerun it after ``apt update``.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from agent.policy import releases
from agent.policy.compiled import DEFAULT_CUDA_PACKAGES, DEFAULT_KERNEL_PACKAGES, DEFAULT_NVIDIA_DRIVER_PACKAGES
from agent.policy.compiled import CompiledPolicy
from agent.policy.spec import matches

HEADER = "# Managed by gpuguard (gpuguard pin apply): edits are overwritten; remove the policy rule instead."
FILE_PREFIX = "gpuguard-"
FILE_SUFFIX = ".pref"


@dataclass(frozen=True)
class Pin:
    """One apt preferences record."""

    package: str
    version: str
    priority: int
    why: str

    def render(self) -> str:
        return (f"Explanation: gpuguard: {self.why}\nPackage: {self.package}\nPin: version {self.version}\n"
                f"Pin-Priority: {self.priority}\n")


def _glob_prefix(pattern: str) -> str:
    for i, ch in enumerate(pattern):
        if ch in "*?[":
            return pattern[:i]
    return pattern


def names_to_query(policy: CompiledPolicy) -> Tuple[List[str], List[str]]:
    """(exact names, glob patterns) whose available versions the pins depend on."""
    patterns: List[str] = []
    amd = policy.section("amd")
    if amd and amd.get("pairings"):
        patterns += [amd.get("driver_package") or "amdgpu-dkms", amd.get("rocm_package") or "rocm-core"]
    kernel = policy.section("kernel")
    if (kernel and kernel.get("allow") is not None) or (amd and any(p.get("kernels") is not None
                                                                    for p in amd.get("pairings") or [])):
        patterns += list((kernel or {}).get("packages") or DEFAULT_KERNEL_PACKAGES)
    nvidia = policy.section("nvidia")
    if nvidia and nvidia.get("pairings"):
        patterns += list(nvidia.get("driver_packages") or DEFAULT_NVIDIA_DRIVER_PACKAGES)
        patterns += list(nvidia.get("cuda_packages") or DEFAULT_CUDA_PACKAGES)
    for rule in policy.rules("versions"):
        patterns += list(rule.get("packages") or [])
    exact = [p for p in dict.fromkeys(patterns) if p == _glob_prefix(p)]
    globs = [p for p in dict.fromkeys(patterns) if p != _glob_prefix(p)]
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
    driver_name = amd.get("driver_package") or "amdgpu-dkms"
    rocm_name = amd.get("rocm_package") or "rocm-core"
    kernel = policy.section("kernel") or {}
    kernel_patterns = list(kernel.get("packages") or DEFAULT_KERNEL_PACKAGES)
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
    return frozen_pins, forbidden


def render_pins(policy: CompiledPolicy, installed: Mapping[str, str], available: Mapping[str, Sequence[str]],
                manager: str = "dpkg") -> Dict[str, str]:
    """File name -> content for every gpuguard preferences file (pure).

    ``installed``: guarded packages and their installed versions; ``available``: versions the indexes offer.
    """
    frozen_pins, forbidden = pin_records(policy, installed, available, manager)
    files = {}
    stamp = f"# policy '{policy.name}' ({', '.join(policy.sources) or policy.path})\n"
    if frozen_pins:
        files[f"{FILE_PREFIX}frozen{FILE_SUFFIX}"] = HEADER + "\n" + stamp + "\n" + "\n".join(
            p.render() for p in frozen_pins)
    if forbidden:
        files[f"{FILE_PREFIX}forbidden{FILE_SUFFIX}"] = HEADER + "\n" + stamp + "\n" + "\n".join(
            p.render() for p in forbidden)
    return files


def _forbidden_reason(name: str, version: str, manager: str, pairings: List[dict], driver_name: str,
                      rocm_name: str, kernel: Mapping, kernel_patterns: List[str], nvidia: Mapping,
                      nv_pairings: List[dict], policy: CompiledPolicy, installed: Mapping[str, str]) -> Optional[str]:
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
            from agent.policy.evaluate import matching_pairing

            current = matching_pairing(pairings, driver, rocm, manager) if pairings else None
            if current is not None and current.get("kernels") is not None and not matches(current["kernels"],
                                                                                          release):
                return f"kernel {release} is not supported by the pinned AMD pairing '{current.get('name')}'"
    if nv_pairings:
        if _match_any(name, list(nvidia.get("driver_packages") or DEFAULT_NVIDIA_DRIVER_PACKAGES)):
            release = releases.dotted_release(version)
            if not any(matches(p.get("driver", "any"), release) for p in nv_pairings):
                return f"NVIDIA driver {release} is in no allowed pairing"
        if _match_any(name, list(nvidia.get("cuda_packages") or DEFAULT_CUDA_PACKAGES)):
            release = releases.dotted_release(version)
            if not any(matches(p.get("cuda", "any"), release) for p in nv_pairings):
                return f"CUDA {release} is in no allowed pairing"
    for index, rule in enumerate(policy.rules("versions")):
        if _match_any(name, list(rule.get("packages") or [])) and not matches(rule.get("allow", "any"), version,
                                                                               manager):
            return f"outside version rule '{rule.get('name') or index}'"
    return None


@dataclass(frozen=True)
class PinChanges:
    """What ``apply_pins`` wrote, removed and left alone."""

    written: List[str]
    unchanged: List[str]
    removed: List[str]
    foreign: List[str]  # gpuguard-*.pref files without our header: never touched


def plan_pin_files(existing: Mapping[str, str], wanted: Mapping[str, str]) -> PinChanges:
    """Compare the gpuguard-*.pref files in preferences.d (name -> content) with the wanted set (pure)."""
    written, unchanged, removed, foreign = [], [], [], []
    for name, content in sorted(wanted.items()):
        if name in existing and not existing[name].startswith(HEADER):
            foreign.append(name)
        elif existing.get(name) == content:
            unchanged.append(name)
        else:
            written.append(name)
    for name, content in sorted(existing.items()):
        if name in wanted or not (name.startswith(FILE_PREFIX) and name.endswith(FILE_SUFFIX)):
            continue
        if content.startswith(HEADER):
            removed.append(name)
        elif name not in foreign:
            foreign.append(name)
    return PinChanges(written, unchanged, removed, foreign)


def apply_pins(host, policy: CompiledPolicy, preferences_dir: str, tool, installed: Mapping[str, str],
               dry_run: bool = False) -> Tuple[PinChanges, Dict[str, str]]:
    """Query available versions, render, and write/remove gpuguard's own preferences files."""
    from agent.files import write_atomically

    exact, globs = names_to_query(policy)
    names = list(exact)
    for pattern in globs:
        names += [n for n in tool.package_names(_glob_prefix(pattern)) if fnmatch.fnmatchcase(n, pattern)]
    available = tool.available_versions(sorted(set(names)))
    wanted = render_pins(policy, installed, available)
    existing = {}
    for name in host.list_dir(preferences_dir):
        if name.startswith(FILE_PREFIX):
            existing[name] = host.read_text(f"{preferences_dir}/{name}") or ""
    changes = plan_pin_files(existing, wanted)
    if not dry_run:
        for name in changes.written:
            write_atomically(str(host.path(f"{preferences_dir}/{name}")), wanted[name])
        for name in changes.removed:
            host.path(f"{preferences_dir}/{name}").unlink()
    return changes, wanted
