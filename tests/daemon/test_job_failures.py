"""A job that keeps failing the same way (the disk is full) logs once per state change, not once per run."""

from __future__ import annotations

import io
import json
import threading
from typing import List

from agent.daemon import JobRunner
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
