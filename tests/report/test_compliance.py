"""The daemon's policy check over fixture snapshots."""

from __future__ import annotations

import shutil
from pathlib import Path

from agent.frozen import replace
from agent.policy.load import load_and_compile, write_compiled
from agent.report.compliance import check_snapshot
from agent.snapshot.take import take_snapshot
from agent.statepaths import StatePaths
from tests.conftest import ROOTS

REPO = Path(__file__).resolve().parents[2]


def test_no_compiled_policy_means_compliance_unknown(tmp_path: Path, fixture_host) -> None:
    """Without a compiled policy there is no verdict at all (None), not an empty list."""
    snap = take_snapshot(fixture_host("mi300x-rocm62-ubuntu2204"))
    assert check_snapshot(snap, str(tmp_path)) is None


def test_compiled_policy_is_read_under_the_root(tmp_path: Path, fixture_host) -> None:
    """With a foreign root the policy is read at <root>/<state_dir>, where the hook and the guard read it."""
    root, state = tmp_path / "root", Path("/var/lib/gpuguard")
    policy = tmp_path / "p.toml"
    policy.write_text('[policy]\nname = "t"\n[[amd.pairing]]\nname = "rocm-6.3"\namdgpu = "6.3.*"\nrocm = "6.3.*"\n')
    _, compiled = load_and_compile(str(policy))
    (root / state.relative_to("/")).mkdir(parents=True)
    write_compiled(str(root / state.relative_to("/") / "policy.compiled.json"), compiled)
    snap = take_snapshot(fixture_host("mi300x-rocm62-ubuntu2204"))
    assert check_snapshot(snap, str(state)) is None
    assert [v.rule for v in check_snapshot(snap, str(state), root=str(root))] == ["amd.pairing"]


def test_violations_come_back_as_report_payloads(tmp_path: Path, fixture_host) -> None:
    """A policy pinning ROCm 6.3 flags the fixture host's 6.2 stack."""
    policy = tmp_path / "p.toml"
    policy.write_text('[policy]\nname = "t"\n[[amd.pairing]]\nname = "rocm-6.3"\namdgpu = "6.3.*"\nrocm = "6.3.*"\n')
    _, compiled = load_and_compile(str(policy))
    write_compiled(str(tmp_path / "policy.compiled.json"), compiled)
    snap = take_snapshot(fixture_host("mi300x-rocm62-ubuntu2204"))
    violations = check_snapshot(snap, str(tmp_path))
    assert [v.rule for v in violations] == ["amd.pairing"]
    assert violations[0].kind == "policy_violation" and "rocm-core" in violations[0].packages


def _without_driver_packages(snap):
    """The fixture host as the real H200 VM is: the driver comes from the VM host, no driver part packaged."""
    dpkg = snap.dpkg
    packages = {k: v for k, v in dpkg.data.packages.items() if not k.startswith(("nvidia-", "libnvidia-compute-"))}
    data = replace(dpkg.data, packages=packages)
    return replace(snap, dpkg=replace(dpkg, data=data))


def test_h200_with_the_vm_hosts_driver_is_compliant(tmp_path: Path, fixture_host) -> None:
    """The H200 fixture (real host: no driver package, module 580.159.04, CUDA 13.0) meets an r580/CUDA 13 pin;
    the loaded module is read under the root, as the apt hook reads it (a copy of the fixture root holds the
    compiled policy)."""
    root = tmp_path / "root"
    shutil.copytree(ROOTS / "nvidia-h200-ubuntu2404", root, symlinks=True)
    compiled_path = root / "var/lib/gpuguard/policy.compiled.json"
    state_dir = StatePaths().state_dir
    policy = tmp_path / "p.toml"
    policy.write_text('[policy]\nname = "t"\n[[nvidia.pairing]]\nname = "r580"\ndriver = "580.*"\ncuda = "13.0.*"\n')
    _, compiled = load_and_compile(str(policy))
    write_compiled(str(compiled_path), compiled)
    snap = _without_driver_packages(take_snapshot(fixture_host("nvidia-h200-ubuntu2404")))
    assert check_snapshot(snap, state_dir, root=str(root)) == []
    policy.write_text('[policy]\nname = "t"\n[[nvidia.pairing]]\nname = "r590"\ndriver = "590.*"\ncuda = "13.*"\n')
    _, compiled = load_and_compile(str(policy))
    write_compiled(str(compiled_path), compiled)
    (violation,) = check_snapshot(snap, state_dir, root=str(root))
    assert "NVIDIA driver 580.159.04 (loaded nvidia module, no driver package)" in violation.message
