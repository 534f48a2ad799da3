"""End to end: the real ``gpuguard run`` with its state directory on a small tmpfs that fills up and frees again."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.conftest import fill_disk
from tests.daemon.conftest import AgentProcess, agent_config, assert_delivered_once_in_order
from tests.report.receiver import Receiver

pytestmark = pytest.mark.slow


def test_a_full_disk_logs_once_per_state_change_and_recovers_without_loss(tmp_path: Path, host_root: Path,
                                                                          small_disk: Path, receiver: Receiver,
                                                                          token_file: Path) -> None:
    """Heartbeats fail (five tries and more) with one job_failed line, then resume; nothing lost or doubled."""
    agent = AgentProcess(tmp_path, host_root)
    agent.state_dir = small_disk / "state"
    agent.write_config(agent_config(agent.state_dir, receiver.url, token_file))
    try:
        agent.start()
        assert receiver.wait_for(lambda r: r.kinds_stored().count("heartbeat") >= 5)
        filler = small_disk / "filler"
        fill_disk(filler)
        agent.wait_for_log("job_failed", job="heartbeat")
        # Five more tries (a second at 0.2 s, however long a loaded machine takes), each logged as still failing.
        agent.wait_for_log("job_still_failing", count=5, job="heartbeat")
        failures = agent.events_named("job_failed")
        heartbeat_failures = [e for e in failures if e.get("job") == "heartbeat"]
        assert len(heartbeat_failures) <= 2, heartbeat_failures  # at most one per distinct error, not one per try
        stored_while_full = len(receiver.stored)
        os.unlink(filler)
        agent.wait_for_log("job_recovered", job="heartbeat")
        assert receiver.wait_for(lambda r: len(r.stored) >= stored_while_full + 5)
        assert agent.terminate() == 0
        assert_delivered_once_in_order(receiver, agent.outbox())
        tracebacks = [e for e in agent.logs() if "exception" in e]
        # Every traceback is a job_failed line (jobs other than the heartbeat may fail after ``failures`` was read).
        assert all(e.get("event") == "job_failed" for e in tracebacks), "a traceback only with a job_failed line"
    finally:
        agent.cleanup()
