"""What a TheRock-only host is told, and what ``require_amd_matrix = true`` does for TheRock's releases, as
docs/guard.md says: a refusal names TheRock's release package (never "no rocm-core"), 7.14 and 10.0 are checked on
their driver alone, 7.13 and drivers AMD's table does not list are refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.hostfacts.context import HostContext
from agent.policy.evaluate import HostState, evaluate, introduced
from agent.policy.load import compiled_from, load_policy
from agent.policy.matrix import load_matrix
from tests.policy.test_evaluate_therock import therock

D3140 = "1:6.19.14.31400000-2364437.24.04"  # amdgpu 31.40, which AMD's table lists for ROCm 7.14 and 10.0
D3130 = "1:6.19.4.31300000-2337710.26.04"  # amdgpu 31.30: seen, not in AMD's table
T714 = {"amdgpu-dkms": D3140, "amdgpu-dkms-firmware": D3140, **therock("7.14", "7.14.0-1")}
PAIRING = '[amd]\n[[amd.pairing]]\nname = "7.14"\namdgpu = "31.40.*"\nrocm = "7.14.*"\n'


def _policy(tmp_path: Path, text: str):
    path = tmp_path / "p.toml"
    path.write_text('[policy]\nname = "rock"\n' + text)
    return compiled_from(load_policy(str(path)), load_matrix())


def test_removing_therock_names_its_release_package_not_rocm_core(tmp_path: Path) -> None:
    """Removing every amdrocm package of a TheRock-only 7.14 host is refused naming amdrocm-base7.14, the release
    package it loses, never "with no rocm-core"."""
    policy = _policy(tmp_path, PAIRING)
    after = {k: v for k, v in T714.items() if not k.startswith("amdrocm")}
    state = HostState(T714, after, "dpkg")
    pairing = [v for v in introduced(evaluate(state, policy), state) if v.rule == "amd.pairing"]
    assert len(pairing) == 1
    assert "with no amdrocm-base or amdrocm-base7.14 matches no allowed pairing" in pairing[0].message
    assert "rocm-core" not in pairing[0].message and "rocm-core" not in pairing[0].hint


def test_a_therock_host_without_its_base_package_is_named_by_therocks(tmp_path: Path) -> None:
    """A TheRock host whose base packages were already gone is said to have no amdrocm-base<release>."""
    policy = _policy(tmp_path, PAIRING)
    host = {k: v for k, v in T714.items() if not k.startswith("amdrocm-base")}
    found = [v for v in evaluate(HostState(host, host, "dpkg"), policy) if v.rule == "amd.pairing"]
    assert len(found) == 1 and "with no amdrocm-base<release> matches" in found[0].message


@pytest.mark.parametrize("release, version", [("7.14", "7.14.0-1"), ("10.0", "10.0.0-4")])
def test_require_amd_matrix_checks_7_14_and_10_0_on_their_driver_alone(tmp_path: Path, release: str,
                                                                      version: str) -> None:
    """require_amd_matrix = true: TheRock 7.14 and 10.0 on amdgpu 31.40 pass on any OS and GPU (no table for them);
    on amdgpu 31.30, which AMD's table does not list, they are refused as matrix.driver."""
    policy = _policy(tmp_path, 'require_amd_matrix = true\n[amd]\n[[amd.pairing]]\nname = "any"\namdgpu = "any"\n'
                               'rocm = "any"\n')
    context = HostContext("ubuntu", "26.04", ("gfx1201",))
    host = {"amdgpu-dkms": D3140, "amdgpu-dkms-firmware": D3140, **therock(release, version)}
    assert evaluate(HostState(host, host, "dpkg", context), policy) == []
    old = {**host, "amdgpu-dkms": D3130, "amdgpu-dkms-firmware": D3130}
    assert [v.rule for v in evaluate(HostState(old, old, "dpkg", context), policy)] == ["matrix.driver"]
