"""A real ``gpuguard hub serve`` process on 127.0.0.1 (port 0: the kernel picks one), for tests and the bench.

The port is read from the hub's ``hub_listening`` log line; stderr is drained by a thread so the hub never blocks
on a full pipe; ``stop()`` sends SIGTERM to the PID this object started (SIGKILL if it outlives the grace).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

REPO = Path(__file__).resolve().parents[2]
START_TIMEOUT_SECONDS = 120.0  # a loaded 2-core CI machine imports the hub slowly; a hub that fails exits sooner


class HubProcess:
    """One hub server process and what it logged."""

    def __init__(self, config_path: Path, env: Optional[Dict[str, str]] = None,
                 now: Optional[dt.datetime] = None) -> None:
        """``now``: the hub's clock stands still at that time (tests/hub/clocked_hub.py); None: the real clock."""
        self.config_path = config_path
        self.env = env
        self.now = now
        self.process: Optional[subprocess.Popen] = None
        self.lines: List[str] = []
        self.port: Optional[int] = None
        self._listening = threading.Event()
        self._reader: Optional[threading.Thread] = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> "HubProcess":
        """Start (or start again after stop()); returns once the hub listens. Log lines accumulate across runs."""
        self._listening = threading.Event()
        self.port = None
        env = dict(os.environ if self.env is None else self.env)
        env["PYTHONPATH"] = str(REPO)
        command = ["-m", "agent", "hub", "serve", "--config", str(self.config_path)]
        if self.now is not None:
            command = ["-m", "tests.hub.clocked_hub", "--config", str(self.config_path), "--now", self.now.isoformat()]
        self.process = subprocess.Popen(
            [sys.executable, *command],
            cwd=str(REPO), env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            text=True, bufsize=1)
        self._reader = threading.Thread(target=self._drain, name="hub-stderr", daemon=True)
        self._reader.start()
        if not self._listening.wait(START_TIMEOUT_SECONDS) or self.port is None:
            self.stop()
            raise RuntimeError(f"hub did not start within {START_TIMEOUT_SECONDS:g} s:\n{self.log_text()}")
        return self

    def _drain(self) -> None:
        assert self.process is not None and self.process.stderr is not None
        listening = self._listening
        for line in self.process.stderr:
            self.lines.append(line.rstrip("\n"))
            record = self._parse(line)
            if record.get("event") == "hub_listening":
                self.port = int(record["port"])
                listening.set()
        listening.set()  # exited: stop waiting

    @staticmethod
    def _parse(line: str) -> Dict[str, Any]:
        try:
            record = json.loads(line)
        except ValueError:
            return {}
        return record if isinstance(record, dict) else {}

    def events(self, name: str) -> List[Dict[str, Any]]:
        """Log records with event ``name``."""
        return [r for r in (self._parse(line) for line in list(self.lines)) if r.get("event") == name]

    def log_text(self) -> str:
        return "\n".join(self.lines[-60:])

    def stop(self, grace_seconds: float = 20.0) -> Optional[int]:
        """SIGTERM by PID, then wait; SIGKILL after ``grace_seconds``. Returns the exit code."""
        if self.process is None:
            return None
        if self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(grace_seconds)
            except subprocess.TimeoutExpired:
                os.kill(self.process.pid, signal.SIGKILL)
                self.process.wait(grace_seconds)
        if self._reader is not None:
            self._reader.join(5)
        return self.process.returncode


def write_config(path: Path, **settings: Any) -> Path:
    """A hub.toml with the given flat keys."""
    lines = []
    for key, value in settings.items():
        if isinstance(value, bool):
            lines.append(f"{key} = {'true' if value else 'false'}")
        elif isinstance(value, (int, float)):
            lines.append(f"{key} = {value}")
        else:
            lines.append(f"{key} = {json.dumps(str(value))}")
    path.write_text("\n".join(lines) + "\n")
    return path


def wait_until(predicate: Any, timeout_seconds: float = 120.0) -> bool:
    """True once ``predicate()`` holds; False after ``timeout_seconds`` (generous: it only ends a broken run, and a
    loaded machine must not expire it)."""
    deadline = time.monotonic() + timeout_seconds
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return False
