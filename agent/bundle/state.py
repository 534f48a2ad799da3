"""What the agent remembers of policy bundles: the serial in force, its key and source, the last refusal, the
hub's staged-rollout fields (typed: what decides) and notice (display text).

``policy-bundle/state.json`` in the state directory, written atomically by ``gpuguard policy install`` and the
daemon's bundle fetch, read by ``gpuguard status``, ``policy explain`` and the heartbeat. Standard library only
(a JsonRecord), so the resident daemon reads it without pydantic.
"""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass, replace
from typing import Literal, Optional, Tuple

from agent.bundle.rollout_fields import RolloutFields
from agent.errors import InputFileError
from agent.files import FileMissing, read_bytes_bounded
from agent.jsonrecord import JsonRecord, RecordError
from agent.strictjson import parse_json_text
from agent.wire import MAX_STATE_FILE_BYTES, REFUSAL_KINDS

RefusalKind = Literal[REFUSAL_KINDS]  # type: ignore[valid-type]  # built from the tuple at run time


@dataclass(frozen=True)
class BundleRefusal(JsonRecord):
    """The last bundle refused: its serial (None when no verified bundle said it), why (``kind``, one of
    agent/wire.py's REFUSAL_KINDS, what decides; None in a state file written before kinds; ``reason``, the
    sentence), and when."""

    serial: Optional[int]
    reason: str
    at: dt.datetime
    kind: Optional[RefusalKind] = None


@dataclass(frozen=True)
class HubBelow(JsonRecord):
    """The hub offers only serials below the one in force (``offered_serial``; None: it offers none), since
    ``since``: a withdrawn bundle still in force, or a fast-forward (a serial so high every honest one looks old)."""

    offered_serial: Optional[int]
    since: dt.datetime


@dataclass(frozen=True)
class BundleState(JsonRecord):
    """The bundle in force (serial None: none yet), the last refusal, and what the hub's newest answer said of a
    staged rollout: its typed fields (``rollout_fields``, agent/bundle/rollout_fields.py; None: no rollout concerns
    this host, also in a state file written before the field existed) and its notice (``rollout``, display text
    only), with when the notice first arrived; and ``hub_below``, while the hub offers only serials below the one
    in force (attention in ``status``)."""

    serial: Optional[int] = None
    fingerprint: Optional[str] = None
    source: Optional[Literal["hub", "file"]] = None
    installed_at: Optional[dt.datetime] = None
    sha256: Optional[str] = None
    refused: Optional[BundleRefusal] = None
    rollout: Optional[str] = None
    rollout_at: Optional[dt.datetime] = None
    rollout_fields: Optional[RolloutFields] = None
    # Under a root (agent/bundle/roles.py): the policy role that vouched for the bundle in force, the keys of it that
    # signed (a rotation that drops one of them resets the serial floor they set), and when the bundle expires.
    role: Optional[str] = None
    signers: Tuple[str, ...] = ()
    expires: Optional[dt.datetime] = None
    # The last freshness statement taken (agent/bundle/freshness.py): when it was issued and expires, the newest
    # serial it names for this host, the serials it withdraws, and the serial of the deny list the hub serves.
    freshness_issued_at: Optional[dt.datetime] = None
    freshness_expires: Optional[dt.datetime] = None
    freshness_newest: Optional[int] = None
    withdrawn: Tuple[int, ...] = ()
    freshness_deny_serial: Optional[int] = None

    hub_below: Optional[HubBelow] = None
    # The deny list in force (agent/bundle/deny.py): its serial, the last one refused (with its kind), and the
    # packages installed here at a version it denies (``name version: entry``), as the last fetch found them.
    deny_serial: Optional[int] = None
    deny_refused: Optional[BundleRefusal] = None
    denied_installed: Tuple[str, ...] = ()

    def with_hub_offer(self, offered: Optional[int], at: dt.datetime) -> "BundleState":
        """The state after the hub offered ``offered`` (None: nothing in scope): ``hub_below`` set, keeping its
        first time, when that is below the serial in force; cleared otherwise."""
        if self.serial is None or (offered is not None and offered >= self.serial):
            return replace(self, hub_below=None)
        if self.hub_below is not None and self.hub_below.offered_serial == offered:
            return self
        return replace(self, hub_below=HubBelow(offered, at))

    def with_refusal(self, serial: Optional[int], kind: str, reason: str, at: dt.datetime) -> "BundleState":
        return replace(self, refused=BundleRefusal(serial, reason, at, kind))

    def expired(self, now: dt.datetime) -> bool:
        """The bundle in force is past its ``expires``: still enforced (never un-guarded), and attention."""
        return self.expires is not None and now >= self.expires

    def stale(self, now: dt.datetime) -> Optional[str]:
        """Why the freshness statement asks for attention (None: it does not): expired, a newer serial named for
        this host than the one in force (a freeze), the serial in force withdrawn, or a deny list serial above the
        one in force here (a newer known-bad list held back or refused)."""
        if self.freshness_expires is None:
            return None
        if now >= self.freshness_expires:
            return f"the hub's freshness statement expired at {self.freshness_expires:%Y-%m-%dT%H:%M:%SZ}"
        if self.freshness_newest is not None and (self.serial is None or self.freshness_newest > self.serial):
            return f"the hub's freshness statement names serial {self.freshness_newest}, not taken here"
        if self.serial is not None and self.serial in self.withdrawn:
            return f"serial {self.serial} in force is withdrawn"
        if self.freshness_deny_serial is not None and (self.deny_serial is None
                                                       or self.freshness_deny_serial > self.deny_serial):
            here = "none" if self.deny_serial is None else f"serial {self.deny_serial}"
            return (f"the hub's freshness statement names deny list serial {self.freshness_deny_serial}, in force "
                    f"here: {here}")
        return None

    def attention(self, now: dt.datetime) -> Tuple[str, ...]:
        """The heartbeat's ``policy_attention`` words (agent/wire.py POLICY_ATTENTION)."""
        return tuple(word for word, on in (("expired", self.expired(now)), ("freshness", self.stale(now) is not None),
                                           ("denied", bool(self.denied_installed))) if on)

    def with_rollout(self, notice: Optional[str], at: dt.datetime,
                     fields: Optional[RolloutFields] = None) -> "BundleState":
        rollout_at = None if notice is None else (self.rollout_at if notice == self.rollout and self.rollout_at
                                                  else at)
        return replace(self, rollout=notice, rollout_at=rollout_at, rollout_fields=fields)

    @property
    def refusal_pending(self) -> bool:
        """A refusal newer than what is in force: attention (a later install clears it, agent/bundle/install.py)."""
        if self.refused is None:
            return False
        return self.serial is None or self.refused.serial is None or self.refused.serial > self.serial


def read_bundle_state(path: str) -> BundleState:
    """The state file's record; an empty one when there is none; InputFileError when it is damaged."""
    try:
        data = read_bytes_bounded(path, MAX_STATE_FILE_BYTES)
    except FileMissing:
        return BundleState()
    try:
        return BundleState.from_json(parse_json_text(path, data.decode("utf-8", errors="replace")))
    except RecordError as exc:
        raise InputFileError(path, f"not a policy bundle state: {exc}") from None


def write_bundle_state(path: str, state: BundleState) -> None:
    """Write the state file atomically."""
    from agent.files import write_atomically

    write_atomically(path, json.dumps(state.to_json(), indent=2, sort_keys=True) + "\n")
