"""check_and_rollback when the policy moves under an unchanged installed set (a revert bundle after an aborted rollout,
a tightened policy): back to the set kept before the last change when it complies, else a violation, never
"compliant" (the in-memory backend of test_health_rollback; the real thing: the Debian chroot test)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List, Tuple

import pytest

from agent.config import Settings
from agent.guard.rollback.backend import InstalledPackage
from agent.guard.rollback.core import load_before_change, load_known_good
from agent.host import Host
from agent.policy.load import compiled_from, load_policy
from agent.statepaths import StatePaths
from tests.conftest import fixed_clock
from tests.guard.rollback.test_health_rollback import MemoryBackend
from tests.guard.wiring import check

# A: the pairing before the rollout; B: the rollout's target pairing.
A = {"amdgpu-dkms": InstalledPackage("1:6.8.5.60202-2041575", "all"),
     "rocm-core": InstalledPackage("6.2.2.60202-116~12", "amd64")}
B = {"amdgpu-dkms": InstalledPackage("1:6.10.5.60300-2084815", "all"),
     "rocm-core": InstalledPackage("6.3.0.60300-39~12", "amd64")}
PAIRING_A = '[[amd.pairing]]\nname = "rocm-6.2"\namdgpu = "6.2.*"\nrocm = "6.2.*"\n'
PAIRING_B = '[[amd.pairing]]\nname = "rocm-6.3"\namdgpu = "6.3.*"\nrocm = "6.3.*"\n'
PAIRING_C = '[[amd.pairing]]\nname = "rocm-6.4"\namdgpu = "6.4.*"\nrocm = "6.4.*"\n'


def _policy(tmp_path: Path, name: str, action: str, *pairings: str) -> Any:
    policy_file = tmp_path / f"{name}.toml"
    policy_file.write_text(f'[policy]\nname = "{name}"\n[amd]\naction = "{action}"\n' + "".join(pairings))
    return compiled_from(load_policy(str(policy_file)))


def _after_the_rollout(tmp_path: Path) -> Tuple[Host, Settings, StatePaths, MemoryBackend]:
    """A recorded as known-good, then B taken as a compliant change under the rollout's target (A kept before it)."""
    root = tmp_path / "root"
    root.mkdir()
    host, settings = Host(root=root, clock=fixed_clock), Settings()
    paths = StatePaths(settings.agent.state_dir)
    backend = MemoryBackend(A)
    target = _policy(tmp_path, "target", "rollback", PAIRING_A, PAIRING_B)
    assert check(host, settings, backend=backend, policy=target).status == "recorded"
    backend.installed = dict(B)
    assert check(host, settings, backend=backend, policy=target).status == "recorded"
    assert load_known_good(host, paths) == B and load_before_change(host, paths) == A
    return host, settings, paths, backend


def _events(host: Host, paths: StatePaths) -> List[Dict[str, Any]]:
    where = host.path(paths.guard_events)
    return [json.loads(line) for line in where.read_text().splitlines()] if where.exists() else []


def _versions(packages: Dict[str, InstalledPackage]) -> Dict[str, str]:
    return {k: v.version for k, v in packages.items()}


def test_a_revert_policy_rolls_back_to_the_set_kept_before_the_change_and_records_it(tmp_path: Path) -> None:
    """Known-good B recorded after A, then a policy that allows only A: rolled back to A, A is the known-good set."""
    host, settings, paths, backend = _after_the_rollout(tmp_path)
    revert = _policy(tmp_path, "revert", "rollback", PAIRING_A)
    result = check(host, settings, backend=backend, policy=revert, snapshot=lambda h: None)
    assert result.status == "rolled_back", result.summary()
    assert backend.installed == A and "apply" in backend.calls
    assert load_known_good(host, paths) == A
    assert result.from_versions == _versions(B) and result.to_versions == _versions(A)
    kinds = [e["kind"] for e in _events(host, paths)]
    assert kinds[-1] == "rollback" and "policy_violation" in kinds
    rollback = _events(host, paths)[-1]
    assert rollback["succeeded"] is True and "the policy in force changed" in rollback["detail"]
    assert check(host, settings, backend=backend, policy=revert).status == "compliant"  # no second rollback


def test_a_dry_run_plans_the_way_back_without_changing_anything(tmp_path: Path) -> None:
    """gpuguard guard rollback --dry-run under the revert policy plans the move to A and applies nothing."""
    host, settings, paths, backend = _after_the_rollout(tmp_path)
    revert = _policy(tmp_path, "revert", "rollback", PAIRING_A)
    result = check(host, settings, backend=backend, policy=revert, dry_run=True)
    assert result.status == "planned" and result.to_versions == _versions(A)
    assert backend.installed == B and "apply" not in backend.calls and load_known_good(host, paths) == B


def test_a_policy_that_allows_neither_set_is_a_violation_without_rollback(tmp_path: Path) -> None:
    """When the set kept before the change violates the new policy too, the check reports a violation, not
    compliant, records the violation events and rolls nothing back."""
    host, settings, paths, backend = _after_the_rollout(tmp_path)
    neither = _policy(tmp_path, "neither", "rollback", PAIRING_C)
    result = check(host, settings, backend=backend, policy=neither, snapshot=lambda h: None)
    assert result.status == "violations" and result.violations
    assert "no compliant set was kept before the last change" in result.detail
    assert backend.installed == B and "apply" not in backend.calls and load_known_good(host, paths) == B
    assert [e["kind"] for e in _events(host, paths)] == ["policy_violation"] * len(result.violations)


def test_without_a_set_kept_before_the_change_it_is_a_violation_without_rollback(tmp_path: Path) -> None:
    """A known-good set that the policy now forbids and nothing kept before it: a violation, no rollback."""
    root = tmp_path / "root"
    root.mkdir()
    host, settings = Host(root=root, clock=fixed_clock), Settings()
    backend = MemoryBackend(B)
    assert check(host, settings, backend=backend,
                 policy=_policy(tmp_path, "target", "rollback", PAIRING_B)).status == "recorded"
    result = check(host, settings, backend=backend, policy=_policy(tmp_path, "revert", "rollback", PAIRING_A))
    assert result.status == "violations" and "apply" not in backend.calls


@pytest.mark.parametrize("action", ["warn", "block"])
def test_a_policy_move_whose_action_is_not_rollback_rolls_nothing_back(tmp_path: Path, action: str) -> None:
    """A revert policy whose action is warn or block leaves B installed; the same policy with action rollback then
    returns the host to A."""
    host, settings, paths, backend = _after_the_rollout(tmp_path)
    result = check(host, settings, backend=backend, policy=_policy(tmp_path, "revert", action, PAIRING_A))
    assert result.status != "rolled_back" and "apply" not in backend.calls
    assert backend.installed == B and load_known_good(host, paths) == B
    result = check(host, settings, backend=backend, policy=_policy(tmp_path, "revert", "rollback", PAIRING_A),
                   snapshot=lambda h: None)
    assert result.status == "rolled_back" and backend.installed == A


def test_rollback_disabled_reports_the_violation_and_rolls_nothing_back(tmp_path: Path) -> None:
    """[guard] rollback_enabled = false: the revert policy's violation is reported, nothing is rolled back."""
    host, settings, paths, backend = _after_the_rollout(tmp_path)
    settings = settings.model_copy(update={"guard": settings.guard.model_copy(update={"rollback_enabled": False})})
    result = check(host, settings, backend=backend, policy=_policy(tmp_path, "revert", "rollback", PAIRING_A))
    assert result.status == "violations" and "apply" not in backend.calls and backend.installed == B
