"""The multi-worker hub's main process under signals: its handler passes the signal on and logs nothing."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from typing import Any, Dict, List, Tuple

import pytest

from agent.hub import server
from agent.hub.settings import HubSettings


class _NoLogging:
    """A logger that fails the test when anything is logged."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"log.{name} called from the signal handler")


class _Recorder:
    """A logger that keeps each info event with its fields."""

    def __init__(self) -> None:
        self.events: List[Tuple[str, Dict[str, Any]]] = []

    def info(self, event: str, **fields: Any) -> None:
        self.events.append((event, fields))


def test_the_signal_handler_forwards_the_signal_without_logging(monkeypatch: pytest.MonkeyPatch) -> None:
    """A log line written from the handler while the interrupted main thread holds the log's write lock would wait
    forever; the handler only marks the hub stopping and signals the workers, and the loop says hub_stopping once."""
    worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        supervisor = server._Supervisor(HubSettings(workers=2, shutdown_timeout_seconds=3))
        supervisor.workers = {worker.pid: time.monotonic()}
        monkeypatch.setattr(server, "log", _NoLogging())
        supervisor._on_signal(signal.SIGTERM, None)
        assert supervisor.stopping
        assert worker.wait(120) == -signal.SIGTERM
        recorder = _Recorder()
        monkeypatch.setattr(server, "log", recorder)
        supervisor._log_stopping_once()
        supervisor._log_stopping_once()
        assert recorder.events == [("hub_stopping", {"grace_seconds": 3.0, "workers": 1})]
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait(10)
