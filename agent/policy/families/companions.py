"""``[companions]``: fabric manager, DCGM, dcgm-exporter and the amdsmi binding against what they serve.

The judgements themselves are agent/policy/companions.py's (the snapshot's drift and ``policy freeze`` use them
too); this module turns them into violations. The apt hook imports it when a policy has a ``[companions]`` section.
"""

from __future__ import annotations

from agent.policy import companions
from agent.policy.compiled import DEFAULT_NVIDIA_DRIVER_PACKAGES, NVIDIA_NOT_DRIVER_PARTS
from agent.policy.families import OVERRIDE_HINT, TYPE_CHECKING, HostState, Violation, matching, move

if TYPE_CHECKING:  # typing costs milliseconds of the apt hook's start-up budget
    from typing import Any, Dict, List, Mapping, Tuple

    from agent.hostfacts.context import HostContext
    from agent.policy.compiled import CompiledPolicy
    from agent.policy.families import CompileSource, FreezeHost


# Where its lines go in ``policy freeze`` output (agent/policy/evaluate.py, Family).
FREEZE_PLACE = 50


def facts(policy: CompiledPolicy) -> Tuple[str, ...]:
    """The loaded nvidia module for fabric manager, the amdsmi binding for its rule."""
    section = policy.section("companions") or {}
    fabricmanager, amdsmi = bool(section.get("fabricmanager")), bool(section.get("amdsmi"))
    if not fabricmanager and not amdsmi:
        return ()
    from agent.hostfacts.context import ACTIVE_TREE, AMDSMI_BINDING, NVIDIA_MODULE

    return ((NVIDIA_MODULE,) if fabricmanager else ()) + ((AMDSMI_BINDING, ACTIVE_TREE) if amdsmi else ())


def check(state: HostState, policy: CompiledPolicy) -> List[Violation]:
    """Fabric manager, DCGM, dcgm-exporter and the amdsmi binding against what they serve, in the set after the
    change. A violation names the judged packages and those of the rule's family that moved, so that a driver
    upgrade that leaves fabric manager behind is this change's."""
    section = policy.section("companions")
    if not section:
        return []
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
        found += companions.dcgm_exporter(state.after, exporter_table(policy))
    if section.get("amdsmi"):
        tree = context.active_tree if context else None
        found += companions.amdsmi(state.after, context.amdsmi_binding if context else None, leaves,
                                   tree.release if tree else None)
    out = []
    for item in found:
        moved = matching(state.before, companions.family(item.rule, driver))
        moved += matching(state.after, companions.family(item.rule, driver))
        keys = dict.fromkeys([*item.packages, *sorted(k for k in set(moved) if state.before.get(k) !=
                                                       state.after.get(k))])
        out.append(Violation(
            rule=item.rule, action=policy.action_for(section.get("action")), message=item.message,
            packages={k: move(state, k) for k in keys},
            hint=f"{companions.HINTS[item.rule]}, set {item.rule.split('.', 1)[1]} = false in [companions], "
                 + OVERRIDE_HINT))
    return out


def exporter_table(policy: CompiledPolicy) -> companions.ExporterTable:
    """The dcgm-exporter table compiled into the policy (its shape was checked when the policy was read)."""
    return companions.exporter_table((policy.section("knowledge") or {}).get(companions.EXPORTER_TABLE_NAME))


def explain(policy: CompiledPolicy, installed: Mapping[str, str], manager: str, context: HostContext) -> List[str]:
    """One line per companion rule turned on; with the dcgm-exporter rule, one per installed version newer than its
    table knows ("unknown to gpuguard's table dated D": reported, not judged)."""
    section = policy.section("companions")
    if not section:
        return []
    lines = [f"companion.{field}: {companions.DESCRIPTIONS['companion.' + field]} "
             f"[{policy.action_for(section.get('action'))}]" for field in companions.RULE_FIELDS if section.get(field)]
    if section.get("dcgm_exporter"):
        table = exporter_table(policy)
        lines += [f"companion.dcgm_exporter: judged by gpuguard's {table.named()}"]
        lines += [f"companion.dcgm_exporter: {item.message} [info]"
                  for item in companions.unknown_to_table(installed, table)]
    return lines


def compiled(source: CompileSource) -> Dict[str, Any]:
    """``companions``: the section as validated; no key at all without one. With the dcgm-exporter rule on,
    ``knowledge``: the dcgm-exporter table in use (the package's or the bundle's, agent/policy/knowledge_files.py),
    so the hook judges with it without reading TOML."""
    section = source.section("companions")
    if section is None:
        return {}
    if not section.get("dcgm_exporter"):
        return {"companions": section}
    table = source.knowledge(companions.EXPORTER_TABLE_NAME)
    return {"companions": section, "knowledge": {companions.EXPORTER_TABLE_NAME: table}}


def guarded(source: CompileSource) -> List[str]:
    """The packages of each rule turned on (fabric manager's follow the [nvidia] driver globs)."""
    section = source.section("companions")
    if section is None:
        return []
    nvidia = source.section("nvidia")
    driver = nvidia["driver_packages"] if nvidia else DEFAULT_NVIDIA_DRIVER_PACKAGES
    return [pattern for rule in companions.RULE_FIELDS if section[rule]
            for pattern in companions.family(f"companion.{rule}", driver)]


def shape(data: Mapping[str, Any]) -> None:
    from agent.policy.compiled import action, expect, optional_bool, table

    section = table(data["companions"], "companions", (*companions.RULE_FIELDS, "action"))
    for key in companions.RULE_FIELDS:
        optional_bool(section[key], f"companions -> {key}")
    action(section["action"], "companions -> action")
    if section["dcgm_exporter"]:
        knowledge = data.get("knowledge")
        compiled_table = knowledge.get(companions.EXPORTER_TABLE_NAME) if isinstance(knowledge, dict) else None
        try:
            companions.exporter_table(compiled_table)
        except ValueError as exc:
            expect(False, f"knowledge -> {companions.EXPORTER_TABLE_NAME}", f"{exc} (the dcgm_exporter rule "
                                                                            f"judges by it)")


def freeze(host: FreezeHost) -> List[str]:
    """``[companions]``: each rule on where the host has its packages and they agree now; off, saying why, where
    they already disagree (fix the host, then turn it on) or the host has none of them."""
    from agent.hostfacts.package_keys import package_name
    from agent.policy.globs import any_glob

    installed = host.installed
    names = {package_name(k) for k in installed}
    binding = host.context.amdsmi_binding
    driver = list(DEFAULT_NVIDIA_DRIVER_PACKAGES)
    present = {
        "fabricmanager": any_glob(companions.FABRICMANAGER_PACKAGES),
        "dcgm": any_glob(companions.DCGM_PACKAGES),
        "dcgm_exporter": any_glob(companions.DCGM_EXPORTER_PACKAGES),
        "amdsmi": any_glob(companions.AMDSMI_BINDING_PACKAGES + companions.AMDSMI_LIBRARY_PACKAGES),
    }
    found = {
        "fabricmanager": companions.fabricmanager(installed, driver, host.context.loaded("nvidia"),
                                                  tuple(NVIDIA_NOT_DRIVER_PARTS)),
        "dcgm": companions.dcgm(installed),
        "dcgm_exporter": companions.dcgm_exporter(installed, host.exporter_table),
        "amdsmi": companions.amdsmi(installed, binding, active_release=host.context.active_tree.release
                                    if host.context.active_tree else None),
    }
    have = {rule: any(match(n) for n in names) or (rule == "amdsmi" and binding is not None)
            for rule, match in present.items()}
    if not any(have.values()):
        return []
    lines = ["", "[companions]  # packages that must stay paired with what they serve"]
    for rule in companions.RULE_FIELDS:
        what = companions.DESCRIPTIONS[f"companion.{rule}"]
        if not have[rule]:
            lines.append(host.line(rule, False, f"none of its packages is installed now ({what})"))
        elif found[rule]:
            lines.append(host.line(rule, False, f"OFF: the host disagrees now ({found[rule][0].message}); put it "
                                                f"right, then set true"))
        else:
            lines.append(host.line(rule, True, what))
    return lines
