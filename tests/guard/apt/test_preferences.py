"""Rendering apt preferences from the policy, and which files pin apply may touch."""

from __future__ import annotations

from pathlib import Path

from agent.guard.apt.preferences import HEADER, plan_pin_files, render_pins
from agent.guard.pin_records import names_to_query, pin_records
from agent.policy.load import compiled_from, load_policy

POLICY = """
[policy]
name = "pins"
[[amd.pairing]]
name = "rocm-6.2"
amdgpu = "6.2.*"
rocm = "6.2.*"
kernels = ["6.1.0-2[67]-amd64"]
[[versions]]
name = "ctk"
packages = ["nvidia-container-toolkit"]
allow = ">= 1.17.3"
[frozen]
packages = ["linux-image-amd64"]
"""
INSTALLED = {"amdgpu-dkms": "1:6.8.5.60202-1", "rocm-core": "6.2.2.60202-116~12",
             "linux-image-6.1.0-26-amd64": "6.1.112-1", "linux-image-amd64": "6.1.112-1"}
AVAILABLE = {"amdgpu-dkms": ["1:6.10.5.60300-1", "1:6.8.5.60202-1", "1:6.8.5.60204-3"],
             "rocm-core": ["6.3.0.60300-39~12", "6.2.2.60202-116~12"],
             "linux-image-6.1.0-26-amd64": ["6.1.112-1"], "linux-image-6.1.0-27-amd64": ["6.1.115-1"],
             "linux-image-6.1.0-28-amd64": ["6.1.119-1"], "nvidia-container-toolkit": ["1.17.8-1", "1.16.2-1"]}


def _policy(tmp_path: Path):
    path = tmp_path / "p.toml"
    path.write_text(POLICY)
    return compiled_from(load_policy(str(path)))


def test_render_forbids_exact_versions_and_freezes_installed_ones(tmp_path: Path) -> None:
    """apt pins forbid (-1) each available version the policy refuses and hold (1001) frozen packages at their
    version."""
    files = render_pins(_policy(tmp_path), INSTALLED, AVAILABLE, context=None)
    assert set(files) == {"gpuguard-frozen.pref", "gpuguard-forbidden.pref"}
    frozen = files["gpuguard-frozen.pref"]
    assert frozen.startswith(HEADER)
    assert "Package: linux-image-amd64\nPin: version 6.1.112-1\nPin-Priority: 1001" in frozen
    forbidden = files["gpuguard-forbidden.pref"]
    for package, version in [("amdgpu-dkms", "1:6.10.5.60300-1"), ("rocm-core", "6.3.0.60300-39~12"),
                             ("linux-image-6.1.0-28-amd64", "6.1.119-1"), ("nvidia-container-toolkit", "1.16.2-1")]:
        assert f"Package: {package}\nPin: version {version}\nPin-Priority: -1" in forbidden
    for allowed in ("1:6.8.5.60204-3", "6.1.115-1", "1.17.8-1", "Pin: version 1:6.8.5.60202-1"):
        assert allowed not in forbidden


def test_names_to_query(tmp_path: Path) -> None:
    """The names to ask apt about are the policy's exact package names and its globs, kept apart."""
    exact, globs = names_to_query(_policy(tmp_path))
    assert {"amdgpu-dkms", "rocm-core", "nvidia-container-toolkit"} <= set(exact)
    assert "linux-image-*" in globs


def test_only_files_with_the_header_are_rewritten_or_removed() -> None:
    """pin apply rewrites or removes only preference files that carry gpuguard's header and leaves others alone."""
    existing = {"gpuguard-forbidden.pref": HEADER + "\nold", "gpuguard-old.pref": HEADER + "\nstale",
                "gpuguard-frozen.pref": "operator's own file", "gpuguard-notes.pref": "mine"}
    wanted = {"gpuguard-forbidden.pref": HEADER + "\nnew", "gpuguard-frozen.pref": HEADER + "\nx"}
    changes = plan_pin_files(existing, wanted)
    assert changes.written == ["gpuguard-forbidden.pref"] and changes.removed == ["gpuguard-old.pref"]
    assert sorted(changes.foreign) == ["gpuguard-frozen.pref", "gpuguard-notes.pref"]
    assert plan_pin_files(wanted, wanted).unchanged == sorted(wanted)


TWO_PAIRINGS = """
[policy]
name = "two"
[[amd.pairing]]
name = "rocm-6.2"
amdgpu = "6.2.*"
rocm = "6.2.*"
[[amd.pairing]]
name = "rocm-6.3"
amdgpu = "6.3.*"
rocm = "6.3.*"
"""
D62, D624, D63 = "1:6.8.5.60202-2041575.22.04", "1:6.8.5.60204-2055000.22.04", "1:6.10.5.60300-2084815.22.04"
R62, R624, R63 = "6.2.2.60202-116~22.04", "6.2.4.60204-139~22.04", "6.3.0.60300-39~22.04"
ON_62 = {"amdgpu-dkms": D62, "amdgpu-dkms-firmware": D62, "rocm-core": R62, "rocm-core6.2.2": R62}
ON_63 = {"amdgpu-dkms": D63, "amdgpu-dkms-firmware": D63, "rocm-core": R63, "rocm-core6.3.0": R63}
OFFERED = {"amdgpu-dkms": [D62, D624, D63], "amdgpu-dkms-firmware": [D62, D624, D63], "rocm-core": [R62, R624, R63],
           "rocm-core6.2.2": [R62], "rocm-core6.2.4": [R624], "rocm-core6.3.0": [R63]}


def _forbidden(tmp_path: Path, policy_text: str, installed: dict) -> dict:
    path = tmp_path / "two.toml"
    path.write_text(policy_text)
    _, forbidden = pin_records(compiled_from(load_policy(str(path))), installed, OFFERED, context=None)
    return {(p.package, p.version): p.why for p in forbidden}


def test_amd_pins_keep_the_host_on_its_current_pairing(tmp_path: Path) -> None:
    """ROCm 6.3 is in an allowed pairing, but beside the 6.2 driver the hook refuses it: forbidden, as is the 6.3
    driver and the versioned rocm-core6.3.0; ROCm 6.2.4 (same pairing, one series) stays available."""
    forbidden = _forbidden(tmp_path, TWO_PAIRINGS, ON_62)
    assert forbidden[("rocm-core", R63)].startswith("amd.pairing: breaks the pinned AMD pairing 'rocm-6.2'")
    assert forbidden[("rocm-core6.3.0", R63)].startswith("amd.pairing: ")
    assert ("amdgpu-dkms", D63) in forbidden
    assert ("rocm-core", R624) not in forbidden and ("rocm-core6.2.4", R624) not in forbidden
    assert all("run gpuguard pin apply again" in why for why in forbidden.values())


def test_amd_driver_parts_are_pinned_to_their_installed_build(tmp_path: Path) -> None:
    """The driver and its firmware must be one build: a newer build of either alone is refused, so both stay."""
    forbidden = _forbidden(tmp_path, TWO_PAIRINGS, ON_62)
    for name in ("amdgpu-dkms", "amdgpu-dkms-firmware"):
        assert forbidden[(name, D624)].startswith("amd.driver_parts: "), forbidden[(name, D624)]
        assert (name, D62) not in forbidden  # the installed build


def test_amd_pins_follow_the_host_after_a_move(tmp_path: Path) -> None:
    """Once the host is on the 6.3 pairing, pin apply keeps the 6.2 builds out instead."""
    forbidden = _forbidden(tmp_path, TWO_PAIRINGS, ON_63)
    assert {("rocm-core", R62), ("rocm-core", R624), ("rocm-core6.2.2", R62), ("amdgpu-dkms", D62),
            ("amdgpu-dkms", D624)} <= set(forbidden)
    assert ("rocm-core", R63) not in forbidden and ("amdgpu-dkms", D63) not in forbidden


def test_amd_pins_forbid_what_a_warn_action_only_warns_about(tmp_path: Path) -> None:
    """Pins keep out what the policy does not allow; the action only decides what the hook does about it."""
    forbidden = _forbidden(tmp_path, TWO_PAIRINGS + '\n[amd]\naction = "warn"\n', ON_62)
    assert ("rocm-core", R63) in forbidden


def test_names_to_query_covers_every_judged_amd_package(tmp_path: Path) -> None:
    """The names to query include the AMD firmware package and the versioned rocm-core names the rules judge."""
    exact, globs = names_to_query(_policy(tmp_path))
    assert "amdgpu-dkms-firmware" in exact and "rocm-core[0-9]*" in globs



def test_therock_pins_keep_the_next_release_out_with_its_companions(tmp_path: Path) -> None:
    """A host pinned to TheRock 7.13: amdrocm-base 10.0.0 and amdrocm-base10.0 are forbidden by the pairing (apt and
    dnf); on rpm every other amdrocm-* package at that build goes with them (one release at exact = requirements,
    else dnf's best update fails); 7.13's builds stay."""
    policy = tmp_path / "rock.toml"
    policy.write_text('[amd]\n[[amd.pairing]]\nname = "rock-7.13"\namdgpu = "any"\nrocm = "7.13.*"\n')
    old, new = "7.13.0-1.el9", "10.0.0-1.el9"
    installed = {"amdrocm-base": old, "amdrocm-base7.13": old, "amdrocm-core-sdk": old, "amdrocm-runtime7.13": old}
    offered = {"amdrocm-base": [old, new], "amdrocm-base7.13": [old], "amdrocm-base10.0": [new],
               "amdrocm-core-sdk": [old, new], "amdrocm-runtime10.0": [new], "amdrocm-runtime7.13": [old]}
    for manager in ("dpkg", "rpm"):
        _, pins = pin_records(compiled_from(load_policy(str(policy))), installed, offered, manager, context=None)
        forbidden = {(p.package, p.version): p.why for p in pins}
        assert forbidden[("amdrocm-base", new)].startswith("amd.pairing: breaks the pinned AMD pairing 'rock-7.13'")
        assert forbidden[("amdrocm-base10.0", new)].startswith("amd.pairing: ")
        assert not [key for key in forbidden if key[1] == old]
    assert forbidden[("amdrocm-core-sdk", new)].startswith("goes with amdrocm-base")
    assert forbidden[("amdrocm-runtime10.0", new)].startswith("goes with amdrocm-base")
