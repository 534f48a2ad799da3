"""ROCm built with TheRock (amdrocm-*) judged like classic ROCm: freeze pins it, the pairing refuses moving it, side
by side releases and mixed classic + TheRock hosts are judged as the sum of what is installed."""

from __future__ import annotations

from pathlib import Path
from typing import Dict

from agent.hostfacts.context import HostContext
from agent.policy.evaluate import HostState, evaluate, introduced
from agent.policy.freeze import FreezeFacts, render_freeze
from agent.policy.load import compiled_from, load_policy

DRIVER = "1:6.16.13.30300000-2278356.24.04"  # amdgpu 30.30, which AMD's driver table lists for ROCm 7.14 and 10.0


def therock(release: str, version: str, metas: bool = True) -> Dict[str, str]:
    """A TheRock release as installed: versioned packages (the content) and their non-versioned meta packages."""
    names = ("base", "sysdeps", "llvm", "runtime", "amdsmi", "blas", "rccl", "core", "core-sdk")
    out = {f"amdrocm-{n}{release}": version for n in names}
    if metas:
        out.update({f"amdrocm-{n}": version for n in ("core-sdk", "core", "amdsmi", "base")})
    return out


T713 = {"amdgpu-dkms": DRIVER, "amdgpu-dkms-firmware": DRIVER, **therock("7.13", "7.13.0-1")}
CLASSIC = {"rocm-core": "6.4.1.60401-83~24.04", "rocm-core6.4.1": "6.4.1.60401-83~24.04",
           "amd-smi-lib": "25.3.0.60401-83~24.04", "hip-runtime-amd": "6.4.43482.60401-83~24.04"}


def _frozen(tmp_path: Path, installed: Dict[str, str], manager: str = "dpkg", loaded: str = "6.16.13"):
    text = render_freeze(FreezeFacts(installed=installed, manager=manager, running_kernel="6.8.0-45-generic",
                                     context=HostContext("ubuntu", "24.04", loaded_drivers={"amdgpu": loaded}),
                                     hostname="rock"))
    path = tmp_path / "50-freeze.toml"
    path.write_text(text)
    return text, compiled_from(load_policy(str(path)))


def _judged(policy, before: Dict[str, str], after: Dict[str, str], manager: str = "dpkg"):
    state = HostState(before, after, manager)
    return introduced(evaluate(state, policy), state)


def test_freeze_pins_the_therock_release_and_its_exact_build(tmp_path: Path) -> None:
    """A TheRock 7.13 host freezes to ROCm 7.13.0 with the amdrocm-base builds exact and the rest frozen."""
    text, _ = _frozen(tmp_path, T713)
    assert 'rocm = "7.13.0"  # ROCm release (amdrocm-base 7.13.0-1, amdrocm-base7.13 7.13.0-1)' in text
    assert 'rocm_package = "7.13.0-1"  # these exact builds (amdrocm-base 7.13.0-1, amdrocm-base7.13 7.13.0-1): ' \
           'any other ROCm build is refused' in text
    assert '  "amdrocm-core-sdk7.13",  # installed 7.13.0-1' in text
    assert "side_by_side" not in text


def test_upgrade_from_7_13_to_10_0_under_the_pinned_pairing_is_refused(tmp_path: Path) -> None:
    """apt's upgrade of the meta packages to 10.0 (new amdrocm-*10.0 packages beside 7.13) breaks the pairing."""
    _, policy = _frozen(tmp_path, T713)
    after = {**T713, **therock("10.0", "10.0.0-4")}
    violations = _judged(policy, T713, after)
    pairing = [v for v in violations if v.rule == "amd.pairing"]
    assert len(pairing) == 1 and pairing[0].action == "block"
    assert "breaks the pinned AMD pairing 'frozen'" in pairing[0].message
    assert "amdrocm-base10.0 10.0.0-4 (ROCm 10.0.0)" in pairing[0].message
    assert pairing[0].packages["amdrocm-base10.0"] == "(not installed) -> 10.0.0-4"
    assert pairing[0].packages["amdrocm-base"] == "7.13.0-1 -> 10.0.0-4"


def test_removing_the_base_package_is_refused(tmp_path: Path) -> None:
    """Removing amdrocm-base7.13 (and with it everything that depends on it) leaves no ROCm: refused, with the
    driver installed and also on a host whose ROCm runs on the kernel's own driver."""
    for installed in (T713, therock("7.13", "7.13.0-1")):
        _, policy = _frozen(tmp_path, installed)
        after = {k: v for k, v in installed.items() if not k.startswith("amdrocm-")}
        rules = [v.rule for v in _judged(policy, installed, after)]
        assert "amd.pairing" in rules, installed.keys()


def test_a_second_therock_release_side_by_side_is_judged(tmp_path: Path) -> None:
    """A host frozen with 7.13 and 7.14 side by side keeps both; a third release, or dropping side_by_side, is not."""
    both = {**T713, **therock("7.14", "7.14.0-1", metas=False)}
    text, policy = _frozen(tmp_path, both)
    assert "side_by_side = true  # several ROCm releases are installed side by side now" in text
    assert 'rocm = ["7.13.0", "7.14.0"]' in text
    assert _judged(policy, both, dict(both)) == []
    third = {**both, **therock("10.0", "10.0.0-4", metas=False)}
    assert [v.rule for v in _judged(policy, both, third)] == ["amd.pairing"]
    strict = tmp_path / "strict.toml"
    strict.write_text('[amd]\n[[amd.pairing]]\nname = "two"\namdgpu = "30.30.*"\nrocm = ["7.13.*", "7.14.*"]\n')
    violations = _judged(compiled_from(load_policy(str(strict))), T713, both)
    assert [v.rule for v in violations] == ["amd.rocm_side_by_side"]
    assert "ROCm 7.13.0 (amdrocm-base), 7.13.0 (amdrocm-base7.13), 7.14.0 (amdrocm-base7.14): 2 ROCm releases " \
           "side by side" in violations[0].message


def test_mixed_classic_and_therock_host_is_judged_as_the_sum(tmp_path: Path) -> None:
    """Classic 6.4.1 beside TheRock 7.13: freeze pins both releases; moving either one is refused; removing the
    TheRock release is refused as well."""
    mixed = {**T713, **CLASSIC}
    text, policy = _frozen(tmp_path, mixed)
    assert 'rocm = ["6.4.1", "7.13.0"]' in text and "side_by_side = true" in text
    assert _judged(policy, mixed, dict(mixed)) == []
    classic_up = {**mixed, "rocm-core": "6.4.2.60402-120~24.04"}
    assert [v.rule for v in _judged(policy, mixed, classic_up)] == ["amd.pairing"]
    therock_up = {**mixed, **therock("10.0", "10.0.0-4")}
    assert "amd.pairing" in [v.rule for v in _judged(policy, mixed, therock_up)]
    gone = {k: v for k, v in mixed.items() if not k.startswith("amdrocm-")}
    assert {v.rule for v in _judged(policy, mixed, gone)} == {"frozen"}  # the release's packages are frozen


def test_arch_specific_and_component_packages_are_frozen(tmp_path: Path) -> None:
    """amdrocm-* components and the older gfx-specific forms (amdrocm-gfx942) are guarded and frozen exactly."""
    installed = {**T713, "amdrocm-gfx942": "7.13.0-1", "amdrocm-core-sdk-gfx942": "7.13.0-1"}
    text, policy = _frozen(tmp_path, installed)
    assert '  "amdrocm-gfx942",  # installed 7.13.0-1' in text
    moved = {**installed, "amdrocm-gfx942": "7.13.1-1"}
    assert [v.rule for v in _judged(policy, installed, moved)] == ["frozen"]


def test_rpm_therock_versions_are_judged_like_deb_ones(tmp_path: Path) -> None:
    """rpm hosts: amdrocm-base7.13 at 7.13.0-1.el9 pins ROCm 7.13.0; 10.0.0-1.el9 beside it is refused."""
    rpm = {"amdgpu-dkms": "1:6.16.13-2278356.el9", **{k: "7.13.0-1.el9" for k in therock("7.13", "")}}
    text, policy = _frozen(tmp_path, rpm, "rpm")
    assert 'rocm = "7.13.0"' in text
    after = {**rpm, **{k: "10.0.0-1.el9" for k in therock("10.0", "")}}
    assert "amd.pairing" in [v.rule for v in _judged(policy, rpm, after, "rpm")]


def test_removing_only_the_base_package_behind_apts_back_is_refused(tmp_path: Path) -> None:
    """dpkg --remove --force-depends amdrocm-base7.13 on a mixed host (the pairing still matches 6.4.1) is refused:
    the rest of 7.13 stays without its version component."""
    mixed = {**T713, **CLASSIC}
    _, policy = _frozen(tmp_path, mixed)
    after = {k: v for k, v in mixed.items() if k != "amdrocm-base7.13"}
    violations = [v for v in _judged(policy, mixed, after) if v.rule == "amd.rocm_base_removed"]
    assert len(violations) == 1 and violations[0].action == "block"
    assert violations[0].message.startswith("removing amdrocm-base7.13 7.13.0-1 leaves TheRock ROCm 7.13 without its "
                                            "base package (still installed: amdrocm-amdsmi7.13, amdrocm-blas7.13, ")


def test_the_matrix_knows_10_0_on_driver_30_30_and_names_7_13_as_unknown(tmp_path: Path) -> None:
    """require_amd_matrix: TheRock 10.0 on driver 30.30 passes (AMD's driver table lists it; OS and GPUs are not
    checked, there is no table); 7.13 is refused as a release the matrix does not know, naming its package."""
    from agent.policy.matrix import load_matrix

    path = tmp_path / "m.toml"
    path.write_text('[policy]\nrequire_amd_matrix = true\n[amd]\n[[amd.pairing]]\nname = "any"\namdgpu = "any"\n'
                    'rocm = "any"\n')
    policy = compiled_from(load_policy(str(path)), load_matrix())
    context = HostContext("ubuntu", "24.04", ("gfx950",))
    t10 = {"amdgpu-dkms": DRIVER, "amdgpu-dkms-firmware": DRIVER, **therock("10.0", "10.0.0-4")}
    assert evaluate(HostState({}, t10, "dpkg", context), policy) == []
    violations = evaluate(HostState({}, T713, "dpkg", context), policy)
    assert [v.rule for v in violations] == ["matrix.driver_rocm", "matrix.rocm"]
    assert violations[1].message == "ROCm 7.13.x (amdrocm-base 7.13.0-1) is not in AMD's compatibility matrix"
    assert "(amdrocm-base 7.13.0-1) on amdgpu driver 30.30.x" in violations[0].message


def test_a_31_60_driver_and_its_apart_versioned_firmware_are_one_build(tmp_path: Path) -> None:
    """amdgpu 31.60 (driver 1:7.1.9.31600000-2403767, firmware 1:31.60.0.0.31600000-2403767, as seen beside ROCm
    10.0) with the module reporting 7.1.9.31600000: freeze accepts them as one build, loaded and installed, and
    nothing is refused; another firmware build is amd.driver_parts."""
    driver, firmware = "1:7.1.9.31600000-2403767.26.04", "1:31.60.0.0.31600000-2403767.26.04"
    host = {"amdgpu-dkms": driver, "amdgpu-dkms-firmware": firmware, **therock("10.0", "10.0.0-4")}
    text, policy = _frozen(tmp_path, host, loaded="7.1.9.31600000")  # the module reports its release code too
    assert 'amdgpu = "31.60.0"' in text
    assert _judged(policy, host, dict(host)) == [] and evaluate(HostState(host, host), policy) == []
    other = {**host, "amdgpu-dkms-firmware": "1:31.60.0.0.31600000-2410000.26.04"}
    assert "amd.driver_parts" in [v.rule for v in _judged(policy, host, other)]


ACTIVE_TREE_POLICY = """
[policy]
name = "two-trees"
[amd]
side_by_side = true
active_tree = "pinned"
[[amd.pairing]]
name = "7.14+10.0"
amdgpu = "any"
rocm = ["7.14.*", "10.0.*"]
"""


def _on(tree: str) -> HostContext:
    from agent.hostfacts.alternatives import ActiveTree

    return HostContext(active_tree=ActiveTree("core", "/opt/rocm/core", tree, "manual"))


def test_active_tree_pinned_refuses_a_tree_no_release_package_carries(tmp_path: Path) -> None:
    """[amd] active_tree = "pinned" with 7.14 and 10.0 installed: core on either is fine, core on a 10.1 tarball
    tree is a violation naming it, and removing 10.0 while core points at its tree is refused; "any" judges none."""
    path = tmp_path / "p.toml"
    path.write_text(ACTIVE_TREE_POLICY)
    policy = compiled_from(load_policy(str(path)))
    both = {**therock("7.14", "7.14.0-1", metas=False), **therock("10.0", "10.0.0-4", metas=False)}
    for tree in ("/opt/rocm/core-7.14", "/opt/rocm/core-10.0"):
        assert evaluate(HostState(both, both, "dpkg", _on(tree)), policy) == []
    [found] = evaluate(HostState(both, both, "dpkg", _on("/opt/rocm/core-10.1")), policy)
    assert (found.rule, found.message) == ("amd.active_tree", (
        "the active ROCm tree /opt/rocm/core-10.1 (alternative core, manual) is not a pinned release: no installed "
        "release package carries ROCm 10.1 ([amd] active_tree = \"pinned\" in policy 'two-trees')"))
    assert "update-alternatives --set core <tree>" in (found.hint or "")
    without_10 = {k: v for k, v in both.items() if not k.endswith("10.0")}
    state = HostState(both, without_10, "dpkg", _on("/opt/rocm/core-10.0"))
    [refused] = introduced(evaluate(state, policy), state)
    assert refused.rule == "amd.active_tree" and "carries ROCm 10.0 after the change" in refused.message
    assert set(refused.packages) == {"amdrocm-base10.0"}
    path.write_text(ACTIVE_TREE_POLICY.replace('"pinned"', '"any"'))
    assert evaluate(HostState(both, both, "dpkg", _on("/opt/rocm/core-10.1")), compiled_from(load_policy(str(path)))) \
        == []


def test_freeze_pins_the_active_tree_where_an_alternative_chooses_a_packaged_one(tmp_path: Path) -> None:
    """policy freeze writes active_tree = "pinned" where update-alternatives points at a tree an installed release
    package carries, and leaves it out for a tree none carries or no alternative."""
    installed = {**T713, **therock("10.0", "10.0.0-4")}

    def frozen(tree: str = "") -> str:
        from agent.hostfacts.alternatives import ActiveTree

        chosen = ActiveTree("core", "/opt/rocm/core", tree, "auto") if tree else None
        return render_freeze(FreezeFacts(installed=installed, manager="dpkg", running_kernel="6.8.0-45-generic",
                                         context=HostContext("ubuntu", "24.04", active_tree=chosen), hostname="rock"))

    assert ('active_tree = "pinned"  # update-alternatives points at /opt/rocm/core-10.0 (alternative core, auto): a '
            'tree no installed release package carries is refused') in frozen("/opt/rocm/core-10.0")
    assert "active_tree" not in frozen("/opt/rocm/core-10.1") and "active_tree" not in frozen()
