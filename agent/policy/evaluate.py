"""Evaluate a package state change against a compiled policy: pure, standard library only.

Input: the installed set before and after a change (a transaction, or what dpkg did behind apt's back), plus the
host's context (agent/hostfacts/context.py: OS, GPU targets, loaded GPU modules), of which each caller reads the
facts :func:`facts_used` names. Output: every violation with its rule, the packages involved, a message that names the
pinned pairing being broken, the action the policy attaches to it and a hint on how to proceed. The apt hook,
the dnf plugin, ``gpuguard policy explain`` and the rollback watcher all call :func:`evaluate`.
"""

from __future__ import annotations

from agent.defaults import THEROCK_BASE_PACKAGE
from agent.hostfacts.package_keys import package_name
from agent.policy import releases
from agent.policy.compiled import DEFAULT_NVIDIA_DRIVER_PACKAGES, NVIDIA_NOT_DRIVER_PARTS, CompiledPolicy
from agent.policy.globs import any_glob
from agent.policy.spec import describe, matches
from agent.records import Record

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs milliseconds of the apt hook's start-up budget
    from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Set, Tuple

    from agent.hostfacts.context import HostContext

OVERRIDE_HINT = 'or open an audited maintenance window: gpuguard override start --minutes 60 --reason "..."'


class HostState(Record):
    """The installed packages before and after a change (mappings keyed ``name``, ``name:arch`` for foreign
    arches), the version scheme (``dpkg`` or ``rpm``) and the host's context: the OS and GPU targets AMD's matrix
    is checked against, and the loaded GPU kernel modules (a driver that no package carries, the .run installer or
    a VM or container host's driver, is judged by the module that is running). Every caller reads the context with
    ``read_host_context(root, facts_used(policy))``; None when the policy's rules read no host fact (the apt hook
    then imports no part of agent.hostfacts.context).

    Records rather than dataclasses: this module is on the apt hook's start-up path.
    """

    __slots__ = ("before", "after", "manager", "context")
    before: Mapping[str, str]
    after: Mapping[str, str]
    manager: str
    context: Optional[HostContext]

    def __init__(self, before: Mapping[str, str], after: Mapping[str, str], manager: str = "dpkg",
                 context: Optional[HostContext] = None) -> None:
        Record.__init__(self, before, after, manager, context)

    @classmethod
    def standing(cls, installed: Mapping[str, str], manager: str = "dpkg",
                 context: Optional[HostContext] = None) -> "HostState":
        """An installed set judged as it stands (before and after the same): what violates the policy already."""
        return cls(dict(installed), dict(installed), manager, context)

    def changed(self) -> Set[str]:
        """Package keys whose version differs between before and after (installed, removed or moved)."""
        keys = set(self.before) | set(self.after)
        return {k for k in keys if self.before.get(k) != self.after.get(k)}


class Violation(Record):
    """One broken rule: its name, action, message, the packages involved (name -> version or move), a hint on how
    to proceed and the pinned pairing it breaks (if any)."""

    __slots__ = ("rule", "action", "message", "packages", "hint", "pairing")
    rule: str
    action: str
    message: str
    packages: Mapping[str, str]
    hint: str
    pairing: Optional[str]

    def __init__(self, rule: str, action: str, message: str, packages: Optional[Mapping[str, str]] = None,
                 hint: str = "", pairing: Optional[str] = None) -> None:
        Record.__init__(self, rule, action, message, {} if packages is None else packages, hint, pairing)

    def touches(self, keys: Iterable[str]) -> bool:
        """Whether any of the given package keys is involved in this violation."""
        return self.touches_names({k.split(":", 1)[0] for k in keys})

    def touches_names(self, bases: Set[str]) -> bool:
        """Whether any package involved has one of these names (keys without ``:arch``)."""
        return any(p.split(":", 1)[0] in bases for p in self.packages)

    def to_dict(self) -> Dict[str, Any]:
        return {"rule": self.rule, "action": self.action, "message": self.message, "packages": dict(self.packages),
                "hint": self.hint, "pairing": self.pairing}


class _Index:
    """One installed set's keys with their package names, sorted, and ``{package name: version}`` of the first key
    of each name (as a scan in key order would find it)."""

    __slots__ = ("named_keys", "by_base")

    def __init__(self, mapping: Mapping[str, str]) -> None:
        self.named_keys = sorted((key, package_name(key)) for key in mapping)
        self.by_base: Dict[str, str] = {}
        for key, version in mapping.items():
            self.by_base.setdefault(package_name(key), version)


# One index per installed set, kept only while evaluate() runs (the sets do not change during one evaluation):
# _find is called per violation, and a scan of the whole set each time made a 10,000-violation transaction
# quadratic (27 s in the hook); _matching runs once per rule over the same sets.
_INDEXES: List[Tuple[Mapping[str, str], _Index]] = []


def _index(mapping: Mapping[str, str]) -> _Index:
    for cached, index in _INDEXES:
        if cached is mapping:
            return index
    return _Index(mapping)


def _by_base(mapping: Mapping[str, str]) -> Dict[str, str]:
    return _index(mapping).by_base


def _find(mapping: Mapping[str, str], name: str) -> Optional[str]:
    if name in mapping:
        return mapping[name]
    return _by_base(mapping).get(name)


_GLOBS: Dict[Tuple[str, ...], Callable[[str], bool]] = {}


def _matching(mapping: Mapping[str, str], patterns: Sequence[str]) -> List[str]:
    key = tuple(patterns)
    match = _GLOBS.get(key)
    if match is None:
        if len(_GLOBS) > 64:
            _GLOBS.clear()
        match = _GLOBS[key] = any_glob(key)
    return [k for k, name in _index(mapping).named_keys if match(name)]


def _move(state: HostState, name: str) -> str:
    old, new = _find(state.before, name), _find(state.after, name)
    if old == new:
        return old or "(absent)"
    return f"{old or '(not installed)'} -> {new or '(removed)'}"


def _kernels(mapping: Mapping[str, str], patterns: Sequence[str], manager: str) -> Dict[str, str]:
    """Kernel release -> package key, for kernel image packages in an installed set."""
    out: Dict[str, str] = {}
    for key in _matching(mapping, patterns):
        release = releases.kernel_release_of(key, mapping[key], manager=manager)
        if release:
            out[release] = key
    return out


def facts_used(policy: CompiledPolicy) -> Tuple[str, ...]:
    """The host facts :func:`evaluate` reads under ``policy`` (names from agent.hostfacts.context): the OS and
    GPU targets for AMD's matrix, the loaded nvidia module for the NVIDIA rules; none for the rest."""
    matrix, nvidia, companions = policy.section("matrix"), policy.section("nvidia"), policy.section("companions")
    fabricmanager = bool(companions and companions.get("fabricmanager"))
    amdsmi = bool(companions and companions.get("amdsmi"))
    if not matrix and not nvidia and not fabricmanager and not amdsmi:
        return ()  # the apt hook's common case: the context module is not even imported
    from agent.hostfacts.context import AMDSMI_BINDING, GPU_TARGETS, NVIDIA_MODULE, OS_RELEASE

    return (((OS_RELEASE, GPU_TARGETS) if matrix else ()) + ((NVIDIA_MODULE,) if nvidia or fabricmanager else ())
            + ((AMDSMI_BINDING,) if amdsmi else ()))


def evaluate(state: HostState, policy: CompiledPolicy) -> List[Violation]:
    """Every violation of ``policy`` in the state after the change (old ones included; see ``touches``)."""
    _INDEXES[:] = [(state.before, _Index(state.before)), (state.after, _Index(state.after))]
    try:
        out: List[Violation] = []
        out += _check_frozen(state, policy)
        out += _check_amd(state, policy)
        out += _check_kernel_allow(state, policy)
        out += _check_nvidia(state, policy)
        out += _check_versions(state, policy)
        out += _check_matrix(state, policy)
        out += _check_companions(state, policy)
        return out
    finally:
        _INDEXES.clear()


def introduced(violations: Sequence[Violation], state: HostState) -> List[Violation]:
    """The violations this change is involved in (the others were there before it)."""
    bases = {k.split(":", 1)[0] for k in state.changed()}  # once, not once per violation
    return [v for v in violations if v.touches_names(bases)]


# --- frozen packages -------------------------------------------------------------------------------------------


def _check_frozen(state: HostState, policy: CompiledPolicy) -> List[Violation]:
    section = policy.section("frozen")
    if not section or not section.get("packages"):
        return []
    patterns = list(section["packages"])
    out = []
    for key in sorted(set(_matching(state.before, patterns)) | set(_matching(state.after, patterns))):
        old, new = state.before.get(key), state.after.get(key)
        if old == new:
            continue
        out.append(Violation(
            rule="frozen", action=policy.action_for(section.get("action")),
            message=f"{package_name(key)} is frozen by policy '{policy.name}' and must not move "
                    f"({old or '(not installed)'} -> {new or '(removed)'})",
            packages={key: f"{old or '(not installed)'} -> {new or '(removed)'}"},
            hint=f"keep {package_name(key)} at {old or 'its current state'}, remove it from [frozen] packages, "
                 + OVERRIDE_HINT))
    return out


# --- AMD driver x ROCm pairings --------------------------------------------------------------------------------


def _pairing_matches(pairing: Mapping[str, Any], driver_version: Optional[str], rocm_version: Optional[str],
                     scheme: str) -> bool:
    driver_release = releases.amdgpu_driver_release(driver_version) if driver_version else None
    rocm_rel = releases.rocm_release(rocm_version) if rocm_version else None
    if driver_version is not None and driver_release is None:
        driver_release = "unknown"
    if rocm_version is not None and rocm_rel is None:
        rocm_rel = "unknown"
    if not matches(pairing.get("amdgpu", "any"), driver_release):
        return False
    if not matches(pairing.get("rocm", "any"), rocm_rel):
        return False
    if pairing.get("amdgpu_package") is not None and not matches(pairing["amdgpu_package"], driver_version, scheme):
        return False
    if pairing.get("rocm_package") is not None and not matches(pairing["rocm_package"], rocm_version, scheme):
        return False
    return True


def describe_pairing(pairing: Mapping[str, Any]) -> str:
    """``'rocm-6.2' (amdgpu 6.2.* + ROCm 6.2.*)`` for messages."""
    parts = [f"amdgpu {describe(pairing.get('amdgpu', 'any'))}", f"ROCm {describe(pairing.get('rocm', 'any'))}"]
    if pairing.get("amdgpu_package") is not None:
        parts.append(f"amdgpu package {describe(pairing['amdgpu_package'])}")
    if pairing.get("rocm_package") is not None:
        parts.append(f"rocm package {describe(pairing['rocm_package'])}")
    return f"'{pairing.get('name', '?')}' ({' + '.join(parts)})"


def matching_pairing(pairings: Sequence[Mapping[str, Any]], driver_version: Optional[str],
                     rocm_version: Optional[str], scheme: str) -> Optional[Mapping[str, Any]]:
    """The first pairing that accepts this driver/ROCm combination, or None."""
    for pairing in pairings:
        if _pairing_matches(pairing, driver_version, rocm_version, scheme):
            return pairing
    return None


def _label(name: str, version: Optional[str], release: Optional[str], what: str) -> str:
    if version is None:
        return f"no {name}"
    return f"{name} {version} ({what} {release or 'unknown'})"


def _rocm_versions(mapping: Mapping[str, str], rocm_name: str) -> Dict[str, str]:
    """Every ROCm release present, key -> version: the ROCm package and its versioned side-by-side installs
    (``rocm-core6.4.1``, which ``apt install rocm6.4.1`` brings for AMD's multi-version installs), and TheRock's
    base package with its versioned installs (``amdrocm-base7.13``, ``amdrocm-base10.0``): a host with a classic
    stack and a TheRock release is judged by both."""
    return {k: mapping[k] for k in _matching(mapping, releases.rocm_package_patterns(rocm_name))}


def _release_suffix(name: str) -> Optional[str]:
    """The release a versioned TheRock name ends in (``amdrocm-runtime7.13`` -> ``7.13``), else None."""
    i = len(name)
    while i > 0 and (name[i - 1].isdigit() or name[i - 1] == "."):
        i -= 1
    tail = name[i:]
    return tail if "." in tail and tail[0].isdigit() and tail[-1].isdigit() else None


def _therock_base_removed(state: HostState, policy: CompiledPolicy, amd: Mapping[str, Any],
                          pairing: Optional[Mapping[str, Any]]) -> List[Violation]:
    """A TheRock base package (``amdrocm-base7.13``, the release's version component) removed while packages of its
    release stay (``dpkg --remove --force-depends``): the release is left without its version, unjudged."""
    base = THEROCK_BASE_PACKAGE
    out: List[Violation] = []
    for key in _matching(state.before, [base + "[0-9]*"]):
        if key in state.after:
            continue
        release = package_name(key)[len(base):]
        left = [k for k in _matching(state.after, ["amdrocm-*"]) if _release_suffix(package_name(k)) == release]
        if not left:
            continue
        out.append(Violation(
            rule="amd.rocm_base_removed", action=policy.action_for((pairing or {}).get("action"), amd.get("action")),
            message=f"removing {package_name(key)} {state.before[key]} leaves TheRock ROCm {release} without its base "
                    f"package (still installed: {', '.join(package_name(k) for k in left[:3])}"
                    + (f" and {len(left) - 3} more" if len(left) > 3 else "") + ")",
            packages={key: _move(state, key)},
            hint=f"remove the whole ROCm {release} release or none of it, " + OVERRIDE_HINT,
            pairing=(pairing or {}).get("name")))
    return out


def _pairing_for_all(pairings: Sequence[Mapping[str, Any]], driver: Optional[str], rocms: Mapping[str, str],
                     scheme: str) -> Optional[Mapping[str, Any]]:
    """The first pairing that accepts the driver with every ROCm release present, or None."""
    versions: List[Optional[str]] = [*rocms.values()] or [None]
    for pairing in pairings:
        if all(_pairing_matches(pairing, driver, v, scheme) for v in versions):
            return pairing
    return None


def _check_amd(state: HostState, policy: CompiledPolicy) -> List[Violation]:
    amd = policy.section("amd")
    if not amd:
        return []
    pairings = [p for p in amd.get("pairings") or [] if isinstance(p, dict)]
    driver_name, rocm_name = policy.amd_packages
    driver_after, driver_before = _find(state.after, driver_name), _find(state.before, driver_name)
    rocms_after, rocms_before = _rocm_versions(state.after, rocm_name), _rocm_versions(state.before, rocm_name)
    if not pairings or (driver_after is None and not rocms_after and driver_before is None and not rocms_before):
        return []  # no AMD stack before or after: nothing to judge (removing the last of it is judged)
    scheme = state.manager
    pinned = _pairing_for_all(pairings, driver_before, rocms_before, scheme)
    now = _pairing_for_all(pairings, driver_after, rocms_after, scheme)
    packages = {n: _move(state, n) for n in sorted({driver_name, *rocms_after, *rocms_before})
                if _find(state.after, n) is not None or _find(state.before, n) is not None}
    out: List[Violation] = []
    out += _therock_base_removed(state, policy, amd, pinned or now)
    firmware = _find(state.after, driver_name + "-firmware")
    if driver_after is not None and firmware is not None and not releases.amdgpu_same_build(driver_after, firmware):
        out.append(Violation(
            rule="amd.driver_parts", action=policy.action_for((now or pinned or {}).get("action"), amd.get("action")),
            message=f"{driver_name} {driver_after} and {driver_name}-firmware {firmware} are not one build",
            packages={n: _move(state, n) for n in (driver_name, driver_name + "-firmware")},
            hint=f"move {driver_name} and its firmware together, " + OVERRIDE_HINT))
    if now is None:
        rocm_text = " and ".join(_label(package_name(k), v, releases.rocm_release(v), "ROCm")
                                 for k, v in sorted(rocms_after.items())) or f"no {rocm_name}"
        combo = (f"{_label(driver_name, driver_after, releases.amdgpu_driver_release(driver_after), 'driver')} "
                 f"with {rocm_text}")
        allowed = "; ".join(describe_pairing(p) for p in pairings)
        if pinned is not None:
            message = f"breaks the pinned AMD pairing {describe_pairing(pinned)}: {combo} matches no allowed pairing"
        else:
            message = f"{combo} matches no allowed AMD pairing"
        out.append(Violation(
            rule="amd.pairing", action=policy.action_for((pinned or {}).get("action"), amd.get("action")),
            message=f"{message} (allowed: {allowed})", packages=packages,
            hint=f"move {driver_name} and {rocm_name} (or TheRock's amdrocm-base<release>) together to an allowed "
                 f"pairing, change the policy, " + OVERRIDE_HINT,
            pairing=(pinned or {}).get("name")))
        return out
    rocm_series = {releases.series(releases.rocm_release(v)) for v in rocms_after.values()}
    if len(rocm_series) > 1 and not amd.get("side_by_side"):
        out.append(Violation(
            rule="amd.rocm_side_by_side", action=policy.action_for(now.get("action"), amd.get("action")),
            message="ROCm " + ", ".join(f"{releases.rocm_release(v)} ({package_name(k)})" for k, v in sorted(
                rocms_after.items())) + f": {len(rocm_series)} ROCm releases side by side, and policy "
                f"'{policy.name}' does not allow that ([amd] side_by_side = false)",
            packages={k: _move(state, k) for k in rocms_after},
            hint="keep one ROCm release, set side_by_side = true in [amd], " + OVERRIDE_HINT,
            pairing=now.get("name")))
    kernels_spec = now.get("kernels")
    if kernels_spec is None:
        return out
    kernel_patterns = policy.kernel_packages
    kernels_before = _kernels(state.before, kernel_patterns, state.manager)
    kernels_after = _kernels(state.after, kernel_patterns, state.manager)
    driver_moved = driver_before != driver_after
    # DKMS builds the module for every installed kernel: a new driver must suit them all, a new kernel must suit
    # the driver that stays.
    to_check = kernels_after if driver_moved else {r: k for r, k in kernels_after.items() if r not in kernels_before}
    pinned_text, supported = describe_pairing(now), describe(kernels_spec)  # once, not once per kernel
    for release, key in sorted(to_check.items()):
        if matches(kernels_spec, release):
            continue
        involved = {key: _move(state, key)}
        if driver_moved:
            involved[driver_name] = _move(state, driver_name)
        out.append(Violation(
            rule="amd.pairing.kernels",
            action=policy.action_for(now.get("action"), amd.get("action")),
            message=f"kernel {release} ({package_name(key)}) is not supported by the pinned AMD pairing "
                    f"{pinned_text} with {driver_name} {driver_after}: supported kernels are {supported}",
            packages=involved,
            hint=f"stay on a supported kernel, add {release} to the pairing's kernels once the driver is known to "
                 f"build for it, " + OVERRIDE_HINT,
            pairing=now.get("name")))
    return out


# --- kernel allow list -----------------------------------------------------------------------------------------


def _check_kernel_allow(state: HostState, policy: CompiledPolicy) -> List[Violation]:
    section = policy.section("kernel")
    if not section or section.get("allow") is None:
        return []
    patterns = policy.kernel_packages
    before = _kernels(state.before, patterns, state.manager)
    after = _kernels(state.after, patterns, state.manager)
    out = []
    allowed = describe(section["allow"])
    for release, key in sorted(after.items()):
        if release in before or matches(section["allow"], release):
            continue
        out.append(Violation(
            rule="kernel.allow", action=policy.action_for(section.get("action")),
            message=f"kernel {release} ({package_name(key)} {state.after[key]}) is not on the allowed kernel list "
                    f"({allowed})",
            packages={key: _move(state, key)},
            hint="hold the kernel (and its meta package) back, add the kernel to [kernel] allow once the GPU driver "
                 "builds for it, " + OVERRIDE_HINT))
    return out


# --- NVIDIA driver x CUDA pairings -----------------------------------------------------------------------------

MODULE_KEY = "loaded nvidia module, no driver package"


def _name_series(name: str) -> Optional[str]:
    """The CUDA release a versioned package name carries (``cuda-toolkit-13-0`` -> ``13.0``), else None."""
    head, _, minor = name.rpartition("-")
    major = head.rpartition("-")[2]
    if minor.isdecimal() and major.isdecimal():
        return f"{major}.{minor}"
    return None


def _nvidia_parts(mapping: Mapping[str, str], patterns: Sequence[str]) -> Dict[str, str]:
    """Every installed NVIDIA driver part (key -> driver release, ``unknown`` when the version carries none)."""
    return {k: releases.dotted_release(mapping[k]) or "unknown" for k in _matching(mapping, patterns)
            if package_name(k) not in NVIDIA_NOT_DRIVER_PARTS}


def _cuda_releases(mapping: Mapping[str, str], patterns: Sequence[str]) -> Dict[str, str]:
    """Every installed CUDA package (key -> CUDA release). A package whose version is not of the CUDA major its
    name carries (``cuda-compat-13-0`` is versioned after the driver, ``580.95.05``) is not judged by it."""
    out: Dict[str, str] = {}
    for key in _matching(mapping, patterns):
        release = releases.dotted_release(mapping[key]) or "unknown"
        named = _name_series(package_name(key))
        if named is not None and releases.series(release, 1) != releases.series(named, 1):
            continue
        out[key] = release
    return out


def _grouped(found: Mapping[str, str]) -> str:
    """``580.95.05 (nvidia-driver-580-open, libnvidia-compute-580 and 3 more), 580.105.08 (...)`` for messages."""
    by_release: Dict[str, List[str]] = {}
    for key, release in sorted(found.items()):
        by_release.setdefault(release, []).append(key)
    parts = []
    for release, keys in sorted(by_release.items()):
        shown = ", ".join(keys[:3]) + (f" and {len(keys) - 3} more" if len(keys) > 3 else "")
        parts.append(f"{release} ({shown})")
    return ", ".join(parts) or "none (-)"


def _check_nvidia(state: HostState, policy: CompiledPolicy) -> List[Violation]:
    """Every driver part and every CUDA release present is judged: the parts must be one build, a removed part
    must not leave the rest of its build behind, one pairing must accept all of it, and several CUDA releases side
    by side need ``side_by_side``."""
    section = policy.section("nvidia")
    if not section:
        return []
    pairings = [p for p in section.get("pairings") or [] if isinstance(p, dict)]
    if not pairings:
        return []
    driver_patterns, cuda_patterns = policy.nvidia_packages
    module = state.context.loaded("nvidia") if state.context else None
    parts, parts_before = _nvidia_parts(state.after, driver_patterns), _nvidia_parts(state.before, driver_patterns)
    cuda, cuda_before = _cuda_releases(state.after, cuda_patterns), _cuda_releases(state.before, cuda_patterns)
    out = _nvidia_parts_agree(state, policy, section, parts, parts_before)
    if not parts and module:
        parts = {MODULE_KEY: module}  # no driver package: the running module is the driver
    if not parts_before and module:
        parts_before = {MODULE_KEY: module}
    if not parts and not cuda:
        return out

    def accepts(p: Mapping[str, Any], drivers: Iterable[Optional[str]], cudas: Iterable[Optional[str]]) -> bool:
        return all(matches(p.get("driver", "any"), d) for d in drivers) and \
            all(matches(p.get("cuda", "any"), c) for c in cudas)

    drivers: Set[Optional[str]] = set(parts.values()) or {None}
    cudas: Set[Optional[str]] = set(cuda.values()) or {None}
    action = section.get("action")
    if not any(accepts(p, drivers, cudas) for p in pairings):
        drivers_before: Set[Optional[str]] = set(parts_before.values()) or {None}
        cudas_before: Set[Optional[str]] = set(cuda_before.values()) or {None}
        pinned = next((p for p in pairings if accepts(p, drivers_before, cudas_before)), None)
        if pinned is not None:
            offending = [k for k, r in parts.items() if not matches(pinned.get("driver", "any"), r)]
            offending += [k for k, r in cuda.items() if not matches(pinned.get("cuda", "any"), r)]
            if not parts and not matches(pinned.get("driver", "any"), None):
                offending += list(parts_before)  # the driver went away under CUDA
            if not cuda and not matches(pinned.get("cuda", "any"), None):
                offending += list(cuda_before)
        else:
            offending = list(parts) + list(cuda)
        allowed = "; ".join(f"'{p.get('name', '?')}' (driver {describe(p.get('driver', 'any'))} + CUDA "
                            f"{describe(p.get('cuda', 'any'))})" for p in pairings)
        lead = f"breaks the pinned NVIDIA pairing '{pinned.get('name', '?')}': " if pinned else ""
        out.append(Violation(
            rule="nvidia.pairing", action=policy.action_for((pinned or {}).get("action"), action),
            message=f"{lead}NVIDIA driver {_grouped(parts)} with CUDA {_grouped(cuda)} matches no allowed NVIDIA "
                    f"pairing (allowed: {allowed})",
            packages={k: _move(state, k) for k in dict.fromkeys(offending) if k != MODULE_KEY},
            hint="move the driver and CUDA packages together to an allowed pairing, change the policy, "
                 + OVERRIDE_HINT,
            pairing=(pinned or {}).get("name")))
        return out
    series = {releases.series(r) for r in cuda.values()}
    if len(series) > 1 and not section.get("side_by_side"):
        out.append(Violation(
            rule="nvidia.cuda_side_by_side", action=policy.action_for(action),
            message=f"CUDA {_grouped(cuda)}: {len(series)} CUDA releases side by side, and policy "
                    f"'{policy.name}' does not allow that ([nvidia] side_by_side = false)",
            packages={k: _move(state, k) for k in cuda},
            hint="keep one CUDA release, set side_by_side = true in [nvidia], " + OVERRIDE_HINT))
    return out


def _nvidia_parts_agree(state: HostState, policy: CompiledPolicy, section: Mapping[str, Any],
                        parts: Mapping[str, str], parts_before: Mapping[str, str]) -> List[Violation]:
    """The driver's parts are one build (a library ahead of the kernel module is NVML's "Driver/library version
    mismatch"), and no part is removed while the rest of its build stays (with nothing installed in its place)."""
    out: List[Violation] = []
    action = policy.action_for(section.get("action"))
    if len(set(parts.values())) > 1:
        out.append(Violation(
            rule="nvidia.driver_parts", action=action,
            message=f"the NVIDIA driver's parts are not one build: {_grouped(parts)}; the kernel module, libraries "
                    f"and tools must be one release (else 'Driver/library version mismatch')",
            packages={k: _move(state, k) for k in parts},
            hint="move every driver part to the same build together, " + OVERRIDE_HINT))
    added = {r for k, r in parts.items() if k not in parts_before}
    left = {r for k, r in parts.items() if k in parts_before}
    removed = sorted(k for k, r in parts_before.items() if k not in parts and r in left and r not in added)
    if removed:
        out.append(Violation(
            rule="nvidia.driver_removed", action=action,
            message=f"removing {', '.join(package_name(k) for k in removed)} leaves the NVIDIA driver "
                    f"{', '.join(sorted({parts_before[k] for k in removed}))} incomplete (still installed: "
                    f"{_grouped({k: r for k, r in parts.items() if r in {parts_before[x] for x in removed}})})",
            packages={k: _move(state, k) for k in removed},
            hint="remove the whole driver or none of it, " + OVERRIDE_HINT))
    return out


# --- per-package version rules (container toolkits and the like) ----------------------------------------------


def _check_versions(state: HostState, policy: CompiledPolicy) -> List[Violation]:
    out = []
    for index, rule in enumerate(policy.rules("versions")):
        patterns = list(rule.get("packages") or [])
        label = rule.get("name") or f"versions[{index}]"
        for key in _matching(state.after, patterns):
            version = state.after[key]
            if matches(rule.get("allow", "any"), version, state.manager):
                continue
            out.append(Violation(
                rule=f"versions.{label}", action=policy.action_for(rule.get("action")),
                message=f"{package_name(key)} {version} is outside the allowed versions of rule '{label}' "
                        f"({describe(rule.get('allow', 'any'))})",
                packages={key: _move(state, key)},
                hint=f"install a version of {package_name(key)} matching {describe(rule.get('allow', 'any'))}, "
                     + OVERRIDE_HINT))
    return out


# --- companion pairings (agent/policy/companions.py) -----------------------------------------------------------


def _check_companions(state: HostState, policy: CompiledPolicy) -> List[Violation]:
    """Fabric manager, DCGM, dcgm-exporter and the amdsmi binding against what they serve, in the set after the
    change. A violation names the judged packages and those of the rule's family that moved, so that a driver
    upgrade that leaves fabric manager behind is this change's."""
    section = policy.section("companions")
    if not section:
        return []
    from agent.policy import companions

    driver = policy.nvidia_packages[0] or list(DEFAULT_NVIDIA_DRIVER_PACKAGES)
    leaves = "the transaction leaves" if state.changed() else "the host has"
    context = state.context
    found: List[companions.Disagreement] = []
    if section.get("fabricmanager"):
        found += companions.fabricmanager(state.after, driver, context.loaded("nvidia") if context else None,
                                          tuple(NVIDIA_NOT_DRIVER_PARTS), leaves)
    if section.get("dcgm"):
        found += companions.dcgm(state.after)
    if section.get("dcgm_exporter"):
        found += companions.dcgm_exporter(state.after)
    if section.get("amdsmi"):
        found += companions.amdsmi(state.after, context.amdsmi_binding if context else None, leaves)
    out = []
    for item in found:
        moved = _matching(state.before, companions.family(item.rule, driver))
        moved += _matching(state.after, companions.family(item.rule, driver))
        keys = dict.fromkeys([*item.packages, *sorted(k for k in set(moved) if state.before.get(k) !=
                                                       state.after.get(k))])
        out.append(Violation(
            rule=item.rule, action=policy.action_for(section.get("action")), message=item.message,
            packages={k: _move(state, k) for k in keys},
            hint=f"{companions.HINTS[item.rule]}, set {item.rule.split('.', 1)[1]} = false in [companions], "
                 + OVERRIDE_HINT))
    return out


# --- AMD's published compatibility matrix ----------------------------------------------------------------------


def _os_supported(os_table: Mapping[str, Any], os_id: str, version_id: str) -> Optional[bool]:
    """True/False when the matrix lists this OS family, None when it says nothing about it."""
    versions = os_table.get(os_id)
    if versions is None:
        return False if os_table else None
    return any(v == version_id or v.startswith(version_id + ".") or version_id.startswith(v + ".")
               for v in versions)


def _check_matrix(state: HostState, policy: CompiledPolicy) -> List[Violation]:
    """Every ROCm release present (classic and TheRock, side by side included) against AMD's matrix."""
    matrix = policy.section("matrix")
    if not matrix:
        return []
    driver_name, rocm_name = policy.amd_packages
    rocms = _rocm_versions(state.after, rocm_name)
    if not rocms:
        return []
    driver = _find(state.after, driver_name)
    out: List[Violation] = []
    judged: Set[Optional[str]] = set()
    for key, rocm in sorted(rocms.items()):
        rocm_series = releases.series(releases.rocm_release(rocm))
        if rocm_series in judged:
            continue  # the meta package and its versioned install carry one release
        judged.add(rocm_series)
        out += _check_matrix_release(state, policy, matrix, driver, key, rocm, rocm_series)
    unique: Dict[Tuple[str, str], Violation] = {}  # a driver the matrix does not know is said once, not per release
    for violation in out:
        unique.setdefault((violation.rule, violation.message), violation)
    return list(unique.values())


def _check_matrix_release(state: HostState, policy: CompiledPolicy, matrix: Mapping[str, Any], driver: Optional[str],
                          rocm_key: str, rocm: str, rocm_series: Optional[str]) -> List[Violation]:
    driver_name = policy.amd_packages[0]
    rocm_name = package_name(rocm_key)
    action = policy.action_for(matrix.get("action"))
    hint = "pick a combination from AMD's compatibility matrix, set require_amd_matrix = false, " + OVERRIDE_HINT
    packages = {n: _move(state, n) for n in (driver_name, rocm_key) if _find(state.after, n) or _find(state.before,
                                                                                                       n)}
    out = []
    rocm_rows = matrix.get("rocm") or {}
    if driver is not None:
        driver_series = releases.series(releases.amdgpu_driver_release(driver))
        supported = (matrix.get("driver_rocm") or {}).get(driver_series or "")
        if driver_series is None:
            out.append(Violation(rule="matrix.driver", action=action, packages=packages, hint=hint,
                                 message=f"cannot tell the amdgpu driver release of {driver_name} {driver} to check "
                                         f"it against AMD's compatibility matrix"))
        elif supported is None:
            out.append(Violation(rule="matrix.driver", action=action, packages=packages, hint=hint,
                                 message=f"amdgpu driver {driver_series}.x ({driver_name} {driver}) is not in AMD's "
                                         f"compatibility matrix"))
        elif rocm_series not in supported:
            out.append(Violation(rule="matrix.driver_rocm", action=action, packages=packages, hint=hint,
                                 message=f"AMD's compatibility matrix does not support ROCm {rocm_series}.x "
                                         f"({rocm_name} {rocm}) on amdgpu driver {driver_series}.x (it supports ROCm "
                                         f"{', '.join(s + '.x' for s in supported)})"))
    row = rocm_rows.get(rocm_series or "")
    if row is None:
        out.append(Violation(rule="matrix.rocm", action=action, packages=packages, hint=hint,
                             message=f"ROCm {rocm_series}.x ({rocm_name} {rocm}) is not in AMD's compatibility matrix"))
        return out
    context = state.context
    os_id, os_version_id = (context.os_id, context.os_version_id) if context else (None, None)
    if os_id and os_version_id:
        ok = _os_supported(row.get("os") or {}, os_id, os_version_id)
        if ok is False:
            out.append(Violation(rule="matrix.os", action=action, packages=packages, hint=hint,
                                 message=f"AMD's compatibility matrix does not list {os_id} "
                                         f"{os_version_id} for ROCm {rocm_series}.x"))
        kernel_table = row.get("kernels") or {}
        major = os_version_id.split(".")[0]
        series_allowed = kernel_table.get(f"{os_id}:{os_version_id}") or \
            kernel_table.get(f"{os_id}:{major}")
        if series_allowed:
            patterns = policy.kernel_packages
            before = _kernels(state.before, patterns, state.manager)
            for release, key in sorted(_kernels(state.after, patterns, state.manager).items()):
                if release in before:
                    continue
                if not any(release == s or release.startswith(s + ".") or release.startswith(s + "-")
                           for s in series_allowed):
                    out.append(Violation(
                        rule="matrix.kernel", action=action, packages={key: _move(state, key)}, hint=hint,
                        message=f"kernel {release} is not a kernel series AMD lists for ROCm {rocm_series}.x on "
                                f"{os_id} {os_version_id} ({', '.join(series_allowed)})"))
    gpus = row.get("gpus") or []
    for target in (context.gpu_targets if context else ()):
        if gpus and target not in gpus:
            out.append(Violation(rule="matrix.gpu", action=action, packages=packages, hint=hint,
                                 message=f"GPU target {target} is not supported by ROCm {rocm_series}.x according to "
                                         f"AMD's compatibility matrix"))
    return out
