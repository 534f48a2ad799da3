"""What the policy pins, package by package: the records behind apt preferences and dnf versionlock alike (pure).

- frozen: every installed build of a frozen package is held (``priority`` 1001);
- forbidden: every available build that no allowed state can contain is kept out (``priority`` -1): a version the
  signed deny list names as known-bad (agent/bundle/deny.py, the compiled policy's ``denied``), a kernel that
  is not allowed, an NVIDIA driver or CUDA release in no pairing, a version outside a version rule; and every build
  of an AMD package the policy judges (the driver, its firmware, ROCm and versioned side-by-side ROCm such as
  ``rocm-core6.4.1``) that the guard would refuse beside the packages installed now. The AMD builds are judged by
  :func:`agent.policy.evaluate.evaluate`, the hook's own judgement, moving that one package alone: the host stays on
  its current pairing and driver build, so a routine ``apt-get upgrade`` / ``dnf upgrade`` never picks a ROCm
  release of another allowed pairing that the hook then refuses. Every other AMD stack package of a forbidden ROCm
  build (the whole release family: TheRock's generic ``amdrocm`` and per-target metas, ``amdrocm-core10.0``, ...)
  is kept out with it, so ``full-upgrade`` neither upgrades nor removes them. A deliberate move to another pairing
  therefore names its versions (``pkg=version`` overrides apt pins; dnf needs the pins removed) and is followed
  by ``gpuguard pin apply`` again.

agent/guard/apt/preferences.py renders them as apt preferences, agent/guard/dnf/versionlock.py as versionlock
entries.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from typing import TYPE_CHECKING, Dict, List, Mapping, Optional, Sequence, Tuple

from agent.policy import releases
from agent.policy.compiled import AMD_STACK_PACKAGES, CompiledPolicy
from agent.policy.evaluate import HostState, evaluate, introduced
from agent.policy.families.amd import matching_pairing
from agent.policy.families.denied import denial, denied_by
from agent.policy.spec import matches

if TYPE_CHECKING:
    from agent.hostfacts.context import HostContext


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


def names_to_query(policy: CompiledPolicy, manager: str = "dpkg") -> Tuple[List[str], List[str]]:
    """(exact names, glob patterns) whose available versions the pins depend on."""
    patterns: List[str] = []
    amd = policy.section("amd")
    if amd and amd.get("pairings"):
        patterns += amd_judged_patterns(policy)
        patterns += list(AMD_STACK_PACKAGES)  # the companions of a forbidden ROCm build (_rocm_companions)
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
    for entry in policy.rules("denied"):
        patterns += list(entry.get("packages") or [])
    exact = [p for p in dict.fromkeys(patterns) if p == glob_prefix(p)]
    globs = [p for p in dict.fromkeys(patterns) if p != glob_prefix(p)]
    return exact, globs


def amd_judged_patterns(policy: CompiledPolicy) -> List[str]:
    """The AMD packages the hook judges: the driver, its firmware (one build with it), ROCm and the versioned
    side-by-side ROCm installs (``rocm-core6.4.1``), as agent.policy.evaluate finds them."""
    driver_name = policy.amd_packages[0]
    return [driver_name, driver_name + "-firmware", *rocm_patterns(policy)]


def rocm_patterns(policy: CompiledPolicy) -> List[str]:
    """The ROCm package and its versioned side-by-side installs (``rocm-core``, ``rocm-core6.4.1``), and TheRock's
    (``amdrocm-base``, ``amdrocm-base7.13``)."""
    return list(releases.rocm_package_patterns(policy.amd_packages[1]))


def _match_any(name: str, patterns: Sequence[str]) -> bool:
    return any(fnmatch.fnmatchcase(name, p) for p in patterns)


def _name(key: str) -> str:
    """The package name of an installed-set key whose rpm install-only form is ``name@version``."""
    return key.split("@", 1)[0]


def pin_records(policy: CompiledPolicy, installed: Mapping[str, str], available: Mapping[str, Sequence[str]],
                manager: str = "dpkg", *, context: Optional[HostContext]) -> Tuple[List[Pin], List[Pin]]:
    """(frozen, forbidden) records, for apt preferences and dnf versionlock alike (pure).

    ``installed``: guarded packages and their installed versions (rpm kernels keyed ``name@version``);
    ``available``: versions the repositories offer per name; ``context``: the host's facts, as the hook reads them
    (``read_host_context(root, facts_used(policy))``), so a build the hook would refuse for this host's OS or GPU
    targets is pinned away too.
    """
    frozen_pins: List[Pin] = []
    forbidden: List[Pin] = []
    frozen = policy.section("frozen") or {}
    for name in sorted(installed):
        if _match_any(_name(name).split(":", 1)[0], frozen.get("packages") or []):
            frozen_pins.append(Pin(_name(name).split(":", 1)[0], installed[name], 1001, "frozen by policy"))
    amd = policy.section("amd") or {}
    pairings = [p for p in amd.get("pairings") or [] if isinstance(p, dict)]
    driver_name = policy.amd_packages[0]
    kernel = policy.section("kernel") or {}
    kernel_patterns = policy.kernel_packages
    nvidia = policy.section("nvidia") or {}
    nv_pairings = [p for p in nvidia.get("pairings") or [] if isinstance(p, dict)]
    amd_judged = amd_judged_patterns(policy) if pairings else []
    installed_builds = {(_name(k), v) for k, v in installed.items()}
    for name in sorted(available):
        for version in available[name]:
            if (name, version) in installed_builds:
                continue  # never pin away what is installed: the hook and rollback handle the installed set
            known_bad = denied_by(policy, name, version, manager)
            why = f"known-bad: {denial(known_bad)}" if known_bad is not None else None
            if why is None and _match_any(name, amd_judged):
                why = refused_beside_installed(policy, installed, name, version, manager, context)
            why = why or _forbidden_reason(name, version, manager, pairings, driver_name, kernel,
                                           kernel_patterns, nvidia, nv_pairings, policy, installed)
            if why:
                forbidden.append(Pin(name, version, -1, why))
    if manager == "rpm":
        forbidden += _kernel_companions(forbidden, available, installed_builds)
    forbidden += _rocm_companions(forbidden, available, installed_builds, amd_judged,
                                  rocm_patterns(policy) if pairings else [])
    return frozen_pins, forbidden


# AMD's ROCm packages of one release build require each other at exactly that build (rocm-hip-runtime requires
# rocm-core = 6.3.0.60300-39.el9) and carry its code and release in their versions (hip-runtime-amd
# 6.3.42131.60300-39.el9). With rocm-core 6.3 excluded alone, a routine dnf upgrade (best=True) exits 1: "cannot
# install the best update candidate for package rocm-hip-runtime". apt's full-upgrade resolves it by removing the
# meta packages whose next build needs the excluded one (TheRock's amdrocm and amdrocm-core-sdk, which own the
# /opt/rocm links): so every package of a forbidden build is kept out with it, on both managers.
def _rocm_build_tail(version: str) -> Optional[str]:
    """``60300-39.el9`` of ``6.3.0.60300-39.el9``: the release code (5 or more digits) and the package release."""
    upstream, dash, release = version.split(":", 1)[-1].rpartition("-")
    code = upstream.rpartition(".")[2]
    return f"{code}-{release}" if dash and code.isdigit() and len(code) >= 5 else None


def _build_key(name: str, version: str) -> Optional[str]:
    """What ties a package to its ROCm build: classic packages share the release code and package release
    (:func:`_rocm_build_tail`); TheRock's amdrocm-* packages of one release share their whole version (``10.0.0-4``,
    every one of them, meta packages included, at exact ``=`` dependencies: the generic ``amdrocm``, the
    per-target ``amdrocm10.0-gfx1201`` and ``amdrocm-gfx94x`` as much as ``amdrocm-core10.0``)."""
    if name.startswith("amdrocm"):
        return "amdrocm:" + version
    return _rocm_build_tail(version)


def _rocm_companions(forbidden: List[Pin], available: Mapping[str, Sequence[str]], installed_builds: set,
                     amd_judged: Sequence[str], rocm: Sequence[str]) -> List[Pin]:
    """The AMD stack packages of every forbidden ROCm build (``rocm``: its package patterns), at that build, kept
    out with it (the judged packages have their own records)."""
    builds: Dict[str, Pin] = {}
    for pin in forbidden:
        tail = _build_key(pin.package, pin.version) if _match_any(pin.package, rocm) else None
        if tail:
            builds.setdefault(tail, pin)
    out = []
    for name in sorted(available):
        if not _match_any(name, AMD_STACK_PACKAGES) or _match_any(name, amd_judged):
            continue
        for version in available[name]:
            rocm_pin = builds.get(_build_key(name, version) or "")
            if rocm_pin is not None and (name, version) not in installed_builds:
                out.append(Pin(name, version, -1, f"goes with {rocm_pin.package} {rocm_pin.version}: {rocm_pin.why}"))
    return out


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


AFTER_A_MOVE = "after a deliberate move of the AMD stack, run gpuguard pin apply again"


def with_build(installed: Mapping[str, str], name: str, version: str) -> Dict[str, str]:
    """The installed set with ``name`` moved to ``version`` (installed beside the others when it is not installed,
    or when its builds are install-only ``name@version`` keys)."""
    after = dict(installed)
    keys = sorted((k for k in installed if _name(k).split(":", 1)[0] == name), key=lambda k: (":" in k, k))
    if not keys:
        after[name] = version
    elif "@" in keys[0]:
        after[f"{name}@{version}"] = version
    else:
        after[keys[0]] = version
    return after


def refused_beside_installed(policy: CompiledPolicy, installed: Mapping[str, str], name: str, version: str,
                             manager: str, context: Optional[HostContext]) -> Optional[str]:
    """Why the policy's judgement (the hook's) rejects ``name`` at ``version`` with everything else as installed
    now, or None when that move alone is allowed. Every violation counts, whatever its action, as for the other
    forbidden builds: a pin keeps out what the policy does not allow, a ``warn`` only decides what the hook does."""
    state = HostState(before=installed, after=with_build(installed, name, version), manager=manager,
                      context=context)
    violations = introduced(evaluate(state, policy), state)
    if not violations:
        return None
    return "; ".join(f"{v.rule}: {v.message}" for v in violations) + f"; {AFTER_A_MOVE}"


def _forbidden_reason(name: str, version: str, manager: str, pairings: List[dict], driver_name: str,
                      kernel: Mapping, kernel_patterns: List[str], nvidia: Mapping,
                      nv_pairings: List[dict], policy: CompiledPolicy, installed: Mapping[str, str]) -> Optional[str]:
    release: Optional[str]
    # dpkg names every kernel apart (linux-image-6.1.0-28-amd64); rpm kernels share a name and the installed
    # builds were skipped by the caller, so every other rpm kernel build is a new kernel.
    if _match_any(name, kernel_patterns) and (manager == "rpm" or name not in installed):
        release = releases.kernel_release_of(name, version, manager=manager)
        if release:
            if kernel.get("allow") is not None and not matches(kernel["allow"], release):
                return f"kernel {release} is not on the allowed kernel list"
            driver = installed.get(driver_name)
            rocm = installed.get(policy.amd_packages[1])
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


@dataclass(frozen=True)
class PinFileChanges:
    """What ``pin apply`` did to one pins file (host path: dnf's versionlock list, zypper's locks): gpuguard's
    entries added and removed, how many stayed, the file's new text, whether it changed, and a note for people."""

    path: str
    added: List[str]
    removed: List[str]
    unchanged: int
    text: str
    changed: bool
    note: Optional[str] = None

