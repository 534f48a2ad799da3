"""``[amd]``: the allowed amdgpu driver x ROCm pairings (classic ROCm and TheRock's releases, side by side)."""

from __future__ import annotations

from agent.defaults import DISTRIBUTION_ROCM_RELEASE_PACKAGES, THEROCK_BASE_PACKAGE
from agent.hostfacts.package_keys import package_name
from agent.policy import releases
from agent.policy.families import (
    OVERRIDE_HINT,
    TYPE_CHECKING,
    HostState,
    Violation,
    find,
    kernels,
    matching,
    move,
)
from agent.policy.globs import any_glob
from agent.policy.spec import describe, matches

if TYPE_CHECKING:  # typing costs milliseconds of the apt hook's start-up budget
    from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

    from agent.hostfacts.alternatives import ActiveTree
    from agent.hostfacts.context import HostContext
    from agent.policy.compiled import CompiledPolicy
    from agent.policy.families import CompileSource, FreezeHost


# Where its lines go in ``policy freeze`` output (agent/policy/evaluate.py, Family).
FREEZE_PLACE = 10


def facts(policy: CompiledPolicy) -> Tuple[str, ...]:
    """The tree update-alternatives points at, where ``active_tree = "pinned"`` judges it; else none."""
    amd = policy.section("amd")
    if not amd or amd.get("active_tree") != "pinned":
        return ()
    from agent.hostfacts.context import ACTIVE_TREE

    return (ACTIVE_TREE,)


def active_release_package(tree: ActiveTree, rocms: Mapping[str, str]) -> Optional[str]:
    """The key of the installed release package that carries the active tree's release (``amdrocm-base7.14`` for
    ``/opt/rocm/core-7.14``, ``rocm-core6.4.1`` or ``rocm-core`` at 6.4.1 for ``/opt/rocm-6.4.1``), else None."""
    release = tree.release
    if release is None:
        return None
    for key, version in sorted(rocms.items()):
        found = releases.rocm_release(version)
        if found is not None and (found == release or releases.series(found, release.count(".") + 1) == release):
            return key
    return None


def _active_tree(state: HostState, policy: CompiledPolicy, amd: Mapping[str, Any], rocms: Mapping[str, str],
                 now: Optional[Mapping[str, Any]]) -> List[Violation]:
    """``active_tree = "pinned"``: the tree update-alternatives points at is a release an installed release package
    carries (not a tarball or nightly tree, not a release the change removes), so that the pairing, which judges
    every release package, judges the tree in use too."""
    tree = state.context.active_tree if state.context is not None else None
    if amd.get("active_tree") != "pinned" or tree is None or active_release_package(tree, rocms) is not None:
        return []
    release = f"ROCm {tree.release}" if tree.release else "the release it holds"
    return [Violation(
        rule="amd.active_tree", action=policy.action_for((now or {}).get("action"), amd.get("action")),
        message=f"the active ROCm tree {tree.describe()} is not a pinned release: no installed release package "
                f"carries {release}" + (" after the change" if state.changed() else "")
                + f" ([amd] active_tree = \"pinned\" in policy '{policy.name}')",
        packages={k: move(state, k) for k in sorted(set(rocm_versions(state.before, policy.amd_packages[1]))
                                                     | set(rocms)) if state.before.get(k) != state.after.get(k)},
        hint=f"point the alternative {tree.name} at a pinned release's tree first (update-alternatives --set "
             f"{tree.name} <tree>), or install that release through its packages, " + OVERRIDE_HINT,
        pairing=(now or {}).get("name"))]


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


def rocm_versions(mapping: Mapping[str, str], rocm_name: str) -> Dict[str, str]:
    """Every ROCm release present, key -> version: the ROCm package and its versioned side-by-side installs
    (``rocm-core6.4.1``, which ``apt install rocm6.4.1`` brings for AMD's multi-version installs), and TheRock's
    base package with its versioned installs (``amdrocm-base7.13``, ``amdrocm-base10.0``): a host with a classic
    stack and a TheRock release is judged by both. Where none of those is installed, the release of ROCm as the
    distribution packages it (Debian's and Ubuntu's, without rocm-core): its release package, else HIP's runtime
    package, else ROCr's (agent/defaults.py DISTRIBUTION_ROCM_RELEASE_PACKAGES)."""
    found = {k: mapping[k] for k in matching(mapping, releases.rocm_package_patterns(rocm_name))}
    if found:
        return found
    for prefix in DISTRIBUTION_ROCM_RELEASE_PACKAGES:
        carriers = {k: mapping[k] for k in matching(mapping, (prefix + "*",)) if not package_name(k).endswith("-dev")}
        if carriers:
            return carriers
    return {}


def _no_rocm(state: HostState, rocm_name: str) -> str:
    """A set left with no ROCm release package, named by what it had: the release packages the change removes
    (``no amdrocm-base7.14`` on a TheRock host, ``no rocm-core`` on a classic one), TheRock's base package where
    only TheRock packages are there, else the policy's ROCm package."""
    gone = sorted({package_name(k) for k in rocm_versions(state.before, rocm_name)})
    if not gone and matching(state.after, ["amdrocm-*"]):
        gone = [THEROCK_BASE_PACKAGE + "<release>"]
    return "no " + " or ".join(gone or [rocm_name])


def _rocm_word(before: Mapping[str, str], after: Mapping[str, str], rocm_name: str) -> str:
    """The ROCm side a hint names: TheRock's base package alone where every ROCm release package is TheRock's."""
    keys = {*before, *after}
    if keys and all(package_name(k).startswith(THEROCK_BASE_PACKAGE) for k in keys):
        return f"TheRock's {THEROCK_BASE_PACKAGE}<release>"
    return f"{rocm_name} (or TheRock's {THEROCK_BASE_PACKAGE}<release>)"


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
    for key in matching(state.before, [base + "[0-9]*"]):
        if key in state.after:
            continue
        release = package_name(key)[len(base):]
        left = [k for k in matching(state.after, ["amdrocm-*"]) if _release_suffix(package_name(k)) == release]
        if not left:
            continue
        out.append(Violation(
            rule="amd.rocm_base_removed", action=policy.action_for((pairing or {}).get("action"), amd.get("action")),
            message=f"removing {package_name(key)} {state.before[key]} leaves TheRock ROCm {release} without its base "
                    f"package (still installed: {', '.join(package_name(k) for k in left[:3])}"
                    + (f" and {len(left) - 3} more" if len(left) > 3 else "") + ")",
            packages={key: move(state, key)},
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


def check(state: HostState, policy: CompiledPolicy) -> List[Violation]:
    """The driver and every ROCm release present in one allowed pairing, the driver and its firmware one build,
    several ROCm releases only with ``side_by_side``, the kernels the pairing supports, TheRock releases whole."""
    amd = policy.section("amd")
    if not amd:
        return []
    pairings = [p for p in amd.get("pairings") or [] if isinstance(p, dict)]
    driver_name, rocm_name = policy.amd_packages
    driver_after, driver_before = find(state.after, driver_name), find(state.before, driver_name)
    rocms_after, rocms_before = rocm_versions(state.after, rocm_name), rocm_versions(state.before, rocm_name)
    if not pairings or (driver_after is None and not rocms_after and driver_before is None and not rocms_before):
        return []  # no AMD stack before or after: nothing to judge (removing the last of it is judged)
    scheme = state.manager
    pinned = _pairing_for_all(pairings, driver_before, rocms_before, scheme)
    now = _pairing_for_all(pairings, driver_after, rocms_after, scheme)
    packages = {n: move(state, n) for n in sorted({driver_name, *rocms_after, *rocms_before})
                if find(state.after, n) is not None or find(state.before, n) is not None}
    out: List[Violation] = []
    out += _therock_base_removed(state, policy, amd, pinned or now)
    out += _active_tree(state, policy, amd, rocms_after, now)
    firmware = find(state.after, driver_name + "-firmware")
    if driver_after is not None and firmware is not None and not releases.amdgpu_same_build(driver_after, firmware):
        out.append(Violation(
            rule="amd.driver_parts", action=policy.action_for((now or pinned or {}).get("action"), amd.get("action")),
            message=f"{driver_name} {driver_after} and {driver_name}-firmware {firmware} are not one build",
            packages={n: move(state, n) for n in (driver_name, driver_name + "-firmware")},
            hint=f"move {driver_name} and its firmware together, " + OVERRIDE_HINT))
    if now is None:
        rocm_text = " and ".join(_label(package_name(k), v, releases.rocm_release(v), "ROCm")
                                 for k, v in sorted(rocms_after.items())) or _no_rocm(state, rocm_name)
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
            hint=f"move {driver_name} and {_rocm_word(rocms_before, rocms_after, rocm_name)} together to an allowed "
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
            packages={k: move(state, k) for k in rocms_after},
            hint="keep one ROCm release, set side_by_side = true in [amd], " + OVERRIDE_HINT,
            pairing=now.get("name")))
    kernels_spec = now.get("kernels")
    if kernels_spec is None:
        return out
    kernel_patterns = policy.kernel_packages
    kernels_before = kernels(state.before, kernel_patterns, state.manager)
    kernels_after = kernels(state.after, kernel_patterns, state.manager)
    driver_moved = driver_before != driver_after
    # DKMS builds the module for every installed kernel: a new driver must suit them all, a new kernel must suit
    # the driver that stays.
    to_check = kernels_after if driver_moved else {r: k for r, k in kernels_after.items() if r not in kernels_before}
    pinned_text, supported = describe_pairing(now), describe(kernels_spec)  # once, not once per kernel
    for release, key in sorted(to_check.items()):
        if matches(kernels_spec, release):
            continue
        involved = {key: move(state, key)}
        if driver_moved:
            involved[driver_name] = move(state, driver_name)
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


def explain(policy: CompiledPolicy, installed: Mapping[str, str], manager: str, context: HostContext) -> List[str]:
    """The installed driver and ROCm, the pinned pairing and the pairings a host may move to; and a TheRock release
    newer than gpuguard's TheRock release table knows (reported, not judged: agent/policy/table_unknown.py)."""
    amd = policy.section("amd")
    if not amd or not amd.get("pairings"):
        return []
    from agent.policy import table_unknown

    driver_name, rocm_name = policy.amd_packages
    driver = installed.get(driver_name)
    carries_rocm = any_glob(releases.rocm_package_patterns(rocm_name))
    rocms = {k: v for k, v in sorted(installed.items()) if carries_rocm(package_name(k))}  # classic and TheRock
    therock = {k: releases.series(releases.rocm_release(v)) for k, v in rocms.items()
               if package_name(k).startswith(THEROCK_BASE_PACKAGE)}
    rocm_text = ", ".join(f"{package_name(k)} {v} (ROCm {releases.rocm_release(v) or '-'})" for k, v in rocms.items())
    lines = [f"AMD: {driver_name} {driver or '(not installed)'} (driver "
             f"{releases.amdgpu_driver_release(driver) or '-'}), {rocm_text or rocm_name + ' (not installed)'}"]
    versions: List[Optional[str]] = [*rocms.values()] or [None]
    pinned = next((p for p in amd["pairings"] if all(matching_pairing([p], driver, v, manager) is not None
                                                     for v in versions)), None)
    if pinned is not None:
        lines.append(f"  pinned pairing: {describe_pairing(pinned)}")
    elif driver is None and not rocms:
        lines.append("  pinned pairing: none (neither package is installed)")
    else:
        lines.append("  pinned pairing: none matches the installed pair (violation)")
    for pairing in amd["pairings"]:
        kernels_text = f"; kernels {describe(pairing['kernels'])}" if pairing.get("kernels") is not None else ""
        lines.append(f"  may move to {describe_pairing(pairing)}{kernels_text} "
                     f"[{policy.action_for(pairing.get('action'), amd.get('action'))}]")
    lines.append(f"  changing only one of {driver_name}/{rocm_name} must land in one of these pairings")
    therock_table = table_unknown.compiled_therock_table(policy.section("knowledge"))
    if therock_table is not None:
        lines += [f"  {item.message} [info]" for item in table_unknown.therock(therock, therock_table)]
    tree = context.active_tree
    if tree is not None:
        key = active_release_package(tree, rocms)
        carried = f"ROCm {releases.rocm_release(rocms[key])} ({package_name(key)})" if key else \
            "no installed release package"
        required = ("must be a pinned release ([amd] active_tree = \"pinned\")" if amd.get("active_tree") == "pinned"
                    else "not judged ([amd] active_tree = \"any\")")
        lines.append(f"  active tree: {tree.describe()}: {carried}; {required}")
    return lines


def compiled(source: CompileSource) -> Dict[str, Any]:
    """``amd``: the packages, action and pairings; None without an [amd] section, unless the policy requires AMD's
    matrix, which judges the AMD packages too: their names are compiled in even without pairings."""
    amd = source.section("amd")
    if amd is None and source.policy.get("require_amd_matrix"):
        amd = source.section_or_default("amd")
    if amd is None:
        return {"amd": None}
    return {"amd": {"driver_package": amd["driver_package"], "rocm_package": amd["rocm_package"],
                    "action": amd["action"], "side_by_side": amd["side_by_side"], "pairings": amd["pairing"],
                    "active_tree": amd.get("active_tree", "any")}}


def guarded(source: CompileSource) -> List[str]:
    """With [amd], the driver and ROCm packages, every ``<driver_package>-*`` (its firmware), the whole AMD stack
    (AMD_STACK_PACKAGES) and the kernels DKMS builds the driver for."""
    amd = source.section("amd")
    if amd is None:
        return []
    from agent.policy.compiled import AMD_STACK_PACKAGES
    from agent.policy.families.kernel import packages

    return [amd["driver_package"], f"{amd['driver_package']}-*", amd["rocm_package"], *AMD_STACK_PACKAGES,
            *packages(source)]


def shape(data: Mapping[str, Any]) -> None:
    from agent.policy.compiled import action, expect, optional_bool, spec, table

    amd = table(data["amd"], "amd", ("driver_package", "rocm_package", "action", "pairings", "side_by_side",
                                     "active_tree"))
    optional_bool(amd["side_by_side"], "amd -> side_by_side")
    expect(amd["active_tree"] in (None, "any", "pinned"), "amd -> active_tree", "not \"any\" or \"pinned\"")
    for key in ("driver_package", "rocm_package"):
        expect(isinstance(amd[key], str) and bool(amd[key]), f"amd -> {key}", "not a package name")
    action(amd["action"], "amd -> action")
    expect(isinstance(amd["pairings"] or [], list), "amd -> pairings", "not a list")
    for index, pairing in enumerate(amd["pairings"] or [], 1):
        where = f"amd -> pairings -> {index}"
        p = table(pairing, where, ("name", "amdgpu", "rocm", "amdgpu_package", "rocm_package", "kernels", "action"))
        expect(isinstance(p["name"], str), f"{where} -> name", "not a string")
        spec(p["amdgpu"], f"{where} -> amdgpu")
        spec(p["rocm"], f"{where} -> rocm")
        for key in ("amdgpu_package", "rocm_package"):
            if p[key] is not None:
                spec(p[key], f"{where} -> {key}", package_versions=True)
        if p["kernels"] is not None:
            spec(p["kernels"], f"{where} -> kernels")
        action(p["action"], f"{where} -> action")


def freeze(host: FreezeHost) -> List[str]:
    """``[amd]`` and its one pairing, the installed one, where the host has the amdgpu driver or ROCm."""
    if not host.amd:
        return []
    from agent.defaults import AMD_DRIVER_PACKAGE, ROCM_CORE_PACKAGE

    firmware = AMD_DRIVER_PACKAGE + "-firmware"
    stack, line = host.stack, host.line
    lines = ["", "[amd]  # the amdgpu driver and ROCm",
             line("driver_package", AMD_DRIVER_PACKAGE,
                  "its version carries the driver release (1:6.8.5.60202-... is 6.2.2)"),
             line("rocm_package", ROCM_CORE_PACKAGE, f"its version carries the ROCm release (TheRock's "
                                                     f"{THEROCK_BASE_PACKAGE}<release> is judged beside it)")]
    rocm_releases = {k: releases.rocm_release(v) for k, v in stack.rocm.items()}
    known_rocm = sorted(r for r in rocm_releases.values() if r)
    if len({releases.series(r) for r in rocm_releases.values()}) > 1:
        lines.append(line("side_by_side", True, "several ROCm releases are installed side by side now"))
    tree = host.context.active_tree
    if tree is not None and active_release_package(tree, stack.rocm) is not None:
        lines.append(line("active_tree", "pinned", f"update-alternatives points at {tree.describe()}: a tree no "
                                                   f"installed release package carries is refused"))
    lines += ["", "[[amd.pairing]]  # the one allowed pairing: the installed one",
              line("name", "frozen", "named in refusals")]
    loaded = host.context.loaded("amdgpu")
    driver = stack.amd_driver
    if driver is None:
        lines.append(line("amdgpu", "none", f"no {AMD_DRIVER_PACKAGE} is installed (ROCm runs on the kernel's own "
                                            f"amdgpu driver"
                                            + (f", loaded module {loaded}" if loaded else "") + "): installing one "
                                            "is refused"))
    else:
        release = releases.amdgpu_driver_release(driver)
        where = f"{AMD_DRIVER_PACKAGE} {driver}" + (f", loaded module {loaded}" if loaded and not host.inconsistent
                                                    else "")
        if release is None:
            lines.append(line("amdgpu", "any", f"{where} carries no release code: the exact build below pins it"))
        elif host.point_releases:
            lines.append(line("amdgpu", f"{releases.series(release)}.*",
                              f"driver {releases.series(release)} point releases (installed: {release}, {where})"))
        else:
            lines.append(line("amdgpu", release, f"driver release {release} ({where})"))
    if not stack.rocm:
        lines.append(line("rocm", "none", f"no {ROCM_CORE_PACKAGE} or {THEROCK_BASE_PACKAGE} is installed: "
                                          f"installing ROCm is refused"))
    elif any(r is None for r in rocm_releases.values()):
        lines.append(line("rocm", "any", "a ROCm package carries no release: the exact builds below pin it"))
    elif host.point_releases:
        lines.append(line("rocm", host.spec([f"{releases.series(r)}.*" for r in known_rocm]),
                          f"ROCm point releases (installed: {host.listing(stack.rocm)})"))
    else:
        lines.append(line("rocm", host.spec(known_rocm), f"ROCm release ({host.listing(stack.rocm)})"))
    exact_driver = driver is not None and (not host.point_releases or releases.amdgpu_driver_release(driver)
                                           is None)
    if exact_driver:
        lines.append(line("amdgpu_package", driver, "this exact build: any other driver build is refused"
                                                    + (f" ({firmware} must stay at the same build)"
                                                       if stack.amd_firmware else "")))
    exact_rocm = stack.rocm and (not host.point_releases or any(r is None for r in rocm_releases.values()))
    if exact_rocm:
        lines.append(line("rocm_package", host.spec(sorted(stack.rocm.values())),
                          (f"this exact build of {package_name(next(iter(stack.rocm)))}" if len(stack.rocm) == 1
                           else f"these exact builds ({host.listing(stack.rocm)})")
                          + ": any other ROCm build is refused"))
    if driver is not None and host.kernels:
        lines.append(line("kernels", [k for k, _ in host.kernels],
                          "the kernels DKMS builds this driver for (as [kernel] allow below)"))
    return lines
