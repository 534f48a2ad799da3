"""The daemon's policy check over fixture snapshots."""

from __future__ import annotations

from pathlib import Path

from agent.config import Settings
from agent.policy.compliance import check_snapshot
from agent.policy.load import load_and_compile, write_compiled
from agent.snapshot.take import take_snapshot

REPO = Path(__file__).resolve().parents[2]


def _settings(tmp_path: Path) -> Settings:
    return Settings.model_validate({"agent": {"state_dir": str(tmp_path)}})


def test_no_compiled_policy_means_no_violations(tmp_path: Path, fixture_host) -> None:
    snap = take_snapshot(fixture_host("mi300x-rocm62-ubuntu2204"))
    assert check_snapshot(snap, _settings(tmp_path)) == []


def test_violations_come_back_as_report_payloads(tmp_path: Path, fixture_host) -> None:
    """A policy pinning ROCm 6.3 flags the fixture host's 6.2 stack."""
    policy = tmp_path / "p.toml"
    policy.write_text('[policy]\nname = "t"\n[[amd.pairing]]\nname = "rocm-6.3"\namdgpu = "6.3.*"\nrocm = "6.3.*"\n')
    _, compiled = load_and_compile(str(policy))
    write_compiled(str(tmp_path / "policy.compiled.json"), compiled)
    snap = take_snapshot(fixture_host("mi300x-rocm62-ubuntu2204"))
    violations = check_snapshot(snap, _settings(tmp_path))
    assert [v.rule for v in violations] == ["amd.pairing"]
    assert violations[0].kind == "policy_violation" and "rocm-core" in violations[0].packages
