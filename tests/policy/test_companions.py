"""Companion pairings (agent/policy/companions.py) as the evaluator, ``policy explain``, ``policy freeze`` and the
semantic check judge them: fabric manager exactly the driver's build, DCGM of one release, dcgm-exporter within the
DCGM series it was built for, the amdsmi binding and libamd_smi of one ROCm release."""

from __future__ import annotations

from pathlib import Path
from typing import Dict, List, Optional

import pytest

from agent.errors import InputFileError
from agent.hostfacts.context import ACTIVE_TREE, AMDSMI_BINDING, NVIDIA_MODULE, HostContext
from agent.policy.compiled import CompiledPolicy, check_compiled
from agent.policy.evaluate import HostState, evaluate, facts_used, introduced
from agent.policy.explain import HostFacts, explain
from agent.policy.freeze import FreezeFacts, render_freeze
from agent.policy.load import compile_policy, compiled_from, load_policy
from agent.policy.semantic import Inventory, check_policy

NV, NV_NEW = "580.95.05-0ubuntu0.24.04.2", "580.105.08-0ubuntu0.24.04.1"
FM, FM_NEW = "580.95.05-1", "580.105.08-1"
# An HGX H200 on Ubuntu 24.04: the open 580 driver at one build, fabric manager and NSCQ from NVIDIA's repository.
HGX = {"nvidia-driver-580-open": NV, "nvidia-dkms-580-open": NV, "libnvidia-compute-580": NV, "nvidia-utils-580": NV,
       "nvidia-fabricmanager-580": FM, "libnvidia-nscq-580": FM, "vim": "2:9.1.0016-1ubuntu7"}
POLICY = """
[policy]
name = "companions"
[companions]
"""


def _compiled(tmp_path: Path, text: str = POLICY) -> CompiledPolicy:
    path = tmp_path / "p.toml"
    path.write_text(text)
    return compiled_from(load_policy(str(path)))


def _judge(policy: CompiledPolicy, before: Dict[str, str], after: Dict[str, str],
           context: Optional[HostContext] = None) -> List:
    state = HostState(before=before, after=after, context=context or HostContext())
    return introduced(evaluate(state, policy), state)


def _upgrade(base: Dict[str, str], names, version: str) -> Dict[str, str]:
    return {**base, **{n: version for n in names}}


DRIVER = ("nvidia-driver-580-open", "nvidia-dkms-580-open", "libnvidia-compute-580", "nvidia-utils-580")
PARTS = "(libnvidia-compute-580, nvidia-dkms-580-open, nvidia-driver-580-open, nvidia-utils-580)"


# --- the section ------------------------------------------------------------------------------------------------


def test_an_empty_section_turns_every_rule_on_and_guards_their_packages(tmp_path: Path) -> None:
    """``[companions]`` alone compiles all four rules on, and the compiled policy guards their packages and the
    NVIDIA driver's (the hook must see both sides)."""
    policy = _compiled(tmp_path)
    assert policy.section("companions") == {"fabricmanager": True, "dcgm": True, "dcgm_exporter": True,
                                            "amdsmi": True, "action": None}
    for pattern in ("nvidia-fabricmanager*", "libnvidia-nscq*", "libnvidia-compute-*", "datacenter-gpu-manager*",
                    "dcgm-exporter", "libamd-smi*", "amd-smi*"):
        assert pattern in policy.guarded
    assert facts_used(policy) == (NVIDIA_MODULE, AMDSMI_BINDING, ACTIVE_TREE)


def test_rules_turned_off_read_no_host_fact_and_count_as_no_rule(tmp_path: Path) -> None:
    """With fabricmanager and amdsmi off, the hook reads no host fact; a section with every rule off pins
    nothing and is refused like any empty policy."""
    policy = _compiled(tmp_path, POLICY + "fabricmanager = false\namdsmi = false\n")
    assert facts_used(policy) == ()
    with pytest.raises(Exception, match="defines no rules"):
        _compiled(tmp_path, POLICY + "fabricmanager = false\namdsmi = false\ndcgm = false\ndcgm_exporter = false\n")


@pytest.mark.parametrize("edit, fragment", [
    ({"fabricmanager": "yes"}, "companions -> fabricmanager: not true or false"),
    ({"action": "refuse"}, "companions -> action"),
])
def test_compiled_section_with_a_wrong_type_is_refused(tmp_path: Path, edit: Dict, fragment: str) -> None:
    """A hand-edited compiled policy whose companions table has a wrong type is malformed, not a rule dropped."""
    data = compile_policy(load_policy(str(_write(tmp_path, POLICY))))
    data["companions"] = {**data["companions"], **edit}
    with pytest.raises(InputFileError, match=fragment):
        check_compiled(data, "x.json")


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "p.toml"
    path.write_text(text)
    return path


# --- fabric manager ---------------------------------------------------------------------------------------------


def test_driver_upgrade_leaving_fabric_manager_behind_is_refused_naming_both_sides(tmp_path: Path) -> None:
    """The driver moving to 580.105.08 without fabric manager: both fabric manager and NSCQ name their build and
    the build the transaction leaves."""
    found = _judge(_compiled(tmp_path), HGX, _upgrade(HGX, DRIVER, NV_NEW))
    assert [v.rule for v in found] == ["companion.fabricmanager"] * 2
    messages = sorted(v.message for v in found)
    assert messages[1] == ("nvidia-fabricmanager-580 580.95.05 needs driver 580.95.05; the transaction leaves driver "
                           f"580.105.08 {PARTS}")
    assert messages[0].startswith("libnvidia-nscq-580 580.95.05 needs driver 580.95.05; the transaction leaves")
    assert found[0].action == "block"
    assert found[0].packages["libnvidia-compute-580"] == f"{NV} -> {NV_NEW}"
    assert "fabricmanager = false in [companions]" in found[0].hint


def test_fabric_manager_moving_with_the_driver_is_allowed(tmp_path: Path) -> None:
    """Driver, fabric manager and NSCQ moving to one build together break nothing."""
    after = _upgrade(_upgrade(HGX, DRIVER, NV_NEW), ("nvidia-fabricmanager-580", "libnvidia-nscq-580"), FM_NEW)
    assert _judge(_compiled(tmp_path), HGX, after) == []


def test_fabric_manager_upgraded_alone_is_refused(tmp_path: Path) -> None:
    """Fabric manager ahead of the driver is refused as well (it is the moving side)."""
    found = _judge(_compiled(tmp_path), HGX, {**HGX, "nvidia-fabricmanager-580": FM_NEW})
    assert [v.message for v in found] == [
        "nvidia-fabricmanager-580 580.105.08 needs driver 580.105.08; the transaction leaves driver 580.95.05 "
        + PARTS]


def test_rpm_fabric_manager_against_the_loaded_module_of_a_driver_no_package_carries(tmp_path: Path) -> None:
    """rpm's nvidia-fabric-manager with a .run driver: the loaded module is the driver it must match."""
    policy = _compiled(tmp_path)
    before = {"nvidia-fabric-manager": "580.95.05-1"}
    after = {"nvidia-fabric-manager": "580.105.08-1"}
    found = _judge(policy, before, after, HostContext(loaded_drivers={"nvidia": "580.95.05"}))
    assert [v.message for v in found] == [
        "nvidia-fabric-manager 580.105.08 needs driver 580.105.08; the transaction leaves driver 580.95.05 (the "
        "loaded nvidia module; no driver package)"]
    assert _judge(policy, after, before, HostContext(loaded_drivers={"nvidia": "580.95.05"})) == []


def test_removing_the_driver_under_fabric_manager_is_refused(tmp_path: Path) -> None:
    """Removing every driver package while fabric manager stays leaves it no driver."""
    after = {k: v for k, v in HGX.items() if k not in DRIVER}
    found = _judge(_compiled(tmp_path), HGX, after)
    assert {v.message.split(";")[1] for v in found} == {
        " the transaction leaves no NVIDIA driver (no driver package, no loaded nvidia module)"}
    assert found[0].packages["nvidia-driver-580-open"] == f"{NV} -> (removed)"


def test_the_rule_warns_when_its_action_says_so_and_ignores_unrelated_changes(tmp_path: Path) -> None:
    """``action = "warn"`` makes it a warning; a host that already disagrees is not blamed on an unrelated
    transaction."""
    policy = _compiled(tmp_path, POLICY + 'action = "warn"\n')
    broken = {**HGX, "libnvidia-nscq-580": "580.82.07-1"}
    assert [v.action for v in _judge(policy, HGX, broken)] == ["warn"]
    assert _judge(policy, broken, {**broken, "vim": "2:9.1.0016-1ubuntu8"}) == []


def test_explain_shows_the_rules_and_the_host_that_disagrees(tmp_path: Path) -> None:
    """``policy explain`` lists each companion rule with its action and the host's current disagreement."""
    broken = {**HGX, "libnvidia-nscq-580": "580.82.07-1"}
    explanation = explain(_compiled(tmp_path), HostFacts(installed=broken, manager="dpkg"))
    assert "companion.fabricmanager: fabric manager and libnvidia-nscq must be the NVIDIA driver's exact build " \
           "[block]" in explanation.lines
    assert ("  companion.fabricmanager [block]: libnvidia-nscq-580 580.82.07 needs driver 580.82.07; the host has "
            f"driver 580.95.05 {PARTS}") in explanation.lines


def test_freeze_turns_on_the_rules_whose_packages_the_host_has(tmp_path: Path) -> None:
    """Freeze writes ``[companions]`` with fabricmanager on (fabric manager installed, at the driver's build) and
    the rules whose packages are absent off, each line saying why; the policy it writes is valid."""
    text = render_freeze(FreezeFacts(installed=HGX, hostname="hgx", running_kernel="6.8.0-45-generic",
                                     context=HostContext("ubuntu", "24.04", loaded_drivers={"nvidia": "580.95.05"})))
    section = text[text.index("[companions]"):].split("\n\n")[0].splitlines()
    assert section[1].startswith("fabricmanager = true  # fabric manager and libnvidia-nscq must be")
    assert section[2].startswith("dcgm = false  # none of its packages is installed now")
    path = _write(tmp_path, text)
    assert compiled_from(load_policy(str(path))).section("companions")["fabricmanager"] is True
    assert "[companions]" not in render_freeze(FreezeFacts(installed={"vim": "2:9.1.0016-1ubuntu7"}, hostname="x"))


def test_freeze_leaves_a_rule_off_where_the_host_already_disagrees(tmp_path: Path) -> None:
    """NSCQ of another build than the driver: freeze writes fabricmanager = false with the disagreement."""
    broken = {**HGX, "libnvidia-nscq-580": "580.82.07-1"}
    text = render_freeze(FreezeFacts(installed=broken, hostname="hgx"))
    line = next(ln for ln in text.splitlines() if ln.startswith("fabricmanager = "))
    assert line.startswith("fabricmanager = false  # OFF: the host disagrees now (libnvidia-nscq-580 580.82.07 "
                           "needs driver 580.82.07; the host has driver 580.95.05")


def test_semantic_check_warns_about_rules_with_nothing_to_judge(tmp_path: Path) -> None:
    """``policy check`` against a host without DCGM or amdsmi packages: a warning for each rule that judges nothing
    there yet, none for fabric manager."""
    loaded = load_policy(str(_write(tmp_path, POLICY)))
    problems = check_policy(loaded.parts, loaded.policy, None, Inventory(installed=HGX))
    assert sorted((p.where, p.severity) for p in problems) == [
        ("companions -> amdsmi", "warning"), ("companions -> dcgm", "warning"),
        ("companions -> dcgm_exporter", "warning")]
    off = load_policy(str(_write(tmp_path, POLICY + "fabricmanager = false\namdsmi = false\ndcgm = false\n"
                                                    "dcgm_exporter = true\n")))
    assert not [p for p in check_policy(off.parts, off.policy, None, None) if p.where == "companions"]


# --- DCGM and dcgm-exporter -------------------------------------------------------------------------------------

DCGM_HOST = {"datacenter-gpu-manager-4-core": "1:4.6.1-1", "datacenter-gpu-manager-4-cuda13": "1:4.6.1-1",
             "datacenter-gpu-manager-4-proprietary": "1:4.6.1-1", "dcgm-exporter": "4.8.4-ubuntu24.04u1"}


def test_dcgm_split_across_releases_is_refused_naming_each_release(tmp_path: Path) -> None:
    """4.7.1's core beside 4.7.0's cuda13 package (rpm versions, epoch 1): libdcgm and nv-hostengine of two
    releases, refused with both named."""
    policy = _compiled(tmp_path, POLICY + "dcgm_exporter = false\n")
    before = {"datacenter-gpu-manager-4-core": "1:4.7.0-1", "datacenter-gpu-manager-4-cuda13": "1:4.7.0-1"}
    found = _judge(policy, before, {**before, "datacenter-gpu-manager-4-core": "1:4.7.1-1"})
    assert [v.message for v in found] == [
        "DCGM's packages are not one release: 4.7.0 (datacenter-gpu-manager-4-cuda13), 4.7.1 "
        "(datacenter-gpu-manager-4-core); libdcgm and nv-hostengine of different releases fail with 'API version "
        "mismatch'"]
    assert _judge(policy, before, {k: "1:4.7.1-1" for k in before}) == []


def test_dcgm_3_beside_dcgm_4_is_two_releases(tmp_path: Path) -> None:
    """The monolithic DCGM 3 package left beside DCGM 4's split packages is judged like any split."""
    policy = _compiled(tmp_path, POLICY + "dcgm_exporter = false\n")
    found = _judge(policy, {"datacenter-gpu-manager": "1:3.3.6"},
                   {"datacenter-gpu-manager": "1:3.3.6", "datacenter-gpu-manager-4-core": "1:4.5.2-1"})
    assert [v.rule for v in found] == ["companion.dcgm"]


@pytest.mark.parametrize("version, expected", [
    ("4.8.4-ubuntu24.04u1", ("4.8.4", "4.6.1", ("4.6",))),  # Microsoft's build: the exporter's version only
    ("4.9.0-1", ("4.9.0", "4.7.0", ("4.7",))),
    ("4.8.3-1.el9", ("4.8.3", "4.6.0", ("4.6",))),
    ("1:4.5.2-4.8.1-1", ("4.8.1", "4.5.2", ("4.5",))),  # the release tag's form: the pair is in the version
    ("4.4.1-4.5.2", ("4.5.2", "4.4.1", ("4.4",))),
    ("4.10.0-1", ("4.10.0", "4.8.0", ("4.8",))),  # released 2026-11-30 with DCGM 4.8.0
    ("4.8.9-1", None),  # a release the table does not know
    ("4.11.0-1", None),  # newer than the table's newest row
])
def test_exporter_versions_say_which_dcgm_they_were_built_for(version: str, expected) -> None:
    """Package versions carry the exporter's release (looked up in the table) or the ``<dcgm>-<exporter>`` pair."""
    from agent.policy.companions import exporter_pairing
    from agent.policy.knowledge_files import exporter_table_in_use

    found = exporter_pairing(version, exporter_table_in_use())
    assert (found[:3] if found else None) == expected


def test_exporter_beside_a_dcgm_of_another_series_is_refused(tmp_path: Path) -> None:
    """DCGM moving to 4.7 under dcgm-exporter 4.8.4 (built with 4.6.1): refused, naming both; the exporter
    moving with it to 4.9.0 passes; no DCGM at all is refused too."""
    policy = _compiled(tmp_path)
    dcgm = [k for k in DCGM_HOST if k != "dcgm-exporter"]
    found = _judge(policy, DCGM_HOST, _upgrade(DCGM_HOST, dcgm, "1:4.7.0-1"))
    assert [v.message for v in found] == [
        "dcgm-exporter 4.8.4 (built with DCGM 4.6.1) needs DCGM 4.6.x; the host has DCGM 4.7.0 "
        "(datacenter-gpu-manager-4-core, datacenter-gpu-manager-4-cuda13, datacenter-gpu-manager-4-proprietary)"]
    assert set(found[0].packages) == {"dcgm-exporter", *dcgm}
    assert _judge(policy, DCGM_HOST, {**_upgrade(DCGM_HOST, dcgm, "1:4.7.0-1"), "dcgm-exporter": "4.9.0-1"}) == []
    gone = _judge(policy, DCGM_HOST, {"dcgm-exporter": DCGM_HOST["dcgm-exporter"]})
    assert [v.message.split("; ")[1] for v in gone] == ["the host has no DCGM package"]


def test_explain_and_freeze_know_the_dcgm_rules(tmp_path: Path) -> None:
    """A host with DCGM 4.6.1 and the exporter built for it: explain is compliant and names both rules; freeze
    turns both on."""
    explanation = explain(_compiled(tmp_path), HostFacts(installed=DCGM_HOST, manager="dpkg"))
    assert explanation.violations == []
    assert any(ln.startswith("companion.dcgm_exporter: dcgm-exporter must run with a DCGM of the series")
               for ln in explanation.lines)
    text = render_freeze(FreezeFacts(installed=DCGM_HOST, hostname="dgx", running_kernel="6.8.0-45-generic"))
    assert "dcgm = true  # DCGM's packages must be one release" in text
    assert "dcgm_exporter = true  # dcgm-exporter must run with" in text
    assert '"datacenter-gpu-manager-4-core",  # installed 1:4.6.1-1' in text  # and frozen at its build


def test_the_exporter_table_has_a_date_a_source_per_row_and_the_4_10_0_row() -> None:
    """The shipped table file is dated, every row names its source and date, and dcgm-exporter 4.10.0 (DCGM 4.8.0)
    is its newest row, its source NVIDIA's dcgm-exporter releases page."""
    from agent.policy.knowledge_files import exporter_table_in_use

    table = exporter_table_in_use()
    assert (table.dated, table.origin) == ("2026-12-06", "package")
    assert all(row.source.strip() and row.date <= table.dated for row in table.rows)
    assert (table.newest.exporter, table.newest.dcgm, table.newest.series) == ("4.10.0", "4.8.0", ("4.8",))
    assert "https://github.com/NVIDIA/dcgm-exporter/releases" in table.newest.source


DCGM_48 = {"datacenter-gpu-manager-4-core": "1:4.8.0-1", "datacenter-gpu-manager-4-cuda13": "1:4.8.0-1",
           "dcgm-exporter": "4.10.0-1"}


def test_exporter_4_10_0_goes_with_dcgm_4_8_and_not_with_4_7(tmp_path: Path) -> None:
    """Exporter 4.10.0 beside DCGM 4.8.0 passes; DCGM moved back to 4.7.0 under it is refused naming 4.8.x."""
    policy = _compiled(tmp_path)
    assert _judge(policy, DCGM_48, DCGM_48) == []
    dcgm = [k for k in DCGM_48 if k != "dcgm-exporter"]
    found = _judge(policy, DCGM_48, _upgrade(DCGM_48, dcgm, "1:4.7.0-1"))
    assert [v.message.split(";")[0] for v in found] == ["dcgm-exporter 4.10.0 (built with DCGM 4.8.0) needs DCGM 4.8.x"]


def test_an_exporter_newer_than_the_table_is_reported_never_refused_for_being_new(tmp_path: Path) -> None:
    """dcgm-exporter 4.11.0 (and DCGM 4.9.0 beside it), newer than the table's newest row: the upgrade is not
    refused, ``policy explain`` and the semantic check say "unknown to gpuguard's table dated 2026-12-06"; an
    unknown release older than the newest row is still a violation."""
    from agent.policy.companions import unknown_to_table
    from agent.policy.knowledge_files import exporter_table_in_use

    shipped = exporter_table_in_use()
    policy = _compiled(tmp_path)
    newer = {**_upgrade(DCGM_48, ["datacenter-gpu-manager-4-core", "datacenter-gpu-manager-4-cuda13"], "1:4.9.0-1"),
             "dcgm-exporter": "4.11.0-1"}
    assert _judge(policy, DCGM_48, newer) == []
    assert [u.message for u in unknown_to_table(newer, shipped)] == [
        "dcgm-exporter 4.11.0-1 is unknown to gpuguard's dcgm-exporter table dated 2026-12-06 (from package; newest "
        "row: exporter 4.10.0 with DCGM 4.8.0): which DCGM it supports is not judged; update gpuguard",
        "DCGM 4.9.0 (datacenter-gpu-manager-4-core, datacenter-gpu-manager-4-cuda13) is unknown to gpuguard's "
        "dcgm-exporter table dated 2026-12-06 (from package; newest row: exporter 4.10.0 with DCGM 4.8.0): which "
        "dcgm-exporter it takes is not judged; update gpuguard"]
    assert unknown_to_table(DCGM_48, shipped) == [] and unknown_to_table(DCGM_HOST, shipped) == []
    explanation = explain(policy, HostFacts(installed=newer, manager="dpkg"))
    assert explanation.violations == []
    assert [ln for ln in explanation.lines if "unknown to gpuguard's dcgm-exporter table dated 2026-12-06" in ln][
        0].startswith("companion.dcgm_exporter: dcgm-exporter 4.11.0-1 is unknown")
    loaded = load_policy(str(_write(tmp_path, POLICY)))
    problems = check_policy(loaded.parts, loaded.policy, None, Inventory(installed=newer))
    assert [p.message for p in problems if p.where == "companions -> dcgm_exporter"] == [
        "dcgm-exporter 4.11.0-1 installed here is newer than gpuguard's dcgm-exporter table (dated 2026-12-06) "
        "knows: it is reported, not judged; update gpuguard"]
    older = _judge(policy, DCGM_48, {**DCGM_48, "dcgm-exporter": "4.9.9-1"})
    assert [v.rule for v in older] == ["companion.dcgm_exporter"]


def test_semantic_check_warns_about_an_exporter_the_table_does_not_know(tmp_path: Path) -> None:
    """``policy check`` on a host with an exporter release outside the table says the rule refuses changes
    while it is installed."""
    loaded = load_policy(str(_write(tmp_path, POLICY)))
    problems = check_policy(loaded.parts, loaded.policy, None,
                            Inventory(installed={**DCGM_HOST, "dcgm-exporter": "4.8.9-1"}))
    assert [p.message for p in problems if p.where == "companions -> dcgm_exporter"] == [
        "dcgm-exporter 4.8.9-1 installed here is not in gpuguard's dcgm-exporter table (dated 2026-12-06): "
        "changes to DCGM or the exporter are refused while it is installed; set dcgm_exporter = false or update "
        "gpuguard"]


# --- the amdsmi binding and libamd_smi --------------------------------------------------------------------------


@pytest.mark.parametrize("name, version, build", [
    ("amd-smi-lib", "26.0.2.70002-56~24.04", ("26.0.2", "7.0.2")),  # ROCm's code folded into amdsmi's version
    ("amd-smi-lib", "26.0.2.70002-56.el9", ("26.0.2", "7.0.2")),  # the rpm build reads the same
    ("amd-smi-lib", "24.7.1.60300-39~22.04", ("24.7.1", "6.3.0")),
    ("amd-smi-lib7.0.2", "26.0.2.70002-56~24.04", ("26.0.2", "7.0.2")),  # a side-by-side install
    ("python3-amdsmi", "26.1.0.70100-1", ("26.1.0", "7.1.0")),  # amdsmi 26.1.0 for ROCm 7.1, never "ROCm 26.1"
    ("python3-amdsmi", "27.0.0.71400-1", ("27.0.0", "7.14.0")),
    ("python3-amdsmi", "27.0.0.100000-1.el9", ("27.0.0", "10.0.0")),
    ("amdrocm-amdsmi7.13", "7.13.0-1", (None, "7.13.0")),  # TheRock: the ROCm release in the name and version
    ("amdrocm-amdsmi7.13", "7.13.0~pre2-25753625030", (None, "7.13.0")),
    ("amdrocm-amdsmi10.0", "10.0.0-4", (None, "10.0.0")),
    ("amdrocm-amdsmi", "10.0.0-4", (None, "10.0.0")),  # TheRock's unversioned alias
    ("libamd-smi27", "10.1-1", (None, "10.1")),  # Debian's library: the upstream version is the ROCm release
    ("libamd-smi0", "6.1.2-1", (None, "6.1.2")),
    ("amdsmi", "7.0.2", (None, "7.0.2")),  # the PyPI wheel
    ("amdsmi", "26.0.2", ("26.0.2", None)),  # amdsmi's own number and nothing folded in
])
def test_amdsmi_versions_read_as_amd_builds_them(name: str, version: str, build: tuple) -> None:
    """(amdsmi's own version, its ROCm release) of an amdsmi package or pip binding version, deb and rpm."""
    from agent.policy.releases import amdsmi_build

    assert amdsmi_build(name, version) == build


THEROCK_714 = {"amdrocm-amdsmi7.14": "7.14.0-1", "amdrocm-base7.14": "7.14.0-1"}


@pytest.mark.parametrize("version", ["27.0.0.71400-1", "27.0.0.71400-1.el9"])
def test_the_matching_7_14_binding_is_allowed(tmp_path: Path, version: str) -> None:
    """python3-amdsmi 27.0.0.71400 (amdsmi 27.0.0 for ROCm 7.14) beside TheRock 7.14's library passes, deb and rpm
    (today it reads as "ROCm 27.0" and is refused)."""
    assert _judge(_compiled(tmp_path), THEROCK_714, {**THEROCK_714, "python3-amdsmi": version}) == []


def test_a_7_1_binding_with_the_7_14_library_is_refused_naming_both_releases(tmp_path: Path) -> None:
    """python3-amdsmi 26.1.0.70100 beside TheRock 7.14's library is refused as ROCm 7.1 against ROCm 7.14.0."""
    found = _judge(_compiled(tmp_path), THEROCK_714, {**THEROCK_714, "python3-amdsmi": "26.1.0.70100-1"})
    assert [v.message for v in found] == [
        "python3-amdsmi 26.1.0.70100-1 (amdsmi 26.1.0 for ROCm 7.1.0) needs libamd_smi of ROCm 7.1; the transaction "
        "leaves libamd_smi of ROCm 7.14.0 (amdrocm-amdsmi7.14)"]


def test_a_pip_binding_in_amdsmi_numbering_matches_the_library_of_its_number(tmp_path: Path) -> None:
    """A pip binding numbered like the library (26.0.2, built from ROCm 7.0.2's tree) passes beside amd-smi-lib
    26.0.2.70002 and is refused beside 7.1's amd-smi-lib 26.1.0.70100, named by amdsmi's numbers."""
    policy = _compiled(tmp_path)
    context = HostContext(amdsmi_binding=("26.0.2", "/usr/lib/python3/dist-packages"))
    host = {"amd-smi-lib": "26.0.2.70002-56~24.04"}
    assert _judge(policy, host, host, context) == []
    assert [v.message for v in _judge(policy, host, {"amd-smi-lib": "26.1.0.70100-38~24.04"}, context)] == [
        "the pip amdsmi binding 26.0.2 (amdsmi 26.0.2; no ROCm release in its version) "
        "(/usr/lib/python3/dist-packages) needs libamd_smi of amdsmi 26.0; the transaction leaves libamd_smi of "
        "ROCm 7.1.0 (amd-smi-lib)"]


def test_debian_binding_and_library_of_one_release(tmp_path: Path) -> None:
    """Debian's amd-smi (the binding) beside libamd-smi0 of its own release passes; with the library moved to
    another release (or removed) it is refused naming both."""
    policy = _compiled(tmp_path)
    host = {"amd-smi": "6.1.2-1", "libamd-smi0": "6.1.2-1"}
    assert _judge(policy, {}, host) == []
    assert [v.message for v in _judge(policy, host, {**host, "libamd-smi0": "6.4.1-1"})] == [
        "amd-smi 6.1.2-1 needs libamd_smi of ROCm 6.1; the transaction leaves libamd_smi of ROCm 6.4.1 (libamd-smi0)"]
    assert [v.message for v in _judge(policy, host, {"amd-smi": "6.1.2-1"})] == [
        "amd-smi 6.1.2-1 needs libamd_smi of ROCm 6.1; the transaction leaves no amdsmi library package"]


def test_pip_binding_judged_against_every_library_release_present(tmp_path: Path) -> None:
    """A pip amdsmi 7.13.0 binding on a host with classic ROCm 6.4 and TheRock 7.13 side by side passes (a library
    of its release is there); removing TheRock's amdsmi leaves it none."""
    policy = _compiled(tmp_path)
    context = HostContext(amdsmi_binding=("7.13.0", "/usr/local/lib/python3.12/dist-packages"))
    host = {"amd-smi-lib": "25.5.1.60401-83~24.04", "amdrocm-amdsmi7.13": "7.13.0-1"}
    assert _judge(policy, host, host, context) == []
    found = _judge(policy, host, {"amd-smi-lib": host["amd-smi-lib"]}, context)
    assert [v.message for v in found] == [
        "the pip amdsmi binding 7.13.0 (/usr/local/lib/python3.12/dist-packages) needs libamd_smi of ROCm 7.13; the "
        "transaction leaves libamd_smi of ROCm 6.4.1 (amd-smi-lib)"]
    assert set(found[0].packages) == {"amd-smi-lib", "amdrocm-amdsmi7.13"}


def test_freeze_with_a_pip_binding_that_disagrees_leaves_amdsmi_off(tmp_path: Path) -> None:
    """Freeze on a host whose pip binding (PyPI 7.0.2) sits on ROCm 6.4's library: amdsmi off, saying why."""
    text = render_freeze(FreezeFacts(installed={"amd-smi-lib": "25.5.1.60401-83~24.04"}, hostname="mi300x",
                                     context=HostContext(amdsmi_binding=("7.0.2", "/usr/local/lib/python3.12"
                                                                                  "/dist-packages"))))
    line = next(ln for ln in text.splitlines() if ln.startswith("amdsmi = "))
    assert line.startswith("amdsmi = false  # OFF: the host disagrees now (the pip amdsmi binding 7.0.2")


def test_the_fabric_manager_meta_package_is_a_companion_not_a_driver_part(tmp_path: Path) -> None:
    """cuda-drivers-fabricmanager-580 (NVIDIA's meta package, versioned after the driver) left behind is named as
    a companion that needs its build, not counted as a second driver build."""
    host = {**HGX, "cuda-drivers-fabricmanager-580": FM}
    found = _judge(_compiled(tmp_path), host, _upgrade(_upgrade(host, DRIVER, NV_NEW),
                                                       ("nvidia-fabricmanager-580", "libnvidia-nscq-580"), FM_NEW))
    assert [v.message for v in found] == [
        f"cuda-drivers-fabricmanager-580 580.95.05 needs driver 580.95.05; the transaction leaves driver 580.105.08 "
        f"{PARTS}"]


def test_amdsmi_is_judged_against_the_tree_the_alternative_points_at(tmp_path: Path) -> None:
    """With TheRock 7.14 and 10.0 side by side, python3-amdsmi 27.0.0.71400 passes while /opt/rocm/core points at
    7.14's tree and is a violation naming 10.0 once it points at 10.0's (both libraries are installed either way)."""
    from agent.hostfacts.alternatives import ActiveTree

    policy = _compiled(tmp_path)
    host = {"amdrocm-amdsmi7.14": "7.14.0-1", "amdrocm-amdsmi10.0": "10.0.0-4", "python3-amdsmi": "27.0.0.71400-1"}
    on = {tree: HostContext(active_tree=ActiveTree("core", "/opt/rocm/core", tree, "manual"))
          for tree in ("/opt/rocm/core-7.14", "/opt/rocm/core-10.0")}
    assert _judge(policy, host, host) == []  # no alternative read: every library present counts, as before
    assert evaluate(HostState(before=host, after=host, context=on["/opt/rocm/core-7.14"]), policy) == []
    found = evaluate(HostState(before=host, after=host, context=on["/opt/rocm/core-10.0"]), policy)
    assert [v.message for v in found] == [
        "python3-amdsmi 27.0.0.71400-1 (amdsmi 27.0.0 for ROCm 7.14.0) needs libamd_smi of ROCm 7.14; the host has "
        "libamd_smi of ROCm 10.0.0 (amdrocm-amdsmi10.0)"]
