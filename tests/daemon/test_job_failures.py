"""A job that keeps failing the same way (the disk is full) logs once per state change, not once per run."""

from __future__ import annotations

import io
import json
import threading
from typing import List

from agent.daemon_jobs.job_runner import JobRunner
from agent.log import configure


def test_the_same_failure_is_logged_once_and_the_recovery_once() -> None:
    """175 failed runs with one error give one job_failed (with traceback), a new error another, recovery one line."""
    stream = io.StringIO()
    configure(level="info", json_output=True, stream=stream)
    errors: List[Exception] = [OSError(28, "No space left on device")] * 175 + [OSError(5, "I/O error")]

    def body(reason: str) -> None:
        if errors:
            raise errors.pop(0)

    runner = JobRunner("heartbeat", body, threading.Event())
    for _ in range(177):
        runner()
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert [(e["event"], e.get("failed_runs")) for e in lines] == [
        ("job_failed", 1), ("job_failed", 176), ("job_recovered", 176)]
    assert "No space left" in lines[0]["error"] and "exception" in lines[0]
    assert lines[2]["last_error"] == "OSError: [Errno 5] I/O error"


def test_a_damage_report_the_full_disk_refused_is_held_and_committed_later(tmp_path, monkeypatch) -> None:
    """The damaged file is moved aside at once; its report waits in memory until the outbox takes it again."""
    from pathlib import Path

    from agent.host import Host
    from tests.conftest import fixed_clock
    from tests.daemon.test_jobs import make_runtime

    rt = make_runtime(tmp_path, Host(root=Path("/"), clock=fixed_clock))
    damaged = tmp_path / "last-snapshot.json"
    damaged.write_bytes(b"\xff")
    real_emit = rt.emitter.emit
    full = [True]

    def emit(*args, **kwargs):
        if full[0]:
            raise OSError(28, "No space left on device")
        return real_emit(*args, **kwargs)

    monkeypatch.setattr(rt.emitter, "emit", emit)
    moved_to = rt.report_damaged_file(str(damaged), "not UTF-8 text (byte 0)", "starting without it")
    assert moved_to and Path(moved_to).read_bytes() == b"\xff" and not damaged.exists()
    rt.report_held_damage()  # still full: held again
    assert rt.outbox.depth() == 0
    full[0] = False
    rt.report_held_damage()
    [event] = rt.outbox.pending(10)
    assert event.kind == "state_file_damaged" and event.payload.moved_to == moved_to
    rt.report_held_damage()
    assert rt.outbox.depth() == 1, "reported once"
    rt.outbox.close()
