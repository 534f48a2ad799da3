"""Rendering apt preferences from the policy, and which files pin apply may touch."""

from __future__ import annotations

from pathlib import Path

from agent.guard.apt.preferences import HEADER, plan_pin_files, render_pins
from agent.guard.pin_records import names_to_query
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
    files = render_pins(_policy(tmp_path), INSTALLED, AVAILABLE)
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
    exact, globs = names_to_query(_policy(tmp_path))
    assert {"amdgpu-dkms", "rocm-core", "nvidia-container-toolkit"} <= set(exact)
    assert "linux-image-*" in globs


def test_only_files_with_the_header_are_rewritten_or_removed() -> None:
    existing = {"gpuguard-forbidden.pref": HEADER + "\nold", "gpuguard-old.pref": HEADER + "\nstale",
                "gpuguard-frozen.pref": "operator's own file", "gpuguard-notes.pref": "mine"}
    wanted = {"gpuguard-forbidden.pref": HEADER + "\nnew", "gpuguard-frozen.pref": HEADER + "\nx"}
    changes = plan_pin_files(existing, wanted)
    assert changes.written == ["gpuguard-forbidden.pref"] and changes.removed == ["gpuguard-old.pref"]
    assert sorted(changes.foreign) == ["gpuguard-frozen.pref", "gpuguard-notes.pref"]
    assert plan_pin_files(wanted, wanted).unchanged == sorted(wanted)
