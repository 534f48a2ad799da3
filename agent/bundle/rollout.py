"""The hub's staged-rollout notice as the agent keeps it: one bounded, printable line, display text only.

The hub answers ``GET /v1/policy/bundle`` during a rollout with a notice (header ``X-Gpuguard-Rollout``, and the
JSON field ``rollout`` on 200; docs/hub.md, "Staged rollouts"), for example::

    rollout r43-1a2b3c: waiting for stage 2 (3/3 stage 1 hosts passed, soak ends 14:20 UTC)

:func:`clean_notice` makes it safe to keep and show (agent/printable.py, at most ``MAX_NOTICE_CHARS``). Nothing
decides on the notice: whether this host was admitted, and at which stage, comes in the offer's typed fields
(agent/bundle/rollout_fields.py). :func:`handoff_reason` words those fields for a person. Both pure; standard
library only and light (the apt hook shows the notice when it refuses).
"""

from __future__ import annotations

from agent.printable import printable
from agent.wire import MAX_NOTICE_CHARS

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs milliseconds of the apt hook's start-up budget
    from typing import Optional

    from agent.bundle.rollout_fields import RolloutFields


def clean_notice(text: Optional[str]) -> Optional[str]:
    """The notice made one printable line of at most MAX_NOTICE_CHARS; None for none (or only blanks)."""
    if text is None:
        return None
    line = printable(text.strip())
    if not line:
        return None
    return line if len(line) <= MAX_NOTICE_CHARS else line[:MAX_NOTICE_CHARS - 3] + "..."


def handoff_reason(rollout: Optional[RolloutFields], serial: Optional[int]) -> str:
    """Why the host hands its node to the scheduler for an installed bundle, for people: ``rollout R stage N``
    when the offer's fields say a rollout admitted this host, else ``policy bundle serial N``."""
    if rollout is not None and rollout.admitted_stage is not None:
        return f"rollout {rollout.rollout_id} stage {rollout.admitted_stage}"
    return f"policy bundle serial {serial}"
