"""The real agent against the real reference hub (``gpuguard hub serve``): down, up, SIGKILL, restart."""

from __future__ import annotations

import os
import sqlite3
import time
from pathlib import Path
from typing import Iterator, List

import pytest

from agent.hub.tokens import add_token
from tests.daemon.conftest import AgentProcess, agent_config
from tests.hub.process import HubProcess, write_config

pytestmark = pytest.mark.slow


@pytest.fixture
def hub(tmp_path: Path) -> Iterator[HubProcess]:
    hub_dir = tmp_path / "hub"
    hub_dir.mkdir()
    config = write_config(hub_dir / "hub.toml", listen_host="127.0.0.1", listen_port=0,
                          database_url=f"sqlite:///{hub_dir}/hub.db", tokens_file=hub_dir / "tokens.json",
                          tokens_reload_seconds=0, shutdown_timeout_seconds=5, log_level="debug")
    process = HubProcess(config)
    process.hub_dir = hub_dir  # type: ignore[attr-defined]
    yield process
    process.stop()


def hub_sequences(hub_dir: Path) -> List[int]:
    with sqlite3.connect(hub_dir / "hub.db") as conn:
        rows = conn.execute("SELECT sequence, COUNT(*) FROM events WHERE host_id = 'test-host-1' "
                            "GROUP BY event_id ORDER BY sequence").fetchall()
    assert all(count == 1 for _, count in rows)
    return [sequence for sequence, _ in rows]


def test_agent_and_hub_agree_after_downtime_and_a_sigkill(tmp_path: Path, agent: AgentProcess,
                                                          hub: HubProcess) -> None:
    """Hub down at first, then up; agent SIGKILLed while delivering and restarted: every event stored once."""
    hub_dir: Path = hub.hub_dir  # type: ignore[attr-defined]
    token = add_token(str(hub_dir / "tokens.json"), "host", "test-host-1")
    token_file = tmp_path / "token"
    token_file.write_text(token + "\n")
    os.chmod(token_file, 0o600)
    hub.start()
    port = hub.port
    hub.stop()
    agent.write_config(agent_config(agent.state_dir, f"http://127.0.0.1:{port}", token_file, batch_size=2))
    agent.start()
    agent.wait_for_log("delivery_failed", count=2, category="unreachable")
    hub.config_path.write_text(hub.config_path.read_text().replace("listen_port = 0", f"listen_port = {port}"))
    hub.start()
    deadline = time.monotonic() + 120  # only ends a broken run
    while len(hub.events("hub_batch_stored")) < 3:
        assert time.monotonic() < deadline, hub.log_text()
        time.sleep(0.02)
    agent.kill()
    agent.start()
    agent.wait_for_log("delivery_batch_sent", count=3)
    assert agent.terminate() == 0
    outbox = agent.outbox()
    stored = hub_sequences(hub_dir)
    pending = [e.sequence for e in outbox.pending(100000)]
    assert set(stored) | set(pending) == set(range(1, outbox.last_sequence() + 1))
    assert not set(stored) & set(pending) and len(stored) >= 6


def test_the_hub_stores_state_file_damaged_and_guard_events_past_a_hostile_line(tmp_path: Path, agent: AgentProcess,
                                                                                  hub: HubProcess) -> None:
    """A damaged last-snapshot.json and a hostile guard line reach the real hub as state_file_damaged; 5 guard lines
    around the bad one arrive; the hub holds every sequence the agent assigned, once."""
    from agent.guard.hotpath.state import append_json_line

    hub_dir: Path = hub.hub_dir  # type: ignore[attr-defined]
    token_file = tmp_path / "token"
    token_file.write_text(add_token(str(hub_dir / "tokens.json"), "host", "test-host-1") + "\n")
    os.chmod(token_file, 0o600)
    hub.start()
    agent.state_dir.mkdir(parents=True)
    (agent.state_dir / "last-snapshot.json").write_bytes(b"\xff\xfe not a snapshot")
    events = agent.root / str(agent.state_dir).lstrip("/") / "guard-events.jsonl"
    agent.write_config(agent_config(agent.state_dir, hub.url, token_file, heartbeat_interval_seconds=600))
    agent.start()
    for n in range(5):
        append_json_line(str(events), {"occurred_at": f"2026-03-01T12:00:0{n}+00:00", "kind": "transaction_blocked",
                                       "tool": "apt", "rule": "r", "message": "m"})
        if n == 2:
            with open(events, "ab") as handle:
                handle.write(b'{"kind": "override_used", "window": {"id": "w"}, "violations": 5}\n')

    def kinds() -> List[str]:
        with sqlite3.connect(hub_dir / "hub.db") as conn:
            return [k for (k,) in conn.execute("SELECT kind FROM events WHERE host_id = 'test-host-1'")]

    deadline = time.monotonic() + 120  # only ends a broken run
    while kinds().count("transaction_blocked") < 5 or kinds().count("state_file_damaged") < 2:
        assert time.monotonic() < deadline, (kinds(), agent.log_path.read_text()[-3000:])
        time.sleep(0.1)
    assert agent.terminate() == 0
    outbox = agent.outbox()
    stored = hub_sequences(hub_dir)
    pending = [e.sequence for e in outbox.pending(100000)]
    assert set(stored) | set(pending) == set(range(1, outbox.last_sequence() + 1)), "a gap"
    assert not set(stored) & set(pending)
    assert kinds().count("state_file_damaged") == 2 and kinds().count("transaction_blocked") == 5
