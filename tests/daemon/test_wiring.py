"""The daemon's wiring pieces: the systemd notifier and the job runner's run-again and reschedule rules."""

from __future__ import annotations

import socket
import threading
import time
import types
from pathlib import Path
from typing import Callable, List, Optional

from agent.config import Settings
from agent.daemon import Daemon
from agent.daemon_jobs.hooks import Hooks
from agent.daemon_jobs.job_runner import JobRunner
from agent.daemon_jobs.resident_settings import SettingsInForce
from agent.daemon_jobs.systemd_notify import SystemdNotifier
from agent.host import Host


class FakeScheduler:
    """Records run_in calls the way the daemon's scheduler would receive them."""

    def __init__(self) -> None:
        self.modified: List[tuple] = []

    def run_in(self, job_id: str, delay_seconds: float) -> None:
        self.modified.append((job_id, delay_seconds))


def test_notifier_sends_datagrams_to_a_path_socket(tmp_path: Path) -> None:
    """READY=1 and STATUS lines arrive as one datagram."""
    path = tmp_path / "notify"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(str(path))
        SystemdNotifier({"NOTIFY_SOCKET": str(path)}).notify("READY=1", "STATUS=running")
        assert sock.recv(100) == b"READY=1\nSTATUS=running"


def test_notifier_uses_the_abstract_namespace_for_at_addresses() -> None:
    """'@name' is the abstract socket '\\0name', as systemd passes it."""
    name = f"gpuguard-test-{threading.get_ident()}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind("\0" + name)
        SystemdNotifier({"NOTIFY_SOCKET": "@" + name}).notify("WATCHDOG=1")
        assert sock.recv(100) == b"WATCHDOG=1"


def test_notifier_without_socket_is_silent_and_reads_the_watchdog_period() -> None:
    """No NOTIFY_SOCKET: notify does nothing; WATCHDOG_USEC counts only for our own pid."""
    SystemdNotifier({}).notify("READY=1")
    assert SystemdNotifier({"WATCHDOG_USEC": "30000000"}).watchdog_seconds == 30.0
    assert SystemdNotifier({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "1"}).watchdog_seconds is None


def test_request_during_a_run_makes_the_runner_go_again() -> None:
    """A trigger that lands while the body runs is not lost to max_instances=1."""
    runs: List[str] = []
    runner: Optional[JobRunner] = None

    def body(reason: str) -> None:
        runs.append(reason)
        if len(runs) == 1:
            assert runner is not None
            runner.request("package_change")
        return None

    runner = JobRunner("snapshot", body, threading.Event())
    runner.scheduler = FakeScheduler()
    runner()
    assert runs == ["interval", "package_change"]


def test_a_pending_sticky_reason_is_not_replaced_by_a_later_request() -> None:
    """The guard's package_change asked just before the fetch's policy_bundle_installed (the test fleet changed the
    dpkg status as soon as the new serial was in force) is the reason the body runs with: the check, then the
    snapshot and its post-change health check follow it; without sticky reasons the newest request wins."""
    def after_two_requests(sticky: frozenset, first: str, second: str) -> List[str]:
        runs: List[str] = []
        runner = JobRunner("guard", runs.append, threading.Event(), sticky_reasons=sticky)
        runner.scheduler = FakeScheduler()
        runner.request(first)
        runner.request(second)
        runner()
        return runs

    package = frozenset({"package_change"})
    assert after_two_requests(package, "package_change", "policy_bundle_installed") == ["package_change"]
    assert after_two_requests(frozenset(), "package_change", "policy_bundle_installed") == ["policy_bundle_installed"]
    # a sticky reason replaces any pending one
    assert after_two_requests(package, "policy_bundle_installed", "package_change") == ["package_change"]


def test_body_failure_is_contained_and_retry_delay_reschedules() -> None:
    """An exception never reaches the scheduler; a returned delay becomes the next run time."""
    scheduler = FakeScheduler()
    failing = JobRunner("health", lambda reason: 1 / 0, threading.Event())
    failing.scheduler = scheduler
    failing()
    delayed = JobRunner("deliver", lambda reason: 2.5, threading.Event())
    delayed.scheduler = scheduler
    delayed()
    assert scheduler.modified == [("deliver", 2.5)]


def test_runner_does_nothing_once_stopping() -> None:
    """After SIGTERM a due run is skipped."""
    runs: List[str] = []
    stopping = threading.Event()
    stopping.set()
    JobRunner("heartbeat", lambda reason: runs.append(reason), stopping)()
    assert runs == []


def test_slow_job_never_overlaps_itself_nor_stalls_the_others(tmp_path: Path) -> None:
    """A health check that runs until released, asked for again and again, runs once at a time; heartbeats go on
    beside it; stop waits for it."""
    running, overlaps, finished = [0], [0], []
    lock = threading.Lock()
    # The check runs until the test has seen heartbeats go on beside it (not for a fixed 1.5 s, in which a loaded
    # machine may fit fewer heartbeats): events decide, however slow the machine.
    release = threading.Event()

    def slow_check(host: Host, settings: object, state_dir: str, snapshot: object = None) -> object:
        with lock:
            running[0] += 1
            overlaps[0] = max(overlaps[0], running[0])
        release.wait(120)
        with lock:
            running[0] -= 1
        finished.append(time.monotonic())
        return types.SimpleNamespace(status="pass")

    def until(predicate: Callable[[], bool]) -> bool:
        deadline = time.monotonic() + 120  # only ends a broken run
        while not predicate() and time.monotonic() < deadline:
            time.sleep(0.02)
        return predicate()

    hooks = Hooks(health_run=slow_check, health_last=lambda state_dir: None, health_payloads=lambda result: [])
    settings = Settings.model_validate({
        "agent": {"state_dir": str(tmp_path / "state"), "host_id": "h1"},
        "snapshot": {"interval_seconds": 3600}, "daemon": {"package_watch_interval_seconds": 3600,
                                                           "health_interval_seconds": 0.1,
                                                           "health_first_run_seconds": 0},
        "report": {"heartbeat_interval_seconds": 0.1, "metrics_enabled": False}})
    daemon = Daemon("/nonexistent/agent.toml", SettingsInForce.of(settings), Host(root=Path("/")), SystemdNotifier({}),
                    hooks)
    daemon.start()
    assert until(lambda: running[0] == 1), "the first health check did not start"
    for _ in range(5):
        daemon.runners["health"].request("stack_changed:kernel")
    assert until(lambda: sum(e.kind == "heartbeat" for e in daemon.runtime.outbox.pending(1000)) >= 4), \
        "heartbeats stalled behind the slow health check"
    assert running[0] == 1 and not finished  # all four came while the first check ran
    stop_asked = time.monotonic()
    threading.Timer(0.2, release.set).start()  # the check ends only after the stop began
    daemon.stop()
    assert overlaps[0] == 1
    assert finished and finished[0] >= stop_asked, "stop did not wait for the running check"
