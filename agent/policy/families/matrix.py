"""``[policy] require_amd_matrix``: every ROCm release present against AMD's published compatibility matrix.

The matrix itself is read and compiled by agent/policy/matrix.py (off the hot path); the compiled section is
``matrix``.
"""

from __future__ import annotations

from agent.hostfacts.package_keys import package_name
from agent.policy import releases
from agent.policy.families import OVERRIDE_HINT, TYPE_CHECKING, HostState, Violation, find, kernels, move
from agent.policy.families.amd import rocm_versions

if TYPE_CHECKING:  # typing costs milliseconds of the apt hook's start-up budget
    from typing import Any, Dict, List, Mapping, Optional, Set, Tuple

    from agent.hostfacts.context import HostContext
    from agent.policy.compiled import CompiledPolicy
    from agent.policy.families import CompileSource, FreezeHost


# Where its lines go in ``policy freeze`` output (agent/policy/evaluate.py, Family).
FREEZE_PLACE = 70


def facts(policy: CompiledPolicy) -> Tuple[str, ...]:
    """The OS and the GPU targets, which the matrix lists per ROCm release."""
    if not policy.section("matrix"):
        return ()
    from agent.hostfacts.context import GPU_TARGETS, OS_RELEASE

    return (OS_RELEASE, GPU_TARGETS)


def _os_supported(os_table: Mapping[str, Any], os_id: str, version_id: str) -> Optional[bool]:
    """True/False when the matrix lists this OS family, None when it says nothing about it."""
    versions = os_table.get(os_id)
    if versions is None:
        return False if os_table else None
    return any(v == version_id or v.startswith(version_id + ".") or version_id.startswith(v + ".")
               for v in versions)


def check(state: HostState, policy: CompiledPolicy) -> List[Violation]:
    """Every ROCm release present (classic and TheRock, side by side included) against AMD's matrix."""
    matrix = policy.section("matrix")
    if not matrix:
        return []
    driver_name, rocm_name = policy.amd_packages
    rocms = rocm_versions(state.after, rocm_name)
    if not rocms:
        return []
    driver = find(state.after, driver_name)
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
    packages = {n: move(state, n) for n in (driver_name, rocm_key) if find(state.after, n) or find(state.before,
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
            before = kernels(state.before, patterns, state.manager)
            for release, key in sorted(kernels(state.after, patterns, state.manager).items()):
                if release in before:
                    continue
                if not any(release == s or release.startswith(s + ".") or release.startswith(s + "-")
                           for s in series_allowed):
                    out.append(Violation(
                        rule="matrix.kernel", action=action, packages={key: move(state, key)}, hint=hint,
                        message=f"kernel {release} is not a kernel series AMD lists for ROCm {rocm_series}.x on "
                                f"{os_id} {os_version_id} ({', '.join(series_allowed)})"))
    gpus = row.get("gpus") or []
    for target in (context.gpu_targets if context else ()):
        if gpus and target not in gpus:
            out.append(Violation(rule="matrix.gpu", action=action, packages=packages, hint=hint,
                                 message=f"GPU target {target} is not supported by ROCm {rocm_series}.x according to "
                                         f"AMD's compatibility matrix"))
    return out


def explain(policy: CompiledPolicy, installed: Mapping[str, str], manager: str, context: HostContext) -> List[str]:
    """That the matrix is required, and when it was recorded; and the ROCm releases, amdgpu driver and GPU targets
    newer than it knows (reported as unknown to it: agent/policy/table_unknown.py)."""
    matrix = policy.section("matrix")
    if not matrix:
        return []
    from agent.policy import table_unknown

    driver_name, rocm_name = policy.amd_packages
    rocms = {k: releases.series(releases.rocm_release(v)) for k, v in rocm_versions(installed, rocm_name).items()}
    driver = find(installed, driver_name)
    drivers = {driver_name: releases.series(releases.amdgpu_driver_release(driver))} if driver else {}
    unknown = table_unknown.amd_matrix(matrix, rocms, drivers, list(context.gpu_targets) if context else [])
    return [f"AMD compatibility matrix required (recorded {matrix.get('recorded')})",
            *(f"  {item.message} [info]" for item in unknown)]


def compiled(source: CompileSource) -> Dict[str, Any]:
    """``matrix``: AMD's matrix in its compiled form when ``[policy] require_amd_matrix``, else None; PolicyError
    when the policy requires it and it was not loaded."""
    if not source.policy.get("require_amd_matrix"):
        return {"matrix": None}
    if source.matrix is None:
        from agent.errors import PolicyError

        raise PolicyError(source.path, ["policy -> require_amd_matrix: the AMD compatibility matrix is needed to "
                                        "compile this policy"])
    return {"matrix": {"action": None, **source.matrix}}


def guarded(source: CompileSource) -> List[str]:
    """None of its own: the amd family's packages (compiled in for the matrix too) are guarded with [amd]."""
    return []


def shape(data: Mapping[str, Any]) -> None:
    from agent.policy.compiled import action, expect, str_list, table

    matrix = table(data["matrix"], "matrix", ("action", "driver_rocm", "rocm"))
    action(matrix["action"], "matrix -> action")
    driver_rocm = matrix["driver_rocm"] or {}
    expect(isinstance(driver_rocm, dict), "matrix -> driver_rocm", "not an object")
    for series, rocm in driver_rocm.items():
        str_list(rocm, f"matrix -> driver_rocm -> {series}")
    rows = matrix["rocm"] or {}
    expect(isinstance(rows, dict), "matrix -> rocm", "not an object")
    for series, row in rows.items():
        where = f"matrix -> rocm -> {series}"
        r = table(row, where, ("os", "kernels", "gpus"))
        for key in ("os", "kernels"):
            found = r[key] or {}
            expect(isinstance(found, dict), f"{where} -> {key}", "not an object")
            for name, values in found.items():
                str_list(values, f"{where} -> {key} -> {name}")
        str_list(r["gpus"] or [], f"{where} -> gpus")


def freeze(host: FreezeHost) -> List[str]:
    """None: a freeze pins exact builds; checking them against AMD's matrix is the operator's choice."""
    return []
