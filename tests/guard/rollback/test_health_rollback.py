"""rollback_before_change without a package manager: a fake backend (the PackageBackend protocol, in memory) for
what is restored, the event, the markers and the guards against loops (the real thing: the chroot test)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from agent.config import Settings
from agent.guard.rollback.backend import InstalledPackage, PlannedStep
from agent.guard.rollback.core import keep_before_change
from agent.guard.rollback.kept import KeptFile
from agent.host import Host
from agent.policy.load import compiled_from, load_policy
from agent.statepaths import StatePaths
from tests.conftest import fixed_clock
from tests.guard.wiring import health_rollback

OLD = {"amdgpu-dkms": InstalledPackage("1:6.8.5", "all"), "rocm-core": InstalledPackage("6.2.2", "amd64")}
NEW = {"amdgpu-dkms": InstalledPackage("1:6.10.5", "all"), "rocm-core": InstalledPackage("6.3.0", "amd64")}


class MemoryBackend:
    """Installs by ``name=version`` targets into a dict; records the calls."""

    manager, tool_name, file_field, mechanism, cache_dir = "dpkg", "apt-get", "deb", "apt-get install", "/nowhere"

    def __init__(self, installed: Dict[str, InstalledPackage]) -> None:
        self.installed = dict(installed)
        self.calls: List[str] = []

    def read_installed(self, patterns: Sequence[str]) -> Dict[str, InstalledPackage]:
        return dict(self.installed)

    def wait_for_lock(self) -> float:
        self.calls.append("lock")
        return 0.0

    def cache_known_good(self, installed: Dict[str, InstalledPackage],
                         also_keep: Optional[Dict[str, InstalledPackage]] = None,
                         progress: Optional[Callable[[Any], None]] = None) -> Dict[str, KeptFile]:
        return {k: KeptFile(None) for k in installed}

    def has_cached(self, key: str, package: InstalledPackage) -> bool:
        return False

    def plan_targets(self, known_good: Dict[str, InstalledPackage], current: Dict[str, InstalledPackage]) -> Any:
        moved = {k: v for k, v in known_good.items() if current.get(k) != v}
        return ([f"{k}={v.version}" for k, v in sorted(moved.items())],
                {k: current[k].version for k in moved}, {k: v.version for k, v in moved.items()})

    def simulate(self, targets: Sequence[str]) -> Tuple[List[PlannedStep], Optional[str]]:
        return [PlannedStep("install", t.split("=")[0], "", t.split("=")[1]) for t in targets], None

    def apply(self, targets: Sequence[str]) -> Optional[str]:
        self.calls.append("apply")
        for target in targets:
            name, version = target.split("=")
            self.installed[name] = InstalledPackage(version, self.installed[name].arch)
        return None

    def finish_pending(self) -> None:
        self.calls.append("finish_pending")

    def verify_database(self) -> Optional[str]:
        return None


def _setup(tmp_path: Path) -> Tuple[Host, Settings, Any, StatePaths]:
    root = tmp_path / "root"
    root.mkdir()
    policy_file = tmp_path / "p.toml"
    policy_file.write_text('[frozen]\npackages = ["amdgpu-dkms", "rocm-core"]\n[health]\nafter_change = "rollback"\n')
    settings = Settings()
    return (Host(root=root, clock=fixed_clock), settings, compiled_from(load_policy(str(policy_file))),
            StatePaths(settings.agent.state_dir))


def test_restores_the_kept_set_once_reports_and_marks_the_reboot(tmp_path: Path) -> None:
    """A health rollback restores the set kept before the change once, reports it, marks the reboot and audits it."""
    host, settings, policy, paths = _setup(tmp_path)
    keep_before_change(host, paths, OLD, fixed_clock())
    backend = MemoryBackend(NEW)
    events: List[Any] = []
    result = health_rollback(host, settings, "cpu_fallback", sink=events.append, backend=backend,
                                    policy=policy, snapshot=lambda h: None)
    assert result.status == "rolled_back" and backend.installed == OLD
    [event] = events
    assert (event.reason, event.health_status, event.succeeded, event.reboot_required) == (
        "health", "cpu_fallback", True, True)
    assert event.from_versions == {"amdgpu-dkms": "1:6.10.5", "rocm-core": "6.3.0"}
    assert (host.path("/var/run/reboot-required.pkgs")).read_text() == "amdgpu-dkms\n"
    assert "amdgpu-dkms" in host.path(paths.reboot_required + ".pkgs").read_text()
    assert not host.path(paths.known_good_before_change).exists()  # used up: a second failure finds nothing
    audit = [json.loads(line)["event"] for line in host.path(paths.audit_log).read_text().splitlines()]
    assert audit == ["rollback_authorization_written", "rollback", "rollback_authorization_removed"]
    assert not host.path(paths.guard_events).exists()  # committed by the health job itself, not forwarded
    again = health_rollback(host, settings, "cpu_fallback", sink=events.append, backend=backend,
                                   policy=policy)
    assert again.status == "no_known_good" and len(events) == 1


def test_never_back_to_the_set_a_health_rollback_removed(tmp_path: Path) -> None:
    """A later health rollback is refused when it would go back to the set an earlier health rollback removed."""
    host, settings, policy, paths = _setup(tmp_path)
    keep_before_change(host, paths, OLD, fixed_clock())
    backend = MemoryBackend(NEW)
    health_rollback(host, settings, "failed", sink=lambda e: None, backend=backend, policy=policy,
                           snapshot=lambda h: None)
    # The guard records the restored set; the one it replaced (NEW, which health removed) is kept as "before".
    keep_before_change(host, paths, NEW, fixed_clock())
    events: List[Any] = []
    result = health_rollback(host, settings, "failed", sink=events.append, backend=backend, policy=policy)
    assert result.status == "refused" and events == [] and backend.installed == OLD


def test_nothing_to_do_when_the_kept_set_is_installed(tmp_path: Path) -> None:
    """When the kept set is what is installed the health rollback says compliant and applies nothing."""
    host, settings, policy, paths = _setup(tmp_path)
    keep_before_change(host, paths, OLD, fixed_clock())
    backend = MemoryBackend(OLD)
    result = health_rollback(host, settings, "failed", sink=lambda e: None, backend=backend, policy=policy)
    assert result.status == "compliant" and "apply" not in backend.calls
