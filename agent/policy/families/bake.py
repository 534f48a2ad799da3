"""``[[bake]]``: bake time. A version of a package family (the NVIDIA or AMD driver, the GPU user space: ROCm and
CUDA, firmware) is refused until it has been public ``min_age_days`` days.

A version's public date is the one the signed deny list carries for it (``published``: package, version, date;
agent/bundle/deny.py), put into this section's ``published`` when the list is taken and at every compile: apt's
Packages files carry no date per version and a Release file's ``Date`` is the repository snapshot's, and an rpm's
build time is when it was built, not when it was published, so neither says how long the fleet could have heard
of a bad version; the signed list does, the same for apt, dnf and zypper hosts, and the hook reads it from the
compiled policy at no cost. A version with no date known is refused (its age is unknown: fail closed). Only a
package the change moves is judged (what is installed already has baked), against today's date (UTC) read when the
check runs: the one rule family that reads the clock.
"""

from __future__ import annotations

from agent.hostfacts.package_keys import package_name
from agent.policy.families import OVERRIDE_HINT, TYPE_CHECKING, HostState, Violation, matching, move, no_facts

if TYPE_CHECKING:  # typing costs milliseconds of the apt hook's start-up budget
    from typing import Any, Dict, List, Mapping, Tuple

    from agent.hostfacts.context import HostContext
    from agent.policy.compiled import CompiledPolicy
    from agent.policy.families import CompileSource, FreezeHost


# Where its lines go in ``policy freeze`` output (agent/policy/evaluate.py, Family): it writes none.
FREEZE_PLACE = 110
# The package globs of each family a rule may name (``packages`` replaces them).
FIRMWARE_PACKAGES: Tuple[str, ...] = ("amdgpu-dkms-firmware", "firmware-amd-graphics", "firmware-nvidia-*",
                                      "nvidia-firmware-*", "linux-firmware*", "amd-gpu-firmware")


def family_packages(family: str) -> List[str]:
    """The default globs of ``driver``, ``gpu_stack`` (ROCm and CUDA) or ``firmware``."""
    from agent.defaults import AMD_DRIVER_PACKAGE
    from agent.policy.compiled import (
        AMD_STACK_PACKAGES,
        DEFAULT_CUDA_PACKAGES,
        DEFAULT_NVIDIA_DRIVER_PACKAGES,
    )

    if family == "driver":
        return [AMD_DRIVER_PACKAGE, *DEFAULT_NVIDIA_DRIVER_PACKAGES]
    if family == "firmware":
        return list(FIRMWARE_PACKAGES)
    return [p for p in AMD_STACK_PACKAGES if not p.startswith("amdgpu")] + list(DEFAULT_CUDA_PACKAGES)


facts = no_facts


def check(state: HostState, policy: CompiledPolicy) -> List[Violation]:
    """Every package a rule covers that the change moves to a version public fewer than ``min_age_days`` days
    (or of no known date)."""
    import datetime as dt

    section = policy.section("bake") or {}
    dates: Dict[Tuple[str, str], str] = {(p[0], p[1]): p[2] for p in section.get("published") or []}
    today = dt.datetime.now(dt.timezone.utc).date()
    out = []
    for index, rule in enumerate(section.get("rules") or []):
        label = rule.get("name") or f"bake[{index}]"
        days = int(rule["min_age_days"])
        for key in matching(state.after, list(rule.get("packages") or [])):
            version = state.after[key]
            if state.before.get(key) == version:
                continue
            name = package_name(key)
            published = dates.get((name, version))
            if published is None:
                message = (f"{name} {version} has no public date known (the signed deny list's published dates "
                           f"name none): rule '{label}' asks {days} days of bake time")
            else:
                age = (today - dt.date.fromisoformat(published)).days
                if age >= days:
                    continue
                allowed = dt.date.fromisoformat(published) + dt.timedelta(days=days)
                message = (f"{name} {version} was published {published}, {age} days ago: rule '{label}' asks "
                           f"{days} days of bake time, so it is allowed from {allowed.isoformat()}")
            out.append(Violation(rule=f"bake.{label}", action=policy.action_for(rule.get("action")), message=message,
                                 packages={key: move(state, key)},
                                 hint=f"wait for the bake time, or {OVERRIDE_HINT}"))
    return out


def explain(policy: CompiledPolicy, installed: Mapping[str, str], manager: str, context: HostContext) -> List[str]:
    """One line per rule."""
    section = policy.section("bake") or {}
    return [f"bake '{rule.get('name') or rule.get('family')}': {', '.join(rule.get('packages') or [])} at least "
            f"{rule.get('min_age_days')} days public ({len(section.get('published') or [])} dates known) "
            f"[{policy.action_for(rule.get('action'))}]" for rule in section.get("rules") or []]


def compiled(source: CompileSource) -> Dict[str, Any]:
    """``bake``: the rules with their globs resolved and no dates yet (the deny list in force adds them); None
    without any rule."""
    rules = source.section("bake")
    if not rules:
        return {"bake": None}
    return {"bake": {"rules": [{**rule, "packages": list(rule["packages"] or family_packages(rule["family"]))}
                               for rule in rules], "published": []}}


def guarded(source: CompileSource) -> List[str]:
    """Every rule's packages."""
    return [p for rule in source.section("bake") for p in (rule["packages"] or family_packages(rule["family"]))]


def shape(data: Mapping[str, Any]) -> None:
    from agent.policy.compiled import action, expect, optional_str, str_list, table

    section = table(data["bake"], "bake", ("rules", "published"))
    expect(isinstance(section["rules"], list), "bake -> rules", "not a list")
    for index, rule in enumerate(section["rules"], 1):
        where = f"bake -> rules -> {index}"
        r = table(rule, where, ("name", "packages", "min_age_days", "action"))
        optional_str(r["name"], f"{where} -> name")
        str_list(r["packages"], f"{where} -> packages", non_empty=True)
        days = r["min_age_days"]
        expect(isinstance(days, int) and not isinstance(days, bool) and 1 <= days <= 365,
               f"{where} -> min_age_days", "not a number of days from 1 to 365")
        action(r["action"], f"{where} -> action")
    expect(isinstance(section["published"], list), "bake -> published", "not a list")
    for index, item in enumerate(section["published"], 1):
        expect(isinstance(item, list) and len(item) == 3 and all(isinstance(v, str) for v in item),
               f"bake -> published -> {index}", "not [package, version, YYYY-MM-DD]")
        try:
            __import__("datetime").date.fromisoformat(item[2])
        except ValueError:
            expect(False, f"bake -> published -> {index}", f"{item[2]!r} is not a date as YYYY-MM-DD")


def freeze(host: FreezeHost) -> List[str]:
    """None: a freeze keeps the host as it is; bake time is for what comes next."""
    return []
