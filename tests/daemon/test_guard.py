"""The daemon's guard wiring in-process: guard-events forwarding, the guard job's order and failures, SIGHUP compile."""

from __future__ import annotations

import datetime as dt
import io
import json
import os
import time
from pathlib import Path
from typing import List, Optional, Sequence

import pytest

from agent.config import Settings
from agent.daemon import Daemon
from agent.daemon_jobs.guard import GuardJob, recompile_policy
from agent.daemon_jobs.guard_events import GuardEventForwarder, Position, event_id_for_line, payload_from_record
from agent.daemon_jobs.protocol import GuardChecked
from agent.daemon_jobs.resident_settings import SettingsInForce
from agent.daemon_jobs.runtime import Runtime
from agent.daemon_jobs.systemd_notify import SystemdNotifier
from agent.daemon_jobs.watch import PackageWatcher
from agent.errors import CommandTimeout
from agent.guard.apt.tool import AptTool
from agent.guard.hotpath import decision as exits
from agent.guard.hotpath.state import append_json_line
from agent.host import CommandResult, Host
from agent.log import configure
from agent.policy.load import load_and_compile, write_compiled
from agent.report.outbox import Outbox
from agent.statepaths import StatePaths
from tests.conftest import fixed_clock
from tests.daemon.test_jobs import make_runtime, no_hooks
from tests.fakes.runner import FakeRunner
from tests.guard.wiring import check

BLOCKED = {"occurred_at": "2026-03-01T12:00:00+00:00", "kind": "transaction_blocked", "tool": "apt",
           "rule": "amd.pairing", "message": "breaks the pinned AMD pairing", "packages": {"rocm-core": "a -> b"},
           "command_line": "apt-get install rocm-core"}
WARNED = {"occurred_at": "2026-03-01T12:00:01+00:00", "kind": "policy_violation", "rule": "versions.toolkit",
          "message": "too old", "packages": {"nvidia-container-toolkit": "- -> 1.16.0-1"}, "action": "warn"}
ROLLED = {"occurred_at": "2026-03-01T12:00:02+00:00", "kind": "rollback", "reason": "amd.pairing",
          "from_versions": {"amdgpu-dkms": "2"}, "to_versions": {"amdgpu-dkms": "1"}, "succeeded": True,
          "reboot_required": True, "detail": "put back"}
OVERRIDE = {"occurred_at": "2026-03-01T12:00:03+00:00", "kind": "override_used",
            "window": {"id": "ab12cd34", "started_at": "2026-03-01T11:50:00+00:00",
                       "expires_at": "2026-03-01T12:20:00+00:00", "reason": "swap driver", "opened_by": "ops"},
            "command_line": "apt-get install rocm-core",
            "violations": [{"rule": "amd.pairing", "action": "rollback", "message": "breaks it",
                            "packages": {"rocm-core": "a -> b"}, "hint": "move both", "pairing": "rocm-6.2"}]}


def _raw(record: dict) -> bytes:
    """The line exactly as append_json_line writes it (without the newline)."""
    return json.dumps(record, sort_keys=True, separators=(",", ":")).encode()


@pytest.fixture
def forwarding(tmp_path: Path):
    rt = make_runtime(tmp_path, Host(root=Path("/"), clock=fixed_clock))
    events = tmp_path / "guard" / "guard-events.jsonl"
    yield rt, events, GuardEventForwarder(rt, str(events))
    rt.outbox.close()


def _pending(rt: Runtime) -> list:
    return rt.outbox.pending(1000)


def test_each_guard_record_maps_to_its_payload_and_severity() -> None:
    """Blocked, warned, rolled back and override records become the report payloads, at the recorded time."""
    mapped = [payload_from_record(r) for r in (BLOCKED, WARNED, ROLLED, OVERRIDE)]
    assert [(p.kind, s) for p, s, _ in mapped] == [("transaction_blocked", "critical"), ("policy_violation", "warning"),
                                                    ("rollback", "warning"), ("override_used", "warning")]
    used = mapped[3][0]
    assert (used.window_id, used.reason, used.opened_by) == ("ab12cd34", "swap driver", "ops")
    assert used.violations[0].rule == "amd.pairing" and used.violations[0].action == "rollback"
    assert mapped[0][2] == dt.datetime(2026, 3, 1, 12, tzinfo=dt.timezone.utc)
    failed = payload_from_record({**ROLLED, "succeeded": False})
    assert failed[1] == "critical"


def test_new_lines_are_forwarded_once_and_the_position_is_kept(forwarding) -> None:
    """Only lines after the stored offset are forwarded; the position file follows the file's end."""
    rt, events, forwarder = forwarding
    assert forwarder.run() == 0  # no file yet
    append_json_line(str(events), BLOCKED)
    append_json_line(str(events), WARNED)
    assert forwarder.run() == 2
    assert forwarder.run() == 0
    append_json_line(str(events), ROLLED)
    assert forwarder.run() == 1
    assert [e.kind for e in _pending(rt)] == ["transaction_blocked", "policy_violation", "rollback"]
    assert [e.event_id for e in _pending(rt)] == [event_id_for_line(_raw(r)) for r in (BLOCKED, WARNED, ROLLED)]
    assert _pending(rt)[0].occurred_at == dt.datetime(2026, 3, 1, 12, tzinfo=dt.timezone.utc)
    info = os.stat(events)
    assert forwarder.load_position() == Position(info.st_ino, info.st_size, 3)


def test_a_replay_after_a_crash_gives_the_same_event_ids(forwarding) -> None:
    """Losing the position (crash before it was written) forwards the lines again as the same events, once."""
    rt, events, forwarder = forwarding
    for record in (BLOCKED, ROLLED):
        append_json_line(str(events), record)
    forwarder.run()
    first = [e.event_id for e in _pending(rt)]
    os.unlink(forwarder.position_path)
    assert forwarder.run() == 2
    assert [e.event_id for e in _pending(rt)] == first, "a queued event was enqueued twice"
    rt.outbox.ack(first)  # delivered in the meantime: the outbox remembers the ids, the replay is a no-op
    last_sequence = rt.outbox.last_sequence()
    os.unlink(forwarder.position_path)
    forwarder.run()
    assert _pending(rt) == [] and rt.outbox.last_sequence() == last_sequence, "a delivered line got a new sequence"


def test_rotation_and_truncation_start_from_the_beginning(forwarding) -> None:
    """A new inode or a file shorter than the offset is read from its first line."""
    rt, events, forwarder = forwarding
    append_json_line(str(events), BLOCKED)
    append_json_line(str(events), WARNED)
    forwarder.run()
    os.rename(events, str(events) + ".1")
    append_json_line(str(events), ROLLED)
    assert forwarder.run() == 1
    with open(events, "w"):
        pass  # truncated in place, same inode
    append_json_line(str(events), {"occurred_at": "2026-03-01T13:00:00+00:00", "kind": "rollback", "reason": "r",
                                   "from_versions": {}, "to_versions": {}, "succeeded": False})
    assert forwarder.run() == 1
    assert [e.kind for e in _pending(rt)] == ["transaction_blocked", "policy_violation", "rollback", "rollback"]
    assert forwarder.load_position().line_number == 1


def test_a_malformed_line_is_skipped_with_one_warning_naming_file_and_line(forwarding) -> None:
    """Bad JSON and an unknown kind are logged with their line numbers and reported; the lines around them arrive."""
    rt, events, forwarder = forwarding
    stream = io.StringIO()
    configure(level="warning", json_output=True, stream=stream)
    append_json_line(str(events), BLOCKED)
    with open(events, "a") as handle:
        handle.write("{not json\n")
        handle.write('{"kind": "mystery"}\n')
        handle.write('{"kind": "rollback", "reason": "no versions"}\n')
    append_json_line(str(events), WARNED)
    assert forwarder.run() == 2
    warnings = [json.loads(line) for line in stream.getvalue().splitlines()]
    malformed = [w for w in warnings if w["event"] == "guard_event_malformed"]
    assert [w["line_number"] for w in malformed] == [2, 3, 4]
    assert all(w["path"] == str(events) for w in malformed)
    assert "not valid JSON" in malformed[0]["error"] and "mystery" in malformed[1]["error"]
    assert "from_versions" in malformed[2]["error"]
    assert [e.kind for e in _pending(rt)] == ["transaction_blocked", *["state_file_damaged"] * 3, "policy_violation"]
    assert forwarder.run() == 0, "a malformed line is not retried"


def test_a_partial_last_line_waits_for_its_end(forwarding) -> None:
    """A line still being written is not consumed until its newline arrives."""
    rt, events, forwarder = forwarding
    raw = _raw(BLOCKED)
    events.parent.mkdir(parents=True)
    events.write_bytes(raw[:20])
    assert forwarder.run() == 0 and forwarder.load_position().offset_bytes == 0
    with open(events, "ab") as handle:
        handle.write(raw[20:] + b"\n")
    assert forwarder.run() == 1
    assert _pending(rt)[0].event_id == event_id_for_line(raw)


def test_records_written_by_the_real_apt_hook_are_forwarded(tmp_path: Path) -> None:
    """A refused transaction and an override window's use, as the hook records them, become report events."""
    from agent.guard.hotpath.overrides import start_window
    from tests.guard.apt.test_hook import HEAD, NOW, POLICY, STATUS, line, run_hook

    root = tmp_path / "root"
    (root / "var/lib/dpkg").mkdir(parents=True)
    (root / "var/lib/dpkg/status").write_text(STATUS)
    (tmp_path / "policy.toml").write_text(POLICY)
    compiled = load_and_compile(str(tmp_path / "policy.toml"))[1]
    write_compiled(str(root / "var/lib/gpuguard/policy.compiled.json"), compiled)
    breaking = HEAD + line("rocm-core", "6.2.2.60202-116~12", "6.3.0.60300-39~12")
    assert run_hook(root, breaking)[0] == exits.EXIT_REFUSED
    state = root / "var/lib/gpuguard"
    start_window(str(state / "overrides.json"), str(state / "audit.log"), minutes=30, reason="swap driver",
                 max_minutes=60, now=lambda: NOW, opened_by="ops")
    assert run_hook(root, breaking, now=NOW + dt.timedelta(minutes=1))[0] == exits.EXIT_ALLOW
    rt = make_runtime(tmp_path, Host(root=root, clock=fixed_clock))
    try:
        GuardEventForwarder(rt, str(state / "guard-events.jsonl")).run()
        events = _pending(rt)
        assert [e.kind for e in events] == ["transaction_blocked", "override_used"]
        assert events[0].payload.rule == "amd.pairing" and events[0].severity == "critical"
        assert events[1].payload.reason == "swap driver" and events[1].payload.violations[0].rule == "amd.pairing"
        assert events[1].occurred_at == NOW + dt.timedelta(minutes=1)
    finally:
        rt.outbox.close()


# --- the guard job ------------------------------------------------------------------------------------------------

class RecordingCheck:
    """A stand-in for check_and_rollback that records its calls and writes what the real one would record."""

    def __init__(self, events_path: Path, records: Sequence[dict] = (), error: Optional[Exception] = None) -> None:
        self.events_path = events_path
        self.records = list(records)
        self.error = error
        self.calls: List[str] = []

    def __call__(self) -> GuardChecked:
        self.calls.append(str(self.events_path))
        for record in self.records:
            append_json_line(str(self.events_path), record)
        if self.error is not None:
            raise self.error
        return GuardChecked(status="rolled_back")


def _guard_root(tmp_path: Path) -> tuple:
    """A root with a dpkg database and a compiled policy where the daemon's guard looks for them."""
    root = tmp_path / "root"
    (root / "var/lib/dpkg").mkdir(parents=True)
    (root / "var/lib/dpkg/status").write_text("Package: vim\nStatus: install ok installed\nVersion: 1\n\n")
    rt = make_runtime(tmp_path, Host(root=root, clock=fixed_clock))
    guard_dir = root / rt.settings.state_dir.lstrip("/")
    guard_dir.mkdir(parents=True)
    (guard_dir / "policy.compiled.json").write_text("{}")
    return rt, root, guard_dir


def test_package_change_checks_then_forwards_then_asks_for_the_snapshot(tmp_path: Path) -> None:
    """The rollback's records are in the outbox before the snapshot is requested."""
    rt, root, guard_dir = _guard_root(tmp_path)
    events = guard_dir / "guard-events.jsonl"
    check = RecordingCheck(events, [ROLLED])
    order: List[str] = []
    job = GuardJob(rt, GuardEventForwarder(rt, str(events)).run,
                   on_checked=lambda reason: order.append(f"snapshot:{reason}:{len(_pending(rt))}"), check=check)
    job.run("package_change")
    assert check.calls == [str(events)]
    assert order == ["snapshot:package_change:1"]
    assert [e.kind for e in _pending(rt)] == ["rollback"]
    job.run("package_change")  # the rollback's own status change: nothing it reads moved, no second check
    assert len(check.calls) == 1
    (root / "var/lib/dpkg/status").write_text("Package: vim\nStatus: install ok installed\nVersion: 2\n\n")
    job.run("guard_events_written")
    assert len(check.calls) == 1, "a guard-events write only forwards"
    job.run("package_change")
    assert len(check.calls) == 2
    rt.outbox.close()


@pytest.mark.parametrize("reason", ["policy_bundle_installed", "config_reloaded"])
def test_a_new_compiled_policy_runs_the_check_without_a_package_change(tmp_path: Path, reason: str) -> None:
    """A bundle the policy fetch installed (or a SIGHUP recompile) runs the check though dpkg's status did not move:
    a revert bundle must reach check_and_rollback; an unchanged compiled policy is still skipped."""
    rt, root, guard_dir = _guard_root(tmp_path)
    events = guard_dir / "guard-events.jsonl"
    check = RecordingCheck(events)
    asked: List[str] = []
    job = GuardJob(rt, GuardEventForwarder(rt, str(events)).run, on_checked=asked.append, check=check)
    job.run("package_change")
    assert len(check.calls) == 1
    (guard_dir / "policy.compiled.json").write_text('{"name": "revert"}')
    job.run(reason)
    assert len(check.calls) == 2, "the new policy was checked"
    job.run(reason)
    assert len(check.calls) == 2, "the same policy again: nothing it reads moved"
    rt.outbox.close()


def test_a_failing_check_is_reported_and_never_stops_forwarding_or_the_snapshot(tmp_path: Path) -> None:
    """An exception becomes a Rollback event with succeeded=false; records already written still arrive."""
    rt, root, guard_dir = _guard_root(tmp_path)
    events = guard_dir / "guard-events.jsonl"
    check = RecordingCheck(events, [BLOCKED], error=CommandTimeout(["wait-for-lock"], 300))
    asked: List[str] = []
    GuardJob(rt, GuardEventForwarder(rt, str(events)).run, on_checked=asked.append, check=check).run("package_change")
    pending = _pending(rt)
    assert [e.kind for e in pending] == ["rollback", "transaction_blocked"]
    assert pending[0].payload.succeeded is False and pending[0].severity == "critical"
    assert "wait-for-lock" in pending[0].payload.detail
    assert asked == ["package_change"]
    rt.outbox.close()


def test_without_a_compiled_policy_the_check_is_skipped(tmp_path: Path) -> None:
    """No policy installed (or an rpm host without a dpkg database): nothing to roll back."""
    rt, root, guard_dir = _guard_root(tmp_path)
    (guard_dir / "policy.compiled.json").unlink()
    check = RecordingCheck(guard_dir / "guard-events.jsonl")
    GuardJob(rt, GuardEventForwarder(rt, str(guard_dir / "guard-events.jsonl")).run, check=check).run("package_change")
    assert check.calls == []
    rt.outbox.close()


def test_watcher_wakes_the_guard_job_when_guard_events_grow(tmp_path: Path) -> None:
    """A line from the hook triggers forwarding within one poll, without a package database change."""
    events = tmp_path / "guard-events.jsonl"
    woken: List[str] = []
    watcher = PackageWatcher(Host(root=tmp_path), on_change=woken.append, guard_events_path=str(events),
                             on_guard_events=woken.append)
    watcher.run()
    assert woken == []
    append_json_line(str(events), BLOCKED)
    watcher.run()
    watcher.run()
    assert woken == ["guard_events_written"]


# --- SIGHUP: compile the policy -----------------------------------------------------------------------------------

GOOD_POLICY = """[policy]
name = "v1"
[amd]
action = "rollback"
[[amd.pairing]]
name = "p"
amdgpu = "6.2.*"
rocm = "6.2.*"
"""


def test_reload_compiles_the_policy_and_an_invalid_one_keeps_the_old_file(tmp_path: Path) -> None:
    """A valid policy is compiled for the hook; an invalid one logs every problem and leaves the file alone."""
    root = tmp_path / "root"
    policy_dir = root / "etc/gpuguard/policy.d"
    policy_dir.mkdir(parents=True)
    (policy_dir / "10-site.toml").write_text(GOOD_POLICY)
    settings = Settings.model_validate({"agent": {"state_dir": str(tmp_path / "state")}})
    host = Host(root=root)
    compiled = host.path(StatePaths(settings.agent.state_dir).compiled_policy)
    assert recompile_policy(host, settings)
    assert json.loads(compiled.read_text())["name"] == "v1"
    before = compiled.read_text()
    (policy_dir / "10-site.toml").write_text('[policy]\nname = 5\n[amd]\naction = "explode"\n')
    stream = io.StringIO()
    configure(level="warning", json_output=True, stream=stream)
    assert not recompile_policy(host, settings)
    assert compiled.read_text() == before
    (failure,) = [json.loads(row) for row in stream.getvalue().splitlines() if '"policy_compile_failed"' in row]
    assert len(failure["problems"]) >= 2, failure
    assert failure["kept"] == "previous compiled policy"


def test_sighup_reload_recompiles_the_policy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Daemon.reload writes the compiled policy the apt hook reads and asks the guard job to check the installed set
    against it."""
    root = tmp_path / "root"
    (root / "etc/gpuguard/policy.d").mkdir(parents=True)
    (root / "etc/gpuguard/policy.d/10-site.toml").write_text(GOOD_POLICY)
    config = tmp_path / "agent.toml"
    config.write_text(f'[agent]\nstate_dir = "{tmp_path / "state"}"\n[report]\nmetrics_enabled = false\n'
                      f'[snapshot]\ninterval_seconds = 3600\n[daemon]\nhealth_enabled = false\n')
    from agent.config import load_settings

    settings = load_settings(str(config))
    daemon = Daemon(str(config), SettingsInForce.of(settings), Host(root=root, clock=fixed_clock), SystemdNotifier({}),
                    no_hooks())
    daemon.start()
    guard_requests: List[str] = []
    try:
        monkeypatch.setattr(daemon.runners["guard"], "request", guard_requests.append)
        assert daemon.reload()
    finally:
        daemon.stop()
    assert guard_requests == ["config_reloaded"]
    compiled = root / str(tmp_path / "state").lstrip("/") / "policy.compiled.json"
    assert json.loads(compiled.read_text())["name"] == "v1"


# --- the real rollback path, driven by the daemon -----------------------------------------------------------------

ROLLBACK_POLICY = GOOD_POLICY
D62, D63, R62 = "1:6.8.5.60202-2041575", "1:6.10.5.60300-2084815", "6.2.2.60202-116~12"
SIMULATION = f"NOTE: This is only a simulation!\nInst amdgpu-dkms [{D63}] ({D62} localhost [all])\n"


def _status(driver: str) -> str:
    return (f"Package: amdgpu-dkms\nStatus: install ok installed\nArchitecture: all\nVersion: {driver}\n\n"
            f"Package: rocm-core\nStatus: install ok installed\nArchitecture: amd64\nVersion: {R62}\n\n")


class AptRunner(FakeRunner):
    """Recorded apt output; the recorded install puts the known-good status back (or fails), as apt would."""

    def __init__(self, root: Path, install_succeeds: bool) -> None:
        super().__init__()
        self.root = root
        self.install_succeeds = install_succeeds

    def __call__(self, argv: Sequence[str], timeout_seconds: float) -> CommandResult:
        result = super().__call__(argv, timeout_seconds)
        if "install" in argv and "-s" not in argv and self.install_succeeds:
            (self.root / "var/lib/dpkg/status").write_text(_status(D62))
        return result


def _daemon_over_rollback_root(tmp_path: Path, install_succeeds: bool) -> tuple:
    root = tmp_path / "root"
    (root / "var/lib/dpkg").mkdir(parents=True)
    (root / "var/lib/dpkg/status").write_text(_status(D62))
    (root / "etc/gpuguard/policy.d").mkdir(parents=True)
    (root / "etc/gpuguard/policy.d/10-site.toml").write_text(ROLLBACK_POLICY)
    settings = Settings.model_validate({
        "agent": {"state_dir": str(tmp_path / "state"), "host_id": "h1"},
        "snapshot": {"interval_seconds": 3600},
        "daemon": {"package_watch_interval_seconds": 0.05, "health_enabled": False},
        "report": {"heartbeat_interval_seconds": 3600, "metrics_enabled": False},
        "guard": {"lock_timeout_seconds": 1}})
    runner = AptRunner(root, install_succeeds)
    host = Host(root=root, runner=runner, clock=fixed_clock)
    tool = AptTool(host, lock_timeout_seconds=1)
    debs = StatePaths(settings.agent.state_dir).debs
    for name, version in (("amdgpu-dkms", D62), ("rocm-core", R62)):
        runner.add(tool._download_argv(name, version, debs), returncode=100, stderr="E: Version not found")
    options = ["--allow-downgrades", "--allow-change-held-packages"]
    runner.add(tool.argv("apt-get", "-s", "-y", *options, *tool._apt_options(), "install", f"amdgpu-dkms={D62}"),
               stdout=SIMULATION)
    runner.add(tool.argv("apt-get", "-y", "-q", *options, "--no-install-recommends", *tool._apt_options(), "install",
                         f"amdgpu-dkms={D62}"), returncode=0 if install_succeeds else 100,
               stderr="" if install_succeeds else "E: broken")
    runner.add(tool.argv("dpkg", "--audit"), stdout="")  # the database check after a rollback
    runner.add(tool.argv("apt-get", "-q", "-o", "Dir::Cache::pkgcache=", "-o", "Dir::Cache::srcpkgcache=", "check"),
               stdout="Reading package lists...\n")
    runner.add(tool.argv("dpkg", "--configure", "-a"))
    assert recompile_policy(host, settings)
    assert check(host, settings).status == "recorded"  # the known-good set, as the package's postinst
    daemon = Daemon("/nonexistent/agent.toml", SettingsInForce.of(settings), host, SystemdNotifier({}), no_hooks())
    return daemon, root, runner


def _wait_for(predicate, timeout_seconds: float = 120.0) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_seconds
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


@pytest.mark.parametrize("install_succeeds", [True, False])
def test_dpkg_i_violation_is_rolled_back_by_the_daemon_before_the_snapshot(tmp_path: Path,
                                                                            install_succeeds: bool) -> None:
    """A dpkg status change that breaks a rollback rule runs apt through the rollback path; its events precede
    any snapshot of the changed state, and a successful rollback leaves no snapshot of the violating state."""
    daemon, root, runner = _daemon_over_rollback_root(tmp_path, install_succeeds)
    outbox = daemon.runtime.outbox
    daemon.start()
    try:
        assert _wait_for(lambda: any(e.kind == "snapshot_changed" for e in outbox.pending(100)))
        time.sleep(0.2)  # the watcher has a baseline signature
        (root / "var/lib/dpkg/status").write_text(_status(D63))
        assert _wait_for(lambda: any(e.kind == "rollback" for e in outbox.pending(100))), \
            [e.kind for e in outbox.pending(100)]
        if not install_succeeds:
            assert _wait_for(lambda: sum(e.kind == "snapshot_changed" for e in outbox.pending(100)) == 2)
        time.sleep(0.5)
    finally:
        daemon.stop()
    installs = [c for c in runner.calls if "install" in c and "-s" not in c]
    assert installs, "the daemon did not run the rollback"
    events = Outbox(str(tmp_path / "state" / "outbox.sqlite3")).pending(100)
    kinds = [e.kind for e in events]
    rollback = next(e for e in events if e.kind == "rollback")
    violation = next(e for e in events if e.kind == "policy_violation" and e.payload.action == "rollback")
    assert violation.sequence < rollback.sequence
    assert rollback.payload.succeeded is install_succeeds
    assert rollback.payload.to_versions == {"amdgpu-dkms": D62}
    snapshots = [e for e in events if e.kind == "snapshot_changed"]
    if install_succeeds:
        assert len(snapshots) == 1, f"the snapshot saw the violating state: {kinds}"
        assert (root / str(tmp_path / "state").lstrip("/") / "reboot-required").exists()
    else:
        assert ("dpkg", "--configure", "-a") == runner.calls[-1][-3:]
        assert snapshots[-1].sequence > rollback.sequence, kinds



def test_a_check_waiting_for_the_dpkg_lock_gives_up_when_the_daemon_stops(tmp_path: Path) -> None:
    """dpkg holds its lock (as during gpuguard's own prerm) and the check waits for it: setting the daemon's stop
    event ends the wait, with no failure reported, long before the holder lets go (systemctl stop used to hang for
    180 s)."""
    import subprocess
    import sys
    import threading

    root = tmp_path / "root"
    (root / "var/lib/dpkg").mkdir(parents=True)
    (root / "var/lib/dpkg/status").write_text("Package: rocm-core\nStatus: install ok installed\n"
                                               "Architecture: amd64\nVersion: 6.2.2.60202-116~22.04\n\n")
    lock = root / "var/lib/dpkg/lock"
    lock.write_text("")
    (root / "policy.toml").write_text('[policy]\nname = "t"\n[kernel]\nallow = ["6.8.0-45-generic"]\n')
    _, compiled = load_and_compile(str(root / "policy.toml"))
    write_compiled(str(root / "var/lib/gpuguard/policy.compiled.json"), compiled)
    holder = subprocess.Popen([sys.executable, "-c", "import fcntl, sys, time; f = open(sys.argv[1], 'w'); "
                               "fcntl.lockf(f, fcntl.LOCK_EX); print('held', flush=True); time.sleep(120)", str(lock)],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        rt = make_runtime(tmp_path, Host(root=root, clock=fixed_clock))
        job = GuardJob(rt, GuardEventForwarder(rt, str(tmp_path / "events.jsonl")).run)
        threading.Timer(1.0, rt.stopping.set).start()
        started = time.monotonic()
        assert job.check("package_change") is None
        # The stop event, not the lock's 300 s timeout (that one reports a failure, checked below) nor the holder's
        # 120 s: a bound a loaded machine cannot reach.
        assert time.monotonic() - started < 60
        assert rt.outbox.pending(10) == []  # no "guard_check_failed" Rollback event
        rt.outbox.close()
    finally:
        holder.kill()
        holder.wait(timeout=10)
