"""Every number the hub stores is range-checked at the API, and a batch the database refuses fails alone: the other
hosts' batches of the same group commit are stored (SQLite and PostgreSQL)."""

from __future__ import annotations

import datetime as dt
import json
import threading
from typing import Any, Dict, List, Sequence

import pytest

from agent.hub.rows import BatchResult, EventQuery
from agent.hub.store import Store
from agent.hub.writer import GroupCommitWriter
from agent.report.events import Event, Heartbeat
from tests.hub.conftest import bearer
from tests.hub.factories import batch_dict, event
from tests.hub.test_store import store  # noqa: F401 - SQLite and a real PostgreSQL


class HeldStore:
    """A real store whose first commit waits at a gate, so the batches submitted meanwhile share the next one."""

    def __init__(self, inner: Store) -> None:
        self.inner = inner
        self.gate = threading.Event()
        self.entered = threading.Event()
        self.commits: List[int] = []

    def ingest(self, batches: Sequence[Sequence[Event]], received_at: dt.datetime) -> List[BatchResult]:
        if not self.entered.is_set():
            self.entered.set()
            assert self.gate.wait(10)
        self.commits.append(len(batches))
        return self.inner.ingest(batches, received_at)


def test_a_batch_the_database_refuses_never_fails_other_hosts_batches(store: Store) -> None:  # noqa: F811
    """host-x's heartbeat claiming serial 2**64 (past the API's checks) shares a commit with five batches of
    host-b: only host-x's batch fails; all of host-b's are stored."""
    held = HeldStore(store)
    writer = GroupCommitWriter(held)  # type: ignore[arg-type]
    writer.start()
    try:
        first = writer.submit([event("host-a")])
        assert held.entered.wait(10)
        bad_payload = Heartbeat.model_construct(**{**event("host-x").payload.model_dump(),  # type: ignore[union-attr]
                                                   "policy_serial": 2**64})
        bad = writer.submit([event("host-x").model_copy(update={"payload": bad_payload})])
        good_events = [event("host-b") for _ in range(5)]
        good = [writer.submit([e]) for e in good_events]
        held.gate.set()
        assert first.result(10).accepted
        with pytest.raises(Exception):  # noqa: B017 - whatever the database says of it: OverflowError, DataError
            bad.result(10)
        assert [f.result(10).accepted for f in good] == [[e.event_id] for e in good_events]
    finally:
        writer.stop()
    assert held.commits[:2] == [1, 6]  # they did share one commit
    stored = {json.loads(e.body)["event_id"] for e in store.events(EventQuery(limit=100, host_id="host-b"))}
    assert stored == {e.event_id for e in good_events}


def heartbeat_body(**fields: Any) -> Dict[str, Any]:
    """A batch of one host-a heartbeat whose payload has ``fields`` set to what the schema may not allow."""
    body = batch_dict([event("host-a")])
    body["events"][0]["payload"].update(fields)
    return body


@pytest.mark.parametrize(("fields", "named"), [
    ({"policy_serial": 2**64}, "policy_serial"),
    ({"policy_serial": 2**63}, "policy_serial"),
    ({"policy_refused_serial": 2**64}, "policy_refused_serial"),
    ({"outbox_depth": 2**63}, "outbox_depth"),
    ({"outbox_depth": -1}, "outbox_depth"),
    ({"rollback_coverage": {"guarded": 2**64, "restorable": 0}}, "guarded"),
    ({"policy_refused_kind": "because"}, "policy_refused_kind"),
])
def test_a_number_out_of_range_is_a_422_naming_the_field(client: Any, tokens: Dict[str, str],
                                                         fields: Dict[str, Any], named: str) -> None:
    """A serial, count or size beyond 0..2**63-1 (or a refusal kind not in the enum) is refused with 422 naming
    the field, and nothing of the batch is stored."""
    reply = client.post("/v1/events", json=heartbeat_body(**fields), headers=bearer(tokens["host-a"]))
    assert reply.status_code == 422, reply.text
    assert named in reply.json()["detail"]
    assert client.get("/v1/hosts", headers=bearer(tokens["ops"])).json()["host_count"] == 0



@pytest.mark.parametrize(("field", "value"), [
    ("target_serial", 2**64), ("revert_serial", 2**63), ("soak_seconds", 2**62), ("report_deadline_seconds", 2**63),
    ("canaries", 2**63),
])
def test_a_rollout_number_out_of_range_is_a_422_naming_the_field(client: Any, admin_token: str, field: str,
                                                                 value: int) -> None:
    """A rollout spec whose serial, wait or count the store or the clock cannot hold is 422 naming the field, never
    a 500 from the database."""
    body: Dict[str, Any] = {"target_serial": 1, field: value}
    reply = client.post("/v1/rollouts", json=body, headers=bearer(admin_token))
    assert reply.status_code == 422, reply.text
    assert field in reply.json()["detail"]
