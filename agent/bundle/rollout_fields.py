"""The offer's staged-rollout fields as the agent believes them: which rollout, its state, this host's admission.

The hub sends them with every answer to ``GET /v1/policy/bundle`` during a rollout (agent/wire.py: the JSON fields
``rollout_id``, ``state``, ``admitted_stage`` on 200, the ``X-Gpuguard-Rollout-*`` headers on 200, 204 and 304).
They are what the agent decides on (a rollout's hand-off begins only for ``admitted_stage`` set); the notice beside
them is display text. An answer is a trust boundary: :func:`read_rollout_fields` checks each field strictly (the
id's characters and length, the state one of the offered states, the stage in range) and raises ValueError for a
malformed one, which the fetch turns into a refusal (body) or ignores (headers): never believed. Standard library
only (a JsonRecord), kept in ``policy-bundle/state.json`` and in the fetch child's result.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Optional

from agent.jsonrecord import JsonRecord
from agent.wire import (
    MAX_ROLLOUT_ID_CHARS,
    MAX_STAGE,
    OFFER_ROLLOUT_STATES,
    ROLLOUT_ID_HEADER,
    ROLLOUT_STAGE_HEADER,
    ROLLOUT_STATE_HEADER,
    rollout_id_ok,
    rollout_state_ok,
    stage_ok,
)


@dataclass(frozen=True)
class RolloutFields(JsonRecord):
    """The active rollout that concerns this host: its id, state, and the stage that admitted this host (None:
    held back, the target not offered to it)."""

    rollout_id: str
    state: str
    admitted_stage: Optional[int] = None

    def __post_init__(self) -> None:
        if not rollout_id_ok(self.rollout_id):
            raise ValueError(f"rollout_id: not 1 to {MAX_ROLLOUT_ID_CHARS} of A-Za-z0-9._-")
        if not rollout_state_ok(self.state):
            raise ValueError(f"state: not one of {', '.join(OFFER_ROLLOUT_STATES)}")
        if self.admitted_stage is not None and not stage_ok(self.admitted_stage):
            raise ValueError(f"admitted_stage: not a whole number in 0..{MAX_STAGE}")

    @property
    def admitted(self) -> bool:
        return self.admitted_stage is not None


def read_rollout_fields(rollout_id: object, state: object, admitted_stage: object) -> Optional[RolloutFields]:
    """The fields as sent (None for each one absent): None when no rollout concerns this host (no id and no
    state), the record when all are well formed; ValueError with one line otherwise."""
    if rollout_id is None and state is None and admitted_stage is None:
        return None
    if rollout_id is None or state is None:
        raise ValueError("rollout_id and state: both or neither")
    return RolloutFields(rollout_id, state, admitted_stage)  # type: ignore[arg-type]  # checked in __post_init__


def rollout_fields_of_headers(headers: Mapping[str, str]) -> Optional[RolloutFields]:
    """The fields of the ``X-Gpuguard-Rollout-*`` headers (looked up as the mapping does: requests' headers ignore
    case); None when there are none or one is malformed (ignored: a held-back host is what the agent assumes)."""
    get = headers.get
    stage_text = get(ROLLOUT_STAGE_HEADER)
    stage: object = None
    if stage_text is not None:
        text = str(stage_text).strip()
        if not (text.isascii() and text.isdigit() and len(text) <= 3):
            return None
        stage = int(text)
    try:
        return read_rollout_fields(get(ROLLOUT_ID_HEADER), get(ROLLOUT_STATE_HEADER), stage)
    except ValueError:
        return None


def handoff_reason(rollout: Optional[RolloutFields], serial: Optional[int]) -> str:
    """Why the host hands its node to the scheduler for an installed bundle, for people: ``rollout R stage N``
    when the offer's fields say a rollout admitted this host, else ``policy bundle serial N``."""
    if rollout is not None and rollout.admitted_stage is not None:
        return f"rollout {rollout.rollout_id} stage {rollout.admitted_stage}"
    return f"policy bundle serial {serial}"
