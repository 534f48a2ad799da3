"""Fixtures for daemon tests: a real ``gpuguard run`` subprocess over a copied fixture root, and the receiver."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, Iterator, List, Optional

import pytest

from agent.report.outbox import Outbox
from agent.statepaths import StatePaths
from tests.conftest import ROOTS
from tests.report.conftest import certificates, receiver, token_file  # noqa: F401 - shared fixtures
from tests.report.receiver import Receiver

REPO = Path(__file__).resolve().parents[2]
TOKEN = "test-token-0123456789"


# The noqa F811s below: a parameter named like an imported fixture is not a redefinition of it.
def agent_config(state_dir: Path, endpoint_url: Optional[str] = None, token_file: Optional[Path] = None,  # noqa: F811
                 log_level: str = "debug", **report: object) -> str:
    """A config with short intervals so tests see many events quickly; ``report`` overrides [report] keys."""
    values: Dict[str, object] = {"heartbeat_interval_seconds": 0.2, "delivery_interval_seconds": 0.5,
                                 "backoff_base_seconds": 0.05, "backoff_cap_seconds": 0.4,
                                 "connect_timeout_seconds": 1.0, "read_timeout_seconds": 2.0, "batch_size": 5}
    if endpoint_url:
        values["endpoint_url"] = endpoint_url
    values["token_file"] = str(token_file) if token_file else None
    values.update(report)
    lines = ["[agent]", f'state_dir = "{state_dir}"', f'log_level = "{log_level}"', "host_id = \"test-host-1\"",
             "[snapshot]", "interval_seconds = 600", "[daemon]", "package_watch_interval_seconds = 0.1",
             "health_first_run_seconds = 0", "[report]"]
    for key, value in values.items():
        if value is None:
            continue
        lines.append(f"{key} = {json.dumps(value)}")
    return "\n".join(lines) + "\n"


class AgentProcess:
    """One ``python -m agent run`` subprocess; stderr (JSON log lines) goes to a file the test can read."""

    def __init__(self, workdir: Path, root: Path, env: Optional[Dict[str, str]] = None) -> None:
        self.workdir = workdir
        self.root = root
        self.config = workdir / "agent.toml"
        self.state_dir = workdir / "state"
        self.env = env or {}
        self.proc: Optional[subprocess.Popen] = None
        self.runs = 0

    @property
    def log_path(self) -> Path:
        return self.workdir / f"agent-{self.runs}.log"

    def write_config(self, text: str) -> None:
        self.config.write_text(text)

    def start(self) -> "AgentProcess":
        assert self.proc is None or self.proc.poll() is not None
        self.runs += 1
        env = {k: v for k, v in os.environ.items() if k not in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")}
        env.update({"PYTHONPATH": str(REPO), **self.env})
        with open(self.log_path, "wb") as stderr:
            self.proc = subprocess.Popen([sys.executable, "-m", "agent", "run", "--config", str(self.config),
                                          "--root", str(self.root)], cwd=str(REPO), env=env,
                                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=stderr)
        return self

    def logs(self, run: Optional[int] = None) -> List[dict]:
        path = self.workdir / f"agent-{run or self.runs}.log"
        out = []
        for line in path.read_text().splitlines() if path.exists() else []:
            try:
                out.append(json.loads(line))
            except ValueError:
                out.append({"event": "not_json", "line": line})
        return out

    def events_named(self, name: str) -> List[dict]:
        return [entry for entry in self.logs() if entry.get("event") == name]

    def wait_for_log(self, name: str, count: int = 1, timeout_seconds: float = 120.0, **match: object) -> List[dict]:
        """The first ``count`` log entries named ``name`` (matching ``match``) once logged; the deadline only ends a
        broken run, so it is generous enough for a loaded machine."""
        deadline = time.monotonic() + timeout_seconds
        while time.monotonic() < deadline:
            found = [e for e in self.events_named(name) if all(e.get(k) == v for k, v in match.items())]
            if len(found) >= count:
                return found
            assert self.proc is not None and self.proc.poll() is None, \
                f"agent exited {self.proc.returncode if self.proc else None}: {self.log_path.read_text()[-3000:]}"
            time.sleep(0.05)
        unparsed = [e["line"][:300] for e in self.logs() if e.get("event") == "not_json"]
        raise AssertionError(f"no {count}x {name} {match} within {timeout_seconds} s; lines that are not JSON "
                             f"(two merged?): {unparsed[-5:]}; the log but job_ran: "
                             f"{self.log_without_job_ran()[-6000:]}")

    def log_without_job_ran(self) -> str:
        """The log's lines but the scheduler's job_ran ones, which fill a failed wait's tail at short intervals."""
        return "\n".join(line for line in self.log_path.read_text().splitlines() if '"event": "job_ran"' not in line)

    def send(self, sig: int) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, sig)

    def terminate(self, timeout_seconds: float = 15.0) -> int:
        """SIGTERM and wait; returns the exit code."""
        self.send(signal.SIGTERM)
        assert self.proc is not None
        return self.proc.wait(timeout_seconds)

    def kill(self) -> None:
        """SIGKILL, as the OOM killer or a power cut would end it; returns once its job children have ended too
        (the kernel sends them SIGTERM when the daemon dies: nothing touches the state after this)."""
        assert self.proc is not None
        self.send(signal.SIGSTOP)  # no child spawned between the look below and the kill
        children = daemon_children(self.proc.pid)
        self.send(signal.SIGKILL)
        self.proc.wait(15)
        wait_until_ended(children, 30.0)

    def cleanup(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(15)

    def outbox(self) -> Outbox:
        return Outbox(StatePaths(str(self.state_dir)).outbox)


@pytest.fixture
def host_root(tmp_path: Path) -> Path:
    """A writable copy of the GPU-less Debian 12 fixture root (tests change its dpkg database)."""
    root = tmp_path / "root"
    shutil.copytree(ROOTS / "gpuless-debian12", root, symlinks=True)
    return root


@pytest.fixture
def agent(tmp_path: Path, host_root: Path) -> Iterator[AgentProcess]:
    process = AgentProcess(tmp_path, host_root)
    yield process
    process.cleanup()


def assert_delivered_once_in_order(receiver: Receiver, outbox: Outbox) -> List[int]:  # noqa: F811
    """Every sequence ever assigned is either stored once at the receiver or still pending; stored in order."""
    stored = receiver.sequences_stored()
    pending = [e.sequence for e in outbox.pending(100000)]
    last = outbox.last_sequence()
    assert stored == sorted(stored), "receiver stored events out of sequence order"
    assert len(set(stored)) == len(stored), "an event was stored twice"
    assert not set(stored) & set(pending), "an acknowledged event is still pending"
    assert set(stored) | set(pending) == set(range(1, last + 1)), "an event was lost"
    assert len(receiver.stored) == len(stored)
    return stored


def daemon_children(pid: int) -> List[int]:
    """The daemon's child processes now (from /proc/PID/task/*/children)."""
    found: List[int] = []
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return found
    for task in tasks:
        try:
            found += [int(p) for p in (task / "children").read_text().split()]
        except OSError:
            continue
    return found


def wait_until_ended(pids: List[int], timeout_seconds: float) -> None:
    """Return once none of ``pids`` runs (a zombie, reaped by init, counts as ended); fail after the timeout."""
    deadline = time.monotonic() + timeout_seconds
    while any(_alive(pid) for pid in pids):
        assert time.monotonic() < deadline, f"processes {pids} still run after {timeout_seconds} s"
        time.sleep(0.02)


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False
