"""ROCm as Debian and Ubuntu package it (no rocm-core, no amdgpu-dkms: the inbox driver) judged by an [amd] pairing:
HIP's runtime package carries the release, as in the snapshot."""

from __future__ import annotations

from pathlib import Path
from typing import Dict, List

from agent.policy.evaluate import HostState, evaluate
from agent.policy.load import compiled_from, load_policy

# Debian 13's ROCm (trixie, read 2026-12-06; docs/guard.md "GPU packages as the distributions ship them").
TRIXIE = {"libamdhip64-5": "5.7.1-6+deb13u1", "libhsa-runtime64-1": "6.1.2-3", "librocblas0": "5.5.1+dfsg-7",
          "libamd-comgr2": "6.0+git20231212.4510c28+dfsg-3+b2", "hipcc": "5.7.1-6+deb13u1"}
POLICY = """
[policy]
name = "debian-rocm"

[[amd.pairing]]
name = "debian-5.7"
amdgpu = "any"
rocm = "5.7.*"
"""


def _rules(tmp_path: Path, before: Dict[str, str], after: Dict[str, str]) -> List[str]:
    path = tmp_path / "policy.toml"
    path.write_text(POLICY)
    policy = compiled_from(load_policy(str(path)))
    return [f"{v.rule}: {v.message}" for v in evaluate(HostState(before, after, "dpkg"), policy)]


def test_a_pairing_judges_distribution_rocm_by_hips_package(tmp_path: Path) -> None:
    """Debian's HIP 5.7 meets a ROCm 5.7.* pairing; sid's HIP 6.4 is refused naming the package and its release."""
    assert _rules(tmp_path, TRIXIE, TRIXIE) == []
    moved = {**TRIXIE, "libamdhip64-5": "6.4.3-1"}
    found = _rules(tmp_path, TRIXIE, moved)
    assert len(found) == 1 and found[0].startswith("amd.pairing:"), found
    assert "libamdhip64-5 6.4.3-1" in found[0] and "6.4.3" in found[0]


def test_removing_hip_leaves_rocrs_release_to_judge(tmp_path: Path) -> None:
    """Without HIP's package the release falls to ROCr's (6.1.2 here), which the 5.7 pairing refuses."""
    without_hip = {k: v for k, v in TRIXIE.items() if k != "libamdhip64-5"}
    found = _rules(tmp_path, TRIXIE, without_hip)
    assert found and "libhsa-runtime64-1" in found[0], found
