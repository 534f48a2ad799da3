"""End to end: the real ``gpuguard run`` process against a real HTTP(S) endpoint on 127.0.0.1."""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
from pathlib import Path
from typing import List

import pytest

from tests.daemon.conftest import TOKEN, AgentProcess, agent_config, assert_delivered_once_in_order
from tests.report.receiver import Receiver

pytestmark = pytest.mark.slow


def test_events_arrive_exactly_once_in_order_after_the_endpoint_was_down(agent: AgentProcess, token_file: Path) -> None:
    """Events pile up while nothing listens, then all arrive once, in sequence order, and the token is never logged."""
    receiver = Receiver().start()
    receiver.stop()  # the port is known, nothing listens: the endpoint is down
    agent.write_config(agent_config(agent.state_dir, receiver.url, token_file))
    agent.start()
    agent.wait_for_log("delivery_failed", count=3, category="unreachable")
    receiver.start()
    try:
        assert receiver.wait_for(lambda r: len(r.stored) >= 10), "events did not arrive after the endpoint came up"
        assert agent.terminate() == 0
    finally:
        receiver.stop()
    stored = assert_delivered_once_in_order(receiver, agent.outbox())
    # The first snapshot runs in a child (about 0.4 s), so a 0.2 s heartbeat may come before its event.
    assert stored[0] == 1 and "snapshot_changed" in receiver.kinds_stored()
    arrived = [event_id for event_id, _ in receiver.arrivals]
    assert len(arrived) == len(set(arrived)), "without a crash nothing is sent twice"
    assert {e["host_id"] for e in receiver.stored.values()} == {"test-host-1"}
    assert TOKEN not in agent.log_path.read_text()


def test_sigkill_mid_delivery_then_restart_loses_and_duplicates_nothing(agent: AgentProcess, receiver: Receiver,
                                                                        token_file: Path) -> None:
    """The batch the receiver stored but could not acknowledge is sent again and acknowledged as duplicates."""
    agent.write_config(agent_config(agent.state_dir, receiver.url, token_file))
    agent.start()
    assert receiver.wait_for(lambda r: len(r.stored) >= 3)
    receiver.hold_next = True
    assert receiver.held.wait(120), "no batch arrived to hold"
    agent.kill()
    held = list(receiver.held_ids)
    receiver.release.set()
    stored_before_restart = len(receiver.stored)
    agent.start()
    assert receiver.wait_for(lambda r: set(held) <= set(r.duplicates_reported)), "held batch was not re-sent"
    assert receiver.wait_for(lambda r: len(r.stored) >= stored_before_restart + 5)
    assert agent.terminate() == 0
    assert_delivered_once_in_order(receiver, agent.outbox())
    assert sorted(set(receiver.duplicates_reported)) == sorted(held)


def test_endpoint_answering_500_is_retried_with_backoff(agent: AgentProcess, receiver: Receiver,
                                                        token_file: Path) -> None:
    """5xx keeps every event; retries are spaced by backoff; all arrive once the endpoint recovers."""
    receiver.mode = "error500"
    agent.write_config(agent_config(agent.state_dir, receiver.url, token_file))
    agent.start()
    failures = agent.wait_for_log("delivery_failed", count=4, category="server")
    assert all(0 <= f["retry_in_seconds"] <= 0.4 for f in failures)
    assert receiver.stored == {}
    receiver.mode = "ok"
    assert receiver.wait_for(lambda r: len(r.stored) >= 5)
    agent.wait_for_log("delivery_recovered")
    assert agent.terminate() == 0
    assert_delivered_once_in_order(receiver, agent.outbox())


def test_endpoint_that_hangs_times_out_and_is_retried(agent: AgentProcess, receiver: Receiver,
                                                      token_file: Path) -> None:
    """A reply that never comes ends at the read timeout; the events are sent again later."""
    receiver.mode = "hang"
    agent.write_config(agent_config(agent.state_dir, receiver.url, token_file, read_timeout_seconds=0.3))
    agent.start()
    agent.wait_for_log("delivery_failed", count=2, category="timeout")
    receiver.unhang()
    assert receiver.wait_for(lambda r: len(r.stored) >= 5)
    assert agent.terminate() == 0
    assert_delivered_once_in_order(receiver, agent.outbox())


def test_bad_tls_certificate_is_refused_until_the_ca_bundle_is_configured(agent: AgentProcess, token_file: Path,
                                                                          certificates) -> None:  # type: ignore
    """Nothing is sent to an endpoint whose certificate does not verify; a SIGHUP with ca_bundle fixes it."""
    cert, key = certificates[0]
    receiver = Receiver(tls=(cert, key)).start()
    try:
        agent.write_config(agent_config(agent.state_dir, receiver.url, token_file))
        agent.start()
        agent.wait_for_log("delivery_failed", count=2, category="tls")
        assert receiver.stored == {} and receiver.auth_failures == 0
        agent.write_config(agent_config(agent.state_dir, receiver.url, token_file, ca_bundle=cert))
        agent.send(signal.SIGHUP)
        agent.wait_for_log("config_reloaded")
        assert receiver.wait_for(lambda r: len(r.stored) >= 5)
        assert agent.terminate() == 0
    finally:
        receiver.stop()
    assert_delivered_once_in_order(receiver, agent.outbox())


def test_package_change_triggers_a_snapshot_changed_event_with_the_diff(agent: AgentProcess, receiver: Receiver,
                                                                        token_file: Path) -> None:
    """A new dpkg status file (as after an apt upgrade) is noticed without waiting for the snapshot interval."""
    agent.write_config(agent_config(agent.state_dir, receiver.url, token_file, heartbeat_interval_seconds=600))
    agent.start()
    assert receiver.wait_for(lambda r: r.kinds_stored() == ["snapshot_changed"])
    status = agent.root / "var/lib/dpkg/status"
    new = agent.root / "var/lib/dpkg/status-new"
    new.write_text(status.read_text().replace("Version: 1.7.22-1", "Version: 1.7.23-1"))
    os.replace(new, status)
    assert receiver.wait_for(lambda r: r.kinds_stored() == ["snapshot_changed"] * 2)
    second = receiver.stored[receiver.stored_order[1]]
    assert second["payload"]["old_hash"] == receiver.stored[receiver.stored_order[0]]["payload"]["new_hash"]
    assert {"section": "dpkg", "path": "packages.containerd.io.version", "old": "1.7.22-1",
            "new": "1.7.23-1"} in second["payload"]["changes"]
    assert agent.terminate() == 0
    metrics = (agent.state_dir / "metrics" / "gpuguard.prom").read_text()
    assert 'kernel_running="6.1.0-26-amd64"' in metrics and "gpuguard_outbox_depth 0" in metrics


def test_sigterm_exits_zero_promptly_and_systemd_is_told(tmp_path: Path, host_root: Path) -> None:
    """READY=1 at start, WATCHDOG=1 at half the watchdog period, STOPPING=1 and exit 0 on SIGTERM."""
    notify_path = tmp_path / "notify.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(notify_path))
    sock.settimeout(0.1)
    messages: List[str] = []
    done = threading.Event()

    def listen() -> None:
        while not done.is_set():
            try:
                messages.append(sock.recv(4096).decode())
            except socket.timeout:
                pass

    listener = threading.Thread(target=listen, daemon=True)
    listener.start()
    agent = AgentProcess(tmp_path, host_root, env={"NOTIFY_SOCKET": str(notify_path), "WATCHDOG_USEC": "400000"})
    try:
        agent.write_config(agent_config(agent.state_dir))
        agent.start()
        agent.wait_for_log("daemon_started")
        deadline = time.monotonic() + 60  # pings come every 0.2 s; the deadline only ends a broken run
        while sum(m == "WATCHDOG=1" for m in list(messages)) < 3:
            assert time.monotonic() < deadline, f"watchdog pings missing: {messages}"
            time.sleep(0.05)
        # Promptly: within terminate's 60 s, far below the 600 s snapshot interval a stop that waited for the next
        # run would take, and a bound a loaded machine cannot reach.
        assert agent.terminate(timeout_seconds=60) == 0
        deadline = time.monotonic() + 60  # the listener thread reads STOPPING=1, sent before the exit, when it runs
        while not any(m.startswith("STOPPING=1") for m in list(messages)):
            assert time.monotonic() < deadline, f"STOPPING=1 missing: {messages}"
            time.sleep(0.02)
        ready = [i for i, m in enumerate(messages) if m.startswith("READY=1\nSTATUS=running")]
        stopping = [i for i, m in enumerate(messages) if m.startswith("STOPPING=1")]
        assert len(ready) == 1 and len(stopping) == 1 and ready[0] < stopping[0]
        assert agent.events_named("daemon_stopped")
        assert agent.events_named("report_endpoint_not_configured")
    finally:
        done.set()
        listener.join(5)
        agent.cleanup()
        sock.close()


def _outbox_depth(agent: AgentProcess) -> int:
    for line in (agent.state_dir / "metrics" / "gpuguard.prom").read_text().splitlines():
        if line.startswith("gpuguard_outbox_depth "):
            return int(line.split()[1])
    raise AssertionError("no gpuguard_outbox_depth in the textfile")


def test_sighup_with_an_invalid_config_keeps_the_old_one(agent: AgentProcess) -> None:
    """Every problem of the new file is logged; the daemon keeps running on the previous settings."""
    agent.write_config(agent_config(agent.state_dir))
    agent.start()
    agent.wait_for_log("daemon_started")
    agent.config.write_text(agent_config(agent.state_dir) + 'max_events = 1\nendpoint_url = "ftp://nowhere"\n')
    agent.send(signal.SIGHUP)
    failed = agent.wait_for_log("config_reload_failed")[0]
    assert len(failed["problems"]) == 2 and failed["kept"] == "previous configuration"
    depth = _outbox_depth(agent)
    deadline = time.monotonic() + 120  # only ends a broken run
    while _outbox_depth(agent) < depth + 3:
        assert time.monotonic() < deadline, "heartbeats stopped after a failed reload"
        time.sleep(0.1)
    agent.write_config(agent_config(agent.state_dir, heartbeat_interval_seconds=5.0))
    agent.send(signal.SIGHUP)
    agent.wait_for_log("config_reloaded")
    assert agent.terminate() == 0


def test_world_readable_token_file_refuses_to_start_with_one_line(agent: AgentProcess, token_file: Path) -> None:
    """Exit 3 and one line on stderr naming the file, the mode and the fix; the token is not printed."""
    os.chmod(token_file, 0o644)
    agent.write_config(agent_config(agent.state_dir, "https://hub.example", token_file))
    agent.start()
    assert agent.proc is not None and agent.proc.wait(120) == 3
    lines = agent.log_path.read_text().splitlines()
    assert lines == [f"gpuguard: error: {token_file}: token file is accessible by group or others (mode 0644); "
                     f"run: chmod 600 {token_file}"]
    assert not (agent.state_dir / "outbox.sqlite3").exists()
