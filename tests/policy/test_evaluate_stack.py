"""Pairings judge the whole stack: every NVIDIA driver part, every CUDA and ROCm release present, mixed hosts."""

from __future__ import annotations

from pathlib import Path
from typing import Dict, List

import pytest

from agent.errors import InputFileError
from agent.policy.compiled import check_compiled
from agent.policy.evaluate import HostState, evaluate, introduced
from agent.policy.globs import any_glob
from agent.policy.load import compile_policy, compiled_from, load_policy

NV = "580.95.05-0ubuntu0.24.04.2"  # one exact build, as Ubuntu 24.04 ships the 580 driver
NV_NEW = "580.105.08-0ubuntu0.24.04.1"
# Ubuntu 24.04 with NVIDIA's CUDA repository: the open driver at one build, CUDA 13.0, the container toolkit.
UBUNTU_NVIDIA = {
    "nvidia-driver-580-open": NV, "nvidia-dkms-580-open": NV, "nvidia-kernel-common-580": NV,
    "nvidia-kernel-source-580-open": NV, "libnvidia-compute-580": NV, "libnvidia-gl-580": NV,
    "nvidia-utils-580": NV, "nvidia-compute-utils-580": NV, "cuda-drivers-580": "580.95.05-1",
    "cuda-drivers": "580.95.05-1", "cuda-toolkit-13-0": "13.0.2-1", "cuda-toolkit-13": "13.0.2-1",
    "cuda-cudart-13-0": "13.0.96-1", "cuda-compat-13-0": "580.95.05-0ubuntu1",  # versioned after the driver
    "nvidia-driver-assistant": "0.22.65.06-1",  # NVIDIA's installer helper: not a driver part
    "nvidia-container-toolkit": "1.17.8-1", "nvidia-container-toolkit-base": "1.17.8-1",
    "libnvidia-container1": "1.17.8-1", "libnvidia-container-tools": "1.17.8-1", "vim": "2:9.1.0016-1ubuntu7",
}
D62, R62 = "1:6.8.5.60202-2041575.24.04", "6.2.2.60202-116~24.04"
AMD = {"amdgpu-dkms": D62, "amdgpu-dkms-firmware": D62, "rocm-core": R62, "rocm": R62,
       "hip-runtime-amd": "6.2.41134.60202-116~24.04"}

POLICY = """
[policy]
name = "stack"
[[nvidia.pairing]]
name = "r580-cuda13.0"
driver = "580.95.05"
cuda = "13.0.*"
[[amd.pairing]]
name = "rocm-6.2"
amdgpu = "6.2.*"
rocm = "6.2.*"
[[versions]]
name = "container-toolkit"
packages = ["nvidia-container-toolkit*", "libnvidia-container*"]
allow = ">= 1.17.3, << 1.18"
"""


def _compiled(tmp_path: Path, text: str = POLICY):
    path = tmp_path / "p.toml"
    path.write_text(text)
    return compiled_from(load_policy(str(path)))


@pytest.fixture()
def compiled(tmp_path: Path):
    return _compiled(tmp_path)


def _after(base: Dict[str, str], **moves: str) -> Dict[str, str]:
    after = dict(base)
    for name, version in moves.items():
        name = name.replace("_", "-")
        if version == "-":
            del after[name]
        else:
            after[name] = version
    return after


def _rules(compiled, before: Dict[str, str], after: Dict[str, str]) -> List[str]:
    state = HostState(before=before, after=after)
    return sorted(v.rule for v in introduced(evaluate(state, compiled), state))


CASES = [
    ("the whole stack at the pinned build", {}, []),
    ("an unrelated upgrade", {"vim": "2:9.1.0016-1ubuntu7.1"}, []),
    ("libnvidia-compute alone to a newer build (NVML mismatch)", {"libnvidia-compute-580": NV_NEW},
     ["nvidia.driver_parts", "nvidia.pairing"]),
    ("nvidia-utils alone to a newer build", {"nvidia-utils-580": NV_NEW}, ["nvidia.driver_parts", "nvidia.pairing"]),
    ("cuda-drivers meta to a newer build", {"cuda-drivers": "580.105.08-1"},
     ["nvidia.driver_parts", "nvidia.pairing"]),
    ("CUDA 13.1 beside 13.0", {"cuda-toolkit-13-1": "13.1.0-1"}, ["nvidia.pairing"]),
    ("full-upgrade: the cuda-toolkit-13 meta pulls 13.1 in", {"cuda-toolkit-13": "13.1.0-1",
                                                              "cuda-toolkit-13-1": "13.1.0-1"}, ["nvidia.pairing"]),
    ("remove the driver meta, the rest stays", {"nvidia-driver-580-open": "-"}, ["nvidia.driver_removed"]),
    ("remove the dkms module (apt takes the meta with it)", {"nvidia-dkms-580-open": "-",
                                                             "nvidia-driver-580-open": "-"},
     ["nvidia.driver_removed"]),
    ("switch to the proprietary flavour at the same build", {
        "nvidia-driver-580-open": "-", "nvidia-dkms-580-open": "-", "nvidia-kernel-source-580-open": "-",
        "nvidia-driver-580": NV, "nvidia-dkms-580": NV, "nvidia-kernel-source-580": NV}, []),
    ("remove the whole driver under CUDA", {k.replace("-", "_"): "-" for k in UBUNTU_NVIDIA
                                            if k.startswith(("nvidia-d", "nvidia-k", "libnvidia-compute",
                                                             "libnvidia-gl", "nvidia-utils", "nvidia-compute",
                                                             "cuda-drivers"))
                                            and k != "nvidia-driver-assistant"}, ["nvidia.pairing"]),
    ("container toolkit libraries past the rule", {"libnvidia-container1": "1.18.0-1",
                                                   "libnvidia-container-tools": "1.18.0-1"},
     ["versions.container-toolkit", "versions.container-toolkit"]),
    ("NVIDIA's installer helper moves on its own", {"nvidia-driver-assistant": "0.23.1-1"}, []),
]


@pytest.mark.parametrize("label, moves, expected", CASES, ids=[c[0] for c in CASES])
def test_nvidia_stack(compiled, label: str, moves: Dict[str, str], expected: List[str]) -> None:
    """Each operator move on a realistic Ubuntu 24.04 NVIDIA host is judged as the whole stack demands."""
    assert _rules(compiled, UBUNTU_NVIDIA, _after(UBUNTU_NVIDIA, **moves)) == expected


def test_the_mismatch_message_names_both_builds(compiled) -> None:
    """The driver-parts violation names each build with its packages, and only the moved part is blamed."""
    state = HostState(before=UBUNTU_NVIDIA, after=_after(UBUNTU_NVIDIA, libnvidia_compute_580=NV_NEW))
    by_rule = {v.rule: v for v in evaluate(state, compiled)}
    assert "580.105.08 (libnvidia-compute-580)" in by_rule["nvidia.driver_parts"].message
    assert "580.95.05 (cuda-drivers, cuda-drivers-580, libnvidia-gl-580 and 6 more)" in \
        by_rule["nvidia.driver_parts"].message
    pairing = by_rule["nvidia.pairing"]
    assert pairing.packages == {"libnvidia-compute-580": f"{NV} -> {NV_NEW}"}
    assert "breaks the pinned NVIDIA pairing 'r580-cuda13.0'" in pairing.message


def test_removal_names_the_parts_left_behind(compiled) -> None:
    """Removing parts of the NVIDIA driver is a driver_removed violation naming each removed part."""
    state = HostState(before=UBUNTU_NVIDIA, after=_after(UBUNTU_NVIDIA, nvidia_dkms_580_open="-",
                                                         nvidia_driver_580_open="-"))
    (violation,) = [v for v in evaluate(state, compiled) if v.rule == "nvidia.driver_removed"]
    assert violation.message.startswith("removing nvidia-dkms-580-open, nvidia-driver-580-open leaves the NVIDIA "
                                        "driver 580.95.05 incomplete")
    assert violation.packages == {"nvidia-dkms-580-open": f"{NV} -> (removed)",
                                  "nvidia-driver-580-open": f"{NV} -> (removed)"}


SIDE_BY_SIDE = """
[policy]
name = "two-cudas"
[nvidia]
side_by_side = {allowed}
[[nvidia.pairing]]
name = "r580"
driver = "580.*"
cuda = ["13.0.*", "13.1.*"]
"""


@pytest.mark.parametrize("allowed, expected", [("false", ["nvidia.cuda_side_by_side"]), ("true", [])])
def test_side_by_side_cuda_is_the_policys_choice(tmp_path: Path, allowed: str, expected: List[str]) -> None:
    """Two CUDA releases that both pair with the driver: allowed only with side_by_side = true."""
    compiled = _compiled(tmp_path, SIDE_BY_SIDE.format(allowed=allowed))
    assert _rules(compiled, UBUNTU_NVIDIA, _after(UBUNTU_NVIDIA, cuda_toolkit_13_1="13.1.0-1")) == expected


def test_a_whole_stack_upgrade_the_policy_allows_passes(tmp_path: Path) -> None:
    """Moving every part of the NVIDIA driver together to a release the policy allows breaks no rule."""
    compiled = _compiled(tmp_path, SIDE_BY_SIDE.format(allowed="false"))
    moves = {k: (NV_NEW if v == NV else v) for k, v in UBUNTU_NVIDIA.items()}
    moves.update({"cuda-drivers": "580.105.08-1", "cuda-drivers-580": "580.105.08-1"})
    assert _rules(compiled, UBUNTU_NVIDIA, moves) == []


DEBIAN_535 = "535.247.01-1~deb12u1"
DEBIAN_NVIDIA = {n: DEBIAN_535 for n in ("nvidia-driver", "nvidia-driver-libs", "nvidia-kernel-dkms",
                                         "nvidia-kernel-support", "nvidia-alternative", "libcuda1", "libnvidia-ml1",
                                         "nvidia-smi")}


def test_debian_driver_parts_are_judged_too(tmp_path: Path) -> None:
    """Debian 12's packaging of the driver: libnvidia-ml1 alone at another build is a parts mismatch."""
    compiled = _compiled(tmp_path, '[policy]\nname = "deb"\n[[nvidia.pairing]]\nname = "r535"\ndriver = "535.*"\n'
                                   'cuda = "any"\n')
    after = {**DEBIAN_NVIDIA, "libnvidia-ml1": "535.261.03-1~deb12u1"}
    assert _rules(compiled, DEBIAN_NVIDIA, after) == ["nvidia.driver_parts"]
    assert _rules(compiled, DEBIAN_NVIDIA, _after(DEBIAN_NVIDIA, nvidia_smi="-")) == ["nvidia.driver_removed"]


# --- AMD: versioned side-by-side ROCm, driver and firmware ------------------------------------------------------

AMD_CASES = [
    ("the pinned stack", {}, []),
    ("apt install rocm6.4.1 beside ROCm 6.2", {"rocm6.4.1": "6.4.1.60401-83~24.04",
                                               "rocm-core6.4.1": "6.4.1.60401-83~24.04"}, ["amd.pairing"]),
    ("a versioned 6.2 install beside 6.2 (same release)", {"rocm-core6.2.2": R62}, []),
    ("firmware alone to another build", {"amdgpu-dkms-firmware": "1:6.10.5.60300-2084815.24.04"},
     ["amd.driver_parts"]),
]


@pytest.mark.parametrize("label, moves, expected", AMD_CASES, ids=[c[0] for c in AMD_CASES])
def test_amd_stack(compiled, label: str, moves: Dict[str, str], expected: List[str]) -> None:
    """Each AMD stack move of the table breaks exactly the rules listed for it."""
    assert _rules(compiled, AMD, _after(AMD, **moves)) == expected


def test_side_by_side_rocm_is_the_policys_choice(tmp_path: Path) -> None:
    """ROCm 6.4.1 beside 6.2 with both paired: refused unless [amd] side_by_side = true."""
    text = ('[policy]\nname = "two-rocms"\n[amd]\nside_by_side = {}\n[[amd.pairing]]\nname = "multi"\n'
            'amdgpu = "6.2.*"\nrocm = ["6.2.*", "6.4.*"]\n')
    after = {**AMD, "rocm-core6.4.1": "6.4.1.60401-83~24.04"}
    assert _rules(_compiled(tmp_path, text.format("false")), AMD, after) == ["amd.rocm_side_by_side"]
    assert _rules(_compiled(tmp_path, text.format("true")), AMD, after) == []


def test_the_versioned_rocm_names_its_release(compiled) -> None:
    """A versioned rocm-core6.4.1 beside rocm-core is judged as ROCm 6.4.1 and named in the violation."""
    after = {**AMD, "rocm-core6.4.1": "6.4.1.60401-83~24.04"}
    (violation,) = evaluate(HostState(before=AMD, after=after), compiled)
    assert "rocm-core 6.2.2.60202-116~24.04 (ROCm 6.2.2) and rocm-core6.4.1 6.4.1.60401-83~24.04 (ROCm 6.4.1)" \
        in violation.message
    assert "rocm-core6.4.1" in violation.packages


def test_a_mixed_host_is_judged_on_both_sides_at_once(compiled) -> None:
    """An AMD + NVIDIA lab host: one transaction breaking both pairings gets both violations."""
    before = {**UBUNTU_NVIDIA, **AMD}
    after = {**before, "rocm-core6.4.1": "6.4.1.60401-83~24.04", "libnvidia-compute-580": NV_NEW}
    assert _rules(compiled, before, after) == ["amd.pairing", "nvidia.driver_parts", "nvidia.pairing"]
    assert _rules(compiled, before, {**before, "vim": "2:9.2"}) == []


# --- what the rules read is guarded (the apt hook reads only guarded packages' installed versions) -------------


def test_every_package_the_rules_read_is_guarded(tmp_path: Path) -> None:
    """Every package the NVIDIA and AMD rules read is in the compiled guarded set."""
    path = tmp_path / "p.toml"
    path.write_text(POLICY)
    guarded = any_glob(compile_policy(load_policy(str(path)))["guarded"])
    read = [k for k in {**UBUNTU_NVIDIA, **AMD, "rocm-core6.4.1": "x"} if k not in ("vim",)]
    assert [k for k in read if not guarded(k)] == []


def test_side_by_side_of_the_wrong_type_is_refused_by_the_compiled_check(tmp_path: Path) -> None:
    """A compiled policy whose side_by_side is not a boolean is refused naming the field."""
    path = tmp_path / "p.toml"
    path.write_text(POLICY)
    data = compile_policy(load_policy(str(path)))
    data["nvidia"]["side_by_side"] = "yes"
    with pytest.raises(InputFileError, match="nvidia -> side_by_side: not true or false"):
        check_compiled(data, "p.json")
