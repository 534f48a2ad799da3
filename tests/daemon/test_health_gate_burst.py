"""The health gate over a burst of package changes: the guard job's real check (apt over a fake runner in a fake
root), the health schedule and job with a fake probe that reads the fake root, and the real health rollback."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import types
from pathlib import Path
from typing import Any, Callable, List, Optional, Sequence, Tuple

from agent.config import Settings
from agent.daemon_jobs.guard import GuardJob, recompile_policy
from agent.daemon_jobs.health import HealthJob
from agent.daemon_jobs.health_schedule import HealthSchedule
from agent.daemon_jobs.hooks import default_hooks
from agent.guard.apt.tool import AptTool
from agent.host import CommandResult, Host
from agent.statepaths import StatePaths
from tests.daemon.test_guard import GOOD_POLICY as POLICY
from tests.daemon.test_jobs import make_runtime
from tests.fakes.runner import FakeRunner
from tests.guard.wiring import check

D62, D63 = "1:6.8.5.60202-2041575", "1:6.10.5.60300-2084815"
R62, R624 = "6.2.2.60202-116~12", "6.2.4.60204-139~12"  # R624: allowed by the policy, and it hides the GPU
GOOD = {"amdgpu-dkms": D62, "rocm-core": R62}


def _status(versions: dict) -> str:
    arch = {"amdgpu-dkms": "all", "rocm-core": "amd64"}
    return "".join(f"Package: {n}\nStatus: install ok installed\nArchitecture: {arch[n]}\nVersion: {v}\n\n"
                   for n, v in sorted(versions.items()))


class Clock:
    """The time the guard (a datetime) and the health gate (Unix seconds) read; moved by the test only."""

    def __init__(self) -> None:
        self.seconds = 1_796_000_000.0

    def now(self) -> dt.datetime:
        return dt.datetime.fromtimestamp(self.seconds, dt.timezone.utc)


class AptRunner(FakeRunner):
    """Recorded apt output; a recorded install of ``name=version`` targets writes them into the dpkg status."""

    def __init__(self, root: Path) -> None:
        super().__init__()
        self.root = root

    def __call__(self, argv: Sequence[str], timeout_seconds: float) -> CommandResult:
        result = super().__call__(argv, timeout_seconds)
        if "install" in argv and "-s" not in argv:
            versions = installed(self.root)
            versions.update(dict(a.split("=", 1) for a in argv if "=" in a and not a.startswith("-")
                                 and a.split("=", 1)[0] in versions))
            (self.root / "var/lib/dpkg/status").write_text(_status(versions))
        return result

    def installs(self) -> List[Tuple[str, ...]]:
        return [tuple(c) for c in self.calls if "install" in c and "-s" not in c]


def installed(root: Path) -> dict:
    """The versions in the fake root's dpkg status."""
    out, name = {}, None
    for line in (root / "var/lib/dpkg/status").read_text().splitlines():
        if line.startswith("Package: "):
            name = line.split(": ", 1)[1]
        elif line.startswith("Version: ") and name:
            out[name] = line.split(": ", 1)[1]
    return out


class Probe:
    """A health run that finds ``cpu_fallback`` while rocm-core is R624 (it hides the GPU), else ``pass``;
    ``during`` runs inside the next check (a package change landing while the probe runs)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.seen: List[Tuple[Optional[str], str]] = []
        self.during: Optional[Callable[[], None]] = None

    def __call__(self, host: Host, settings: Any, state_dir: str, snapshot: Any = None,
                 mode: Optional[str] = None) -> Any:
        status = "cpu_fallback" if installed(self.root)["rocm-core"] == R624 else "pass"
        if self.during is not None:
            self.during, during = None, self.during
            during()
        self.seen.append((mode, status))
        return types.SimpleNamespace(status=status, occupancy=None)


@dataclasses.dataclass
class Scene:
    """The fake host and the jobs that watch it."""

    root: Path
    runner: AptRunner
    clock: Clock
    guard: GuardJob
    health: HealthJob
    schedule: HealthSchedule
    probe: Probe
    state: Path  # the state directory under the root, where the guard's files are

    def install(self, versions: dict) -> None:
        """A package change outside gpuguard (dpkg -i, apt): the dpkg status moves."""
        (self.root / "var/lib/dpkg/status").write_text(_status({**installed(self.root), **versions}))

    def rollbacks(self) -> list:
        return [e.payload for e in self.health.runtime.outbox.pending(100) if e.kind == "rollback"]


def _host(tmp_path: Path) -> Scene:
    root = tmp_path / "root"
    (root / "var/lib/dpkg").mkdir(parents=True)
    (root / "var/lib/dpkg/status").write_text(_status(GOOD))
    (root / "etc/gpuguard/policy.d").mkdir(parents=True)
    (root / "etc/gpuguard/policy.d/10-site.toml").write_text(POLICY + '[health]\nafter_change = "rollback"\n')
    settings = Settings.model_validate({"agent": {"state_dir": str(tmp_path / "state"), "host_id": "h1"},
                                        "guard": {"lock_timeout_seconds": 1}})
    runner, clock = AptRunner(root), Clock()
    host = Host(root=root, runner=runner, clock=clock.now)
    tool = AptTool(host, lock_timeout_seconds=1)
    debs = StatePaths(settings.agent.state_dir).debs
    options = ["--allow-downgrades", "--allow-change-held-packages"]
    for name, version in (("amdgpu-dkms", D62), ("rocm-core", R62)):
        runner.add(tool._download_argv(name, version, debs), returncode=100, stderr="E: Version not found")
        runner.add(tool.argv("apt-get", "-s", "-y", *options, *tool._apt_options(), "install", f"{name}={version}"),
                   stdout=f"NOTE: This is only a simulation!\nInst {name} [x] ({version} localhost [all])\n")
        runner.add(tool.argv("apt-get", "-y", "-q", *options, "--no-install-recommends", *tool._apt_options(),
                             "install", f"{name}={version}"))
    for name, version in (("rocm-core", R624),):
        runner.add(tool._download_argv(name, version, debs), returncode=100, stderr="E: Version not found")
    runner.add(tool.argv("dpkg", "--audit"), stdout="")
    runner.add(tool.argv("apt-get", "-q", "-o", "Dir::Cache::pkgcache=", "-o", "Dir::Cache::srcpkgcache=", "check"),
               stdout="Reading package lists...\n")
    runner.add(tool.argv("dpkg", "--configure", "-a"))
    assert recompile_policy(host, settings)
    assert check(host, settings).status == "recorded"  # the known-good set, as the package's postinst records it
    rt = make_runtime(tmp_path, host, settings)
    probe = Probe(root)
    # The daemon's own hooks (the real health rollback, and on this branch the gate's guarded sets), a fake probe;
    # no snapshot after a rollback (the fake root has no GPU stack to collect).
    hooks = dataclasses.replace(default_hooks(), health_run=probe, health_payloads=lambda result: [])
    health = HealthJob(rt, hooks)
    schedule = HealthSchedule(rt, lambda reason, mode, after: health.check(reason, mode, after),
                              clock=lambda: clock.seconds)
    guard = GuardJob(rt, forward=lambda reason: 0)
    return Scene(root, runner, clock, guard, health, schedule, probe, root / str(tmp_path / "state").lstrip("/"))


def _no_snapshot(monkeypatch: Any) -> None:
    import agent.guard.rollback.core as core

    monkeypatch.setattr(core, "_default_snapshot", lambda host: None)


def test_a_burst_a_bypass_rolled_back_then_a_change_that_hides_the_gpu_returns_to_the_last_set_that_passed(
        tmp_path: Path, monkeypatch: Any) -> None:
    """A bypass rolled back, then 4 s later an allowed change that hides the GPU, with the check the first change
    asked for running after the second: the host goes back to the last set that passed and the check after passes."""
    _no_snapshot(monkeypatch)
    h = _host(tmp_path)
    assert h.schedule.run("interval") is None  # a periodic pass of the known-good set: the last set that passed
    h.install({"amdgpu-dkms": D63})  # 14:15:0x: a dpkg -i that breaks the pairing
    h.guard.run("package_change")  # 14:15:05: the guard rolls it back (and the snapshot asks for a check)
    assert installed(h.root) == GOOD and len(h.runner.installs()) == 1
    h.clock.seconds += 4
    h.install({"rocm-core": R624})  # 14:15:09: allowed by the policy, hides the GPU from the framework
    h.schedule.run("stack_changed:dpkg")  # the check the first change asked for runs now, before the guard's check
    h.guard.run("package_change")  # the guard's check of the second change
    h.schedule.run("stack_changed:dpkg")  # the check the second change asked for
    assert installed(h.root) == GOOD, "the host did not return to the last set that passed"
    assert [status for _, status in h.probe.seen] == ["pass", "cpu_fallback", "pass", "pass"]
    [event] = h.rollbacks()
    assert (event.reason, event.succeeded, event.health_status) == ("health", True, "cpu_fallback")
    assert event.to_versions == {"rocm-core": R62} and event.from_versions == {"rocm-core": R624}
    assert "2 package change(s)" in (event.detail or "") and "the guard's rollback" in (event.detail or "")
    assert h.health.runtime.state.last_health_status == "pass"
    gate = json.loads((h.state / "health-gate.json").read_text())
    assert gate["changes"] == [] and {k: v["version"] for k, v in gate["passed"].items()} == GOOD


def test_a_change_during_a_running_check_extends_the_window_and_gets_a_check_after_it(tmp_path: Path,
                                                                                    monkeypatch: Any) -> None:
    """A change that lands while a check runs is not covered by that check's pass: a functional check runs right
    after it, finds the fallback and rolls back to the last set that passed."""
    _no_snapshot(monkeypatch)
    h = _host(tmp_path)
    assert h.schedule.run("interval") is None
    h.probe.during = lambda: h.install({"rocm-core": R624})
    assert h.schedule.run("stack_changed:dpkg") == 0.0  # passed, but a change came during it: again at once
    assert h.schedule.run("interval") is None  # the JobRunner's next call: the check after that change
    assert h.probe.seen == [(None, "pass"), ("functional", "pass"), ("functional", "cpu_fallback"),
                            ("functional", "pass")]
    assert installed(h.root) == GOOD and [e.to_versions for e in h.rollbacks()] == [{"rocm-core": R62}]


def test_a_periodic_check_that_fails_right_after_a_change_rolls_back(tmp_path: Path, monkeypatch: Any) -> None:
    """A periodic check (no stack change asked for it) that finds the fallback while a change since the last pass is
    unjudged acts as the post-change check and rolls back to the last set that passed."""
    _no_snapshot(monkeypatch)
    h = _host(tmp_path)
    assert h.schedule.run("interval") is None
    h.install({"rocm-core": R624})
    h.guard.run("package_change")  # compliant: recorded as the known-good set
    h.schedule.run("interval")
    assert installed(h.root) == GOOD and len(h.rollbacks()) == 1


def test_never_a_rollback_to_a_set_health_removed_before(tmp_path: Path, monkeypatch: Any) -> None:
    """When the last set that passed is the one a health rollback removed before, a failing check rolls nothing
    back, says so in the gate's verdict, and a later failing check does not try again."""
    _no_snapshot(monkeypatch)
    h = _host(tmp_path)
    assert h.schedule.run("interval") is None
    (h.state / "health-rollback.json").write_text(json.dumps({
        "at": "2026-11-01T00:00:00+00:00", "health_status": "failed", "status": "rolled_back",
        "from_versions": GOOD, "to_versions": {"amdgpu-dkms": D62, "rocm-core": "6.2.0"}}))
    h.install({"rocm-core": R624})
    h.guard.run("package_change")
    installs = len(h.runner.installs())
    summary = h.health.check("stack_changed:dpkg", "functional", True)
    assert summary.rollback == "refused" and len(h.runner.installs()) == installs
    gate = json.loads((h.state / "health-gate.json").read_text())
    assert gate["verdict"]["outcome"] == "refused" and len(gate["verdict"]["covers"]) == 1
    assert h.health.check("interval", None, False).rollback is None  # judged: no second attempt
    assert installed(h.root)["rocm-core"] == R624
