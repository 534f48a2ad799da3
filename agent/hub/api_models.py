"""The bodies of the hub's HTTP API, as typed models; the OpenAPI spec (``GET /openapi.json``) is generated from
them. The request body of ``POST /v1/events`` is the agent's own ``EventBatch`` (``agent.report.events``).

A docstring on a model becomes its description in the spec; the answers' models carry none.
"""

from __future__ import annotations

import datetime as dt
from typing import Dict, List, Literal, Optional

from pydantic import Field

from agent.hub.fleet import DriftHost, PairingCount
from agent.hub.rows import AuditEntry, BundleSummary, HostRow
from agent.models import FrozenModel
from agent.report.events import PAYLOAD_KINDS, Event

# Every kind in the event schema; built from the tuple at run time, which a type checker cannot follow.
PayloadKind = Literal[PAYLOAD_KINDS]  # type: ignore[valid-type]


class ErrorBody(FrozenModel):
    """Every refusal: a machine-readable ``error``, a one-line ``detail``, and each problem when there are several."""

    error: str
    detail: str
    problems: List[str] = []


class Health(FrozenModel):
    status: Literal["ok"]
    store: str
    event_schema_version: int


class HostsResponse(FrozenModel):
    host_count: int
    # hosts whose newest heartbeat reports a version unknown to each of gpuguard's tables (agent/wire.py's
    # UNKNOWN_TABLES: "amd-matrix", "therock", "dcgm-exporter"), 0 included
    hosts_unknown_by_table: Dict[str, int] = {}
    hosts: List[HostRow]


class PairingsResponse(FrozenModel):
    host_count: int
    hosts_without_pairing: int
    pairings: List[PairingCount]


class DriftResponse(FrozenModel):
    since: dt.datetime
    kinds: List[str]
    host_count: int
    hosts: List[DriftHost]


class EventRecord(FrozenModel):
    received_at: dt.datetime
    event: Event


class EventsResponse(FrozenModel):
    count: int
    events: List[EventRecord]



class BundlePush(FrozenModel):
    """A policy bundle to store: its exact bytes and its detached OpenPGP signature, each base64 (standard alphabet)."""

    bundle: str = Field(min_length=1)
    signature: str = Field(min_length=1)
    # Offered only through a staged rollout (to its admitted hosts) until the rollout is done.
    staged: bool = False


class DenyPush(FrozenModel):
    """A deny list to put in place (agent/hub/deny.py): its exact bytes and its detached OpenPGP signatures, each
    base64 (standard alphabet)."""

    deny: str = Field(min_length=1)
    signature: str = Field(min_length=1)


class DenySummary(FrozenModel):
    """The deny list in place after a push: its serial, sha256, entry count and who vouched for it; ``unchanged``
    when the very same list and signatures were in place already."""

    serial: int
    sha256: str
    entries: int
    signed_by: str
    unchanged: bool = False


class BundlesResponse(FrozenModel):
    count: int
    bundles: List[BundleSummary]


class BundleDetail(FrozenModel):
    summary: BundleSummary
    policy_files: List[str]
    bundle: str
    signature: str


class SignedDocument(FrozenModel):
    """A root (``root``), freshness statement (``statement``) or deny list (``deny``) and its detached signatures,
    each base64."""

    root: Optional[str] = None
    statement: Optional[str] = None
    deny: Optional[str] = None
    signature: str


class BundleOffer(FrozenModel):
    serial: int
    bundle: str
    signature: str
    # While a staged rollout is active (agent/hub/rollouts.py), the same as the X-Gpuguard-Rollout* headers (sent on
    # 200, 204 and 304; agent/wire.py): the notice, display text only (why this host is held back, or that it is
    # admitted), and the typed fields the agent decides on: the rollout, its state, the stage that admitted this
    # host (None: held back).
    rollout: Optional[str] = None
    rollout_id: Optional[str] = None
    state: Optional[str] = None
    admitted_stage: Optional[int] = None


class AuditResponse(FrozenModel):
    count: int
    entries: List[AuditEntry]
