"""The newest facts about each host in a set of events (pure): what one group commit writes into ``hosts``.

All events of a commit were received at the same time, so within the set the agent's per-host ``sequence`` orders
them (``occurred_at``, the agent's clock, only breaks ties of agents that send no sequence). Of the events stored
now (``fresh``; a resent event changes nothing), the newest gives the hostname; the newest snapshot_changed or
heartbeat that carries one gives the pairing; the newest heartbeat gives compliance, agent version, health, labels
and the policy in force. The store's upsert (``schema.UPSERT_HOST``) then keeps, column group by column group,
whichever of the stored row and this update the hub received later (issue 43).
"""

from __future__ import annotations

import datetime as dt
import json
from typing import AbstractSet, Any, Dict, List, NamedTuple, Optional, Sequence, Tuple

from agent.hub.rows import utc
from agent.report.events import Event


class HostUpdate(NamedTuple):
    """The newest facts about one host found in a set of events. A NamedTuple, not a model: it never leaves the
    writer thread, and it is built once per host per commit on the hot path."""

    host_id: str
    hostname: str
    last_event_at: dt.datetime
    last_sequence: int
    pairing_json: Optional[str] = None
    content_hash: Optional[str] = None
    pairing_at: Optional[dt.datetime] = None
    compliant: Optional[bool] = None
    agent_version: Optional[str] = None
    last_health_status: Optional[str] = None
    heartbeat_at: Optional[dt.datetime] = None
    labels_json: Optional[str] = None
    policy_source: Optional[str] = None
    policy_serial: Optional[int] = None
    policy_refused_serial: Optional[int] = None
    policy_refused_reason: Optional[str] = None
    policy_refused_kind: Optional[str] = None
    policy_attention_json: Optional[str] = None  # the heartbeat's policy_attention words as a JSON list
    unknown_versions_json: Optional[str] = None  # the heartbeat's unknown_versions items as a JSON list
    last_health_at: Optional[dt.datetime] = None
    last_health_after_change: Optional[bool] = None
    pairing_sequence: Optional[int] = None
    heartbeat_sequence: Optional[int] = None
    fresh: bool = True  # False: every event of the host in the set was stored before (only last_seen_at moves)


def order_within_receipt(event: Event) -> Tuple[int, dt.datetime]:
    """How one host's events received together order, oldest first: by the agent's sequence, its clock only
    breaking ties (agents that send no sequence)."""
    return event.sequence, utc(event.occurred_at)


def summarize_hosts(events: Sequence[Event],
                    fresh: Optional[AbstractSet[Tuple[str, str]]] = None) -> List[HostUpdate]:
    """Per host (by host_id), the newest identity, pairing and heartbeat among ``events`` that are ``fresh`` (keys
    (host_id, event_id) stored now; None: all are); a host with none fresh only tells it was heard from."""
    by_host: Dict[str, List[Event]] = {}
    for event in events:
        by_host.setdefault(event.host_id, []).append(event)
    updates = []
    for host_id in sorted(by_host):
        ordered = sorted(by_host[host_id], key=order_within_receipt)
        newest = ordered[-1]
        fields: Dict[str, Any] = {"host_id": host_id, "hostname": newest.hostname,
                                  "last_event_at": utc(newest.occurred_at), "last_sequence": newest.sequence}
        if fresh is not None:
            ordered = [e for e in ordered if (e.host_id, e.event_id) in fresh]
            if not ordered:
                updates.append(HostUpdate(**fields, fresh=False))
                continue
            newest = ordered[-1]
            fields.update(hostname=newest.hostname, last_event_at=utc(newest.occurred_at),
                          last_sequence=newest.sequence)
        for event in reversed(ordered):
            payload = event.payload
            content_hash: Optional[str]
            if payload.kind == "snapshot_changed":
                pairing, content_hash = payload.pairing, payload.new_hash
            elif payload.kind == "heartbeat" and payload.pairing is not None:
                pairing, content_hash = payload.pairing, payload.content_hash
            else:
                continue
            fields.update(pairing_json=pairing.model_dump_json(), pairing_at=utc(event.occurred_at),
                          content_hash=content_hash, pairing_sequence=event.sequence)
            break
        for event in reversed(ordered):
            payload = event.payload
            if payload.kind == "heartbeat":
                fields.update(compliant=payload.compliant, agent_version=payload.agent_version,
                              last_health_status=payload.last_health_status, heartbeat_at=utc(event.occurred_at),
                              labels_json=None if payload.labels is None else json.dumps(payload.labels,
                                                                                         sort_keys=True),
                              policy_source=payload.policy_source, policy_serial=payload.policy_serial,
                              policy_refused_serial=payload.policy_refused_serial,
                              policy_refused_reason=payload.policy_refused_reason,
                              policy_refused_kind=payload.policy_refused_kind,
                              policy_attention_json=None if payload.policy_attention is None
                              else json.dumps(sorted(set(payload.policy_attention))),
                              unknown_versions_json=None if payload.unknown_versions is None
                              else json.dumps([u.model_dump(mode="json") for u in payload.unknown_versions],
                                              sort_keys=True),
                              last_health_at=None if payload.last_health_at is None else utc(payload.last_health_at),
                              last_health_after_change=payload.last_health_after_change,
                              heartbeat_sequence=event.sequence)
                break
        updates.append(HostUpdate(**fields))
    return updates
