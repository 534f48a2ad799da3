"""``[nvidia]``: the allowed NVIDIA driver x CUDA pairings; the driver's parts one build."""

from __future__ import annotations

from agent.hostfacts.package_keys import package_name
from agent.policy import releases
from agent.policy.compiled import NVIDIA_NOT_DRIVER_PARTS, guarded_names
from agent.policy.families import OVERRIDE_HINT, TYPE_CHECKING, HostState, Violation, matching, move
from agent.policy.spec import describe, matches

if TYPE_CHECKING:  # typing costs milliseconds of the apt hook's start-up budget
    from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Set, Tuple

    from agent.hostfacts.context import HostContext
    from agent.policy.compiled import CompiledPolicy
    from agent.policy.families import CompileSource, FreezeHost


# Where its lines go in ``policy freeze`` output (agent/policy/evaluate.py, Family).
FREEZE_PLACE = 20


def facts(policy: CompiledPolicy) -> Tuple[str, ...]:
    """The loaded nvidia module: a driver that no package carries is judged by it."""
    if not policy.section("nvidia"):
        return ()
    from agent.hostfacts.context import NVIDIA_MODULE

    return (NVIDIA_MODULE,)


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
    return {k: releases.dotted_release(mapping[k]) or "unknown" for k in matching(mapping, patterns)
            if package_name(k) not in NVIDIA_NOT_DRIVER_PARTS}


def _cuda_releases(mapping: Mapping[str, str], patterns: Sequence[str]) -> Dict[str, str]:
    """Every installed CUDA package (key -> CUDA release). A package whose version is not of the CUDA major its
    name carries (``cuda-compat-13-0`` is versioned after the driver, ``580.95.05``) is not judged by it."""
    out: Dict[str, str] = {}
    for key in matching(mapping, patterns):
        release = releases.cuda_release(mapping[key]) or "unknown"
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


def check(state: HostState, policy: CompiledPolicy) -> List[Violation]:
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
            packages={k: move(state, k) for k in dict.fromkeys(offending) if k != MODULE_KEY},
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
            packages={k: move(state, k) for k in cuda},
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
            packages={k: move(state, k) for k in parts},
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
            packages={k: move(state, k) for k in removed},
            hint="remove the whole driver or none of it, " + OVERRIDE_HINT))
    return out


def explain(policy: CompiledPolicy, installed: Mapping[str, str], manager: str, context: HostContext) -> List[str]:
    """The loaded module (judged when no package carries the driver), the pairings and the one-build rule."""
    nvidia = policy.section("nvidia")
    if not nvidia:
        return []
    lines = []
    module = context.loaded("nvidia")
    if module:
        packaged = guarded_names(list(installed), policy.nvidia_packages[0])
        lines.append(f"NVIDIA: loaded module {module}"
                     + (f"; driver packages: {', '.join(packaged)}" if packaged
                        else " (no driver package: the policy judges the running module)"))
    for pairing in nvidia.get("pairings") or []:
        lines.append(f"NVIDIA: may use driver {describe(pairing.get('driver', 'any'))} with CUDA "
                     f"{describe(pairing.get('cuda', 'any'))} ('{pairing.get('name')}')")
    if nvidia.get("pairings"):
        lines.append("NVIDIA: every driver part must be one build; several CUDA releases side by side are "
                     + ("allowed" if nvidia.get("side_by_side") else "refused (side_by_side = false)"))
    return lines


def compiled(source: CompileSource) -> Dict[str, Any]:
    """``nvidia``: the section as validated, its ``pairing`` list as ``pairings``; None without one."""
    section = source.section("nvidia")
    if section is None:
        return {"nvidia": None}
    section = dict(section)
    section["pairings"] = section.pop("pairing")
    return {"nvidia": section}


def guarded(source: CompileSource) -> List[str]:
    """With [nvidia], its driver and CUDA package globs."""
    section = source.section("nvidia")
    return list(section["driver_packages"]) + list(section["cuda_packages"]) if section else []


def shape(data: Mapping[str, Any]) -> None:
    from agent.policy.compiled import action, expect, optional_bool, spec, str_list, table

    nvidia = table(data["nvidia"], "nvidia", ("driver_packages", "cuda_packages", "action", "pairings",
                                               "side_by_side"))
    optional_bool(nvidia["side_by_side"], "nvidia -> side_by_side")
    str_list(nvidia["driver_packages"], "nvidia -> driver_packages")
    str_list(nvidia["cuda_packages"], "nvidia -> cuda_packages")
    action(nvidia["action"], "nvidia -> action")
    expect(isinstance(nvidia["pairings"] or [], list), "nvidia -> pairings", "not a list")
    for index, pairing in enumerate(nvidia["pairings"] or [], 1):
        where = f"nvidia -> pairings -> {index}"
        p = table(pairing, where, ("name", "driver", "cuda", "action"))
        expect(isinstance(p["name"], str), f"{where} -> name", "not a string")
        spec(p["driver"], f"{where} -> driver")
        spec(p["cuda"], f"{where} -> cuda")
        action(p["action"], f"{where} -> action")


def freeze(host: FreezeHost) -> List[str]:
    """``[nvidia]`` and its one pairing, the installed one, where the host has an NVIDIA driver or CUDA."""
    if not host.nvidia:
        return []
    stack, line = host.stack, host.line
    lines = ["", "[nvidia]  # the NVIDIA driver and CUDA"]
    cuda = {k: releases.cuda_release(v) or "unknown" for k, v in stack.cuda.items()}
    if len({releases.series(r) for r in cuda.values()}) > 1:
        lines.append(line("side_by_side", True, "several CUDA releases are installed side by side now"))
    lines += ["", "[[nvidia.pairing]]  # the one allowed pairing: the installed one",
              line("name", "frozen", "named in refusals")]
    loaded = host.context.loaded("nvidia")
    parts = {k: releases.dotted_release(v) or "unknown" for k, v in stack.nvidia_parts.items()}
    release: Optional[str]
    if parts:
        release = next(iter(parts.values()))
        where = f"every driver package: {host.listing(stack.nvidia_parts, 2)}" + (
            "; and the loaded module" if loaded == release else "")
    elif loaded:
        release = loaded
        where = "no package carries it: the loaded nvidia module is judged"
    else:
        release = None
        where = ""
    if release is None:
        lines.append(line("driver", "none", "no NVIDIA driver package and no loaded module: installing a driver is "
                                            "refused"))
    elif host.point_releases:
        branch = releases.series(release, 1)
        lines.append(line("driver", f"{branch}.*", f"driver branch {branch} updates (now {release}; {where})"))
    else:
        lines.append(line("driver", release, f"driver release {release} ({where})"))
    if not cuda:
        lines.append(line("cuda", "none", "no CUDA package is installed: installing CUDA is refused"))
    elif host.point_releases:
        lines.append(line("cuda", host.spec([f"{releases.series(r)}.*" for r in sorted(cuda.values())]),
                          f"CUDA point releases (installed: {host.listing(stack.cuda)})"))
    else:
        lines.append(line("cuda", host.spec(sorted(cuda.values())),
                          f"every CUDA release installed ({host.listing(stack.cuda)})"))
    return lines
