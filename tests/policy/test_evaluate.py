"""The pure evaluator over a table of state changes, and agreement between the in-memory and compiled-file forms."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, List

import pytest

from agent.hostfacts.context import GPU_TARGETS, NVIDIA_MODULE, OS_RELEASE, HostContext
from agent.policy.compiled import read_compiled
from agent.policy.evaluate import HostState, evaluate, facts_used, introduced
from agent.policy.load import compiled_from, load_policy, write_compiled
from agent.policy.matrix import load_matrix

REPO = Path(__file__).resolve().parents[2]
POLICY = """
[policy]
name = "table"
require_amd_matrix = true
[amd]
action = "rollback"
[[amd.pairing]]
name = "rocm-6.2"
amdgpu = "6.2.*"
rocm = "6.2.*"
kernels = ["6.8.0-4[0-3]-generic", "5.15.0-*-generic"]
[[amd.pairing]]
name = "rocm-6.3"
amdgpu = "6.3.*"
rocm = "6.3.*"
action = "warn"
[kernel]
allow = [">= 6.8.0-40-generic, << 6.8.0-50-generic", "5.15.0-*-generic"]
[[nvidia.pairing]]
name = "r580"
driver = "580.*"
cuda = "13.0.*"
[[versions]]
name = "ctk"
packages = ["nvidia-container-toolkit*"]
allow = ">= 1.17.3, << 1.18"
[frozen]
packages = ["linux-generic-hwe-22.04"]
action = "warn"
"""
D62, D63, D64 = "1:6.8.5.60202-2041575.22.04", "1:6.10.5.60300-2084815.22.04", "6.12.12.60400-2147987.22.04"
R62, R63, R64 = "6.2.2.60202-116~22.04", "6.3.0.60300-39~22.04", "6.4.0.60400-47~22.04"
BASE = {"amdgpu-dkms": D62, "rocm-core": R62, "linux-image-6.8.0-41-generic": "6.8.0-41.41",
        "linux-generic-hwe-22.04": "6.8.0.41.41", "vim": "2:8.2"}


def change(**moves: str) -> Dict[str, str]:
    after = dict(BASE)
    for key, value in moves.items():
        name = key.replace("_", "-")
        if value == "-":
            after.pop(name, None)
        else:
            after[name] = value
    return after


CASES = [
    ("nothing moves", BASE, []),
    ("unrelated package", change(vim="2:9.0"), []),
    ("pair upgrade to an allowed pairing", change(amdgpu_dkms=D63, rocm_core=R63), []),
    ("ROCm alone breaks the pairing", change(rocm_core=R63), [("amd.pairing", "rollback")]),
    ("driver alone breaks the pairing", change(amdgpu_dkms=D63), [("amd.pairing", "rollback")]),
    ("driver removed under ROCm", change(amdgpu_dkms="-"), [("amd.pairing", "rollback")]),
    ("pair in no pairing, also outside the matrix kernel-wise fine", change(amdgpu_dkms=D64, rocm_core=R64),
     [("amd.pairing", "rollback")]),
    ("kernel the driver does not support", {**BASE, "linux-image-6.8.0-44-generic": "6.8.0-44.44"},
     [("amd.pairing.kernels", "rollback")]),
    ("kernel outside the allow list", {**BASE, "linux-image-6.8.0-51-generic": "6.8.0-51.51"},
     [("amd.pairing.kernels", "rollback"), ("kernel.allow", "block")]),
    ("kernel series AMD does not list", {**BASE, "linux-image-5.19.0-50-generic": "5.19.0-50.50"},
     [("amd.pairing.kernels", "rollback"), ("kernel.allow", "block"), ("matrix.kernel", "block")]),
    ("allowed new kernel", {**BASE, "linux-image-6.8.0-43-generic": "6.8.0-43.43"}, []),
    ("frozen package moves (warn)", {**BASE, "linux-generic-hwe-22.04": "6.8.0.44.44"}, [("frozen", "warn")]),
    ("toolkit outside its versions", {**BASE, "nvidia-container-toolkit": "1.16.2-1"}, [("versions.ctk", "block")]),
    ("toolkit inside its versions", {**BASE, "nvidia-container-toolkit": "1.17.8-1"}, []),
    ("NVIDIA pairing broken", {**BASE, "nvidia-driver-580": "580.95.05-0ubuntu1",
                               "cuda-cudart-12-8": "12.8.90-1"}, [("nvidia.pairing", "block")]),
    ("NVIDIA pairing kept", {**BASE, "nvidia-driver-580": "580.95.05-0ubuntu1",
                             "cuda-cudart-13-0": "13.0.96-1"}, []),
]


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    path = tmp_path_factory.mktemp("p") / "p.toml"
    path.write_text(POLICY)
    return compiled_from(load_policy(str(path)), load_matrix(str(REPO / "policies/amd-compat-matrix.toml")))


def _verdict(violations) -> List[tuple]:
    return sorted((v.rule, v.action) for v in violations)


@pytest.mark.parametrize("label,after,expected", CASES, ids=[c[0] for c in CASES])
def test_evaluation_table(compiled, label: str, after: Dict[str, str], expected: List[tuple]) -> None:
    """Each move of the table from the base host is judged by the rules and actions listed for it, and no others."""
    state = HostState(before=BASE, after=after, context=HostContext("ubuntu", "22.04"))
    assert _verdict(introduced(evaluate(state, compiled), state)) == sorted(expected)


def test_compiled_file_gives_the_same_verdicts(compiled, tmp_path: Path) -> None:
    """What the hook reads (the JSON file) decides exactly like the in-memory compile, case by case."""
    write_compiled(str(tmp_path / "c.json"), compiled)
    from_file = read_compiled(str(tmp_path / "c.json"))
    for label, after, _ in CASES:
        state = HostState(before=BASE, after=after, context=HostContext("ubuntu", "22.04"))
        assert [v.to_dict() for v in evaluate(state, from_file)] == [v.to_dict() for v in evaluate(state, compiled)], \
            label
    assert json.loads((tmp_path / "c.json").read_text())["matrix"]["driver_rocm"]["6.2"][0] == "6.0"


def test_matrix_flags_unsupported_os_and_gpu(compiled) -> None:
    """With the matrix required, a Debian 12 host with a gfx950 GPU breaks matrix.os and matrix.gpu."""
    state = HostState(before={}, after=BASE, context=HostContext("debian", "12", ("gfx950",)))
    rules = {v.rule for v in evaluate(state, compiled)}
    assert {"matrix.os", "matrix.gpu"} <= rules


def test_facts_used_names_what_the_rules_read(compiled, tmp_path: Path) -> None:
    """AMD's matrix reads the OS and GPU targets, the NVIDIA rules the loaded module; pairings alone read none."""
    assert facts_used(compiled) == (OS_RELEASE, GPU_TARGETS, NVIDIA_MODULE)
    path = tmp_path / "p.toml"
    path.write_text('[policy]\nname = "t"\n[[amd.pairing]]\nname = "rocm-6.2"\namdgpu = "6.2.*"\nrocm = "6.2.*"\n')
    assert facts_used(compiled_from(load_policy(str(path)), None)) == ()


def test_breaking_message_names_the_pinned_pairing(compiled) -> None:
    """A ROCm move off the pairing names the pinned pairing, the packages old -> new, and the override as a hint."""
    state = HostState(before=BASE, after=change(rocm_core=R63))
    (violation,) = introduced(evaluate(state, compiled), state)
    assert "breaks the pinned AMD pairing 'rocm-6.2'" in violation.message
    assert violation.packages == {"amdgpu-dkms": D62, "rocm-core": f"{R62} -> {R63}"}
    assert "gpuguard override start" in violation.hint and violation.pairing == "rocm-6.2"


def test_old_violations_are_not_blamed_on_unrelated_changes(compiled) -> None:
    """A violation the host had before is not introduced by an unrelated change."""
    broken = change(rocm_core=R63)
    state = HostState(before=broken, after={**broken, "vim": "2:9.0"})
    assert evaluate(state, compiled) and not introduced(evaluate(state, compiled), state)


# --- a driver that no package carries (seen on the H200 VM: the host's module, CUDA 13 packages only) ---------

H200_PACKAGES = {"cuda-cudart-13-0": "13.0.96-1", "cuda-compat-13-0": "580.95.05-0ubuntu1", "vim": "2:9.1"}
H200_MODULE = HostContext(loaded_drivers={"nvidia": "580.159.04"})


def test_unpackaged_driver_is_judged_by_the_loaded_module(compiled) -> None:
    """No nvidia-driver-* package, module 580.159.04 loaded, CUDA 13.0: the r580 pairing holds."""
    state = HostState(before=H200_PACKAGES, after=H200_PACKAGES, context=H200_MODULE)
    assert [v for v in evaluate(state, compiled) if v.rule == "nvidia.pairing"] == []


def test_without_the_module_an_unpackaged_driver_is_still_a_violation(compiled) -> None:
    """Without the loaded module an NVIDIA host whose driver no package carries violates the pairing (driver none)."""
    state = HostState(before=H200_PACKAGES, after=H200_PACKAGES)
    (violation,) = [v for v in evaluate(state, compiled) if v.rule == "nvidia.pairing"]
    assert "NVIDIA driver none (-)" in violation.message


def test_cuda_move_away_from_the_loaded_module_is_blamed_on_the_cuda_package(compiled) -> None:
    """A CUDA move away from the loaded module's pairing is blamed on the CUDA package, naming only real packages."""
    after = {k: v for k, v in H200_PACKAGES.items() if k != "cuda-cudart-13-0"}
    after["cuda-cudart-12-8"] = "12.8.90-1"
    state = HostState(before=H200_PACKAGES, after=after, context=H200_MODULE)
    (violation,) = introduced(evaluate(state, compiled), state)
    assert violation.rule == "nvidia.pairing"
    assert "NVIDIA driver 580.159.04 (loaded nvidia module, no driver package) with CUDA 12.8.90" in violation.message
    assert "breaks the pinned NVIDIA pairing 'r580'" in violation.message
    assert "loaded nvidia module, no driver package" not in violation.packages  # only real packages are named
    assert "cuda-cudart-12-8" in violation.packages


def test_a_driver_package_wins_over_the_loaded_module(compiled) -> None:
    """Installing nvidia-driver-590 is judged by the package (the module changes at the next boot)."""
    after = {**H200_PACKAGES, "nvidia-driver-590": "590.44.01-0ubuntu1"}
    state = HostState(before=H200_PACKAGES, after=after, context=H200_MODULE)
    (violation,) = introduced(evaluate(state, compiled), state)
    assert "NVIDIA driver 590.44.01 (nvidia-driver-590)" in violation.message
