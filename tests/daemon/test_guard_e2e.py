"""End to end: a guard-events line written under the daemon's --root arrives at the HTTP receiver on 127.0.0.1."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent.daemon_jobs.guard_events import event_id_for_line
from agent.guard.hotpath.state import append_json_line
from tests.daemon.conftest import AgentProcess, agent_config, assert_delivered_once_in_order
from tests.report.receiver import Receiver

pytestmark = pytest.mark.slow

BLOCKED = {"occurred_at": "2026-03-01T12:00:00+00:00", "kind": "transaction_blocked", "tool": "apt",
           "rule": "amd.pairing", "message": "breaks the pinned AMD pairing 'rocm-6.2'",
           "packages": {"rocm-core": "6.2.2 -> 6.3.0"}, "command_line": "apt-get install rocm-core"}


def test_guard_event_written_by_the_hook_is_delivered_once_even_across_a_restart(agent: AgentProcess,
                                                                                 receiver: Receiver,
                                                                                 token_file: Path) -> None:
    """The watcher notices the line, the forwarder commits it with its line-hash id, delivery sends it; a restart
    does not forward it again (the position is kept in the state directory)."""
    agent.write_config(agent_config(agent.state_dir, receiver.url, token_file, heartbeat_interval_seconds=600))
    events = agent.root / str(agent.state_dir).lstrip("/") / "guard-events.jsonl"  # the hook's path in that root
    agent.start()
    assert receiver.wait_for(lambda r: r.kinds_stored() == ["snapshot_changed"])
    append_json_line(str(events), BLOCKED)
    assert receiver.wait_for(lambda r: "transaction_blocked" in r.kinds_stored())
    raw = json.dumps(BLOCKED, sort_keys=True, separators=(",", ":")).encode()
    stored = receiver.stored[event_id_for_line(raw)]
    assert stored["severity"] == "critical" and stored["occurred_at"].startswith("2026-03-01T12:00:00")
    assert stored["payload"]["command_line"] == "apt-get install rocm-core"
    agent.wait_for_log("guard_events_forwarded", events=1)
    assert agent.terminate() == 0
    agent.start()
    agent.wait_for_log("daemon_started")
    append_json_line(str(events), {**BLOCKED, "occurred_at": "2026-03-01T12:05:00+00:00"})
    assert receiver.wait_for(lambda r: r.kinds_stored().count("transaction_blocked") == 2)
    assert agent.terminate() == 0
    assert receiver.kinds_stored().count("transaction_blocked") == 2
    assert not receiver.duplicates_reported, "the restart forwarded an old line again"
    assert_delivered_once_in_order(receiver, agent.outbox())
