"""The hub's staged-rollout notice as the agent keeps it: one bounded, printable line, display text only.

The hub answers ``GET /v1/policy/bundle`` during a rollout with a notice (header ``X-Gpuguard-Rollout``, and the
JSON field ``rollout`` on 200; docs/hub.md, "Staged rollouts"), for example::

    rollout r43-1a2b3c: waiting for stage 2 (3/3 stage 1 hosts passed, soak ends 14:20 UTC)

:func:`clean_notice` makes it safe to keep and show (agent/printable.py, at most ``MAX_NOTICE_CHARS``). Nothing
decides on the notice: whether this host was admitted, and at which stage, comes in the offer's typed fields
(agent/bundle/rollout_fields.py, which also words them for a person). Pure; standard library only and light (the
apt hook shows the notice when it refuses).
"""

from __future__ import annotations

from agent.printable import printable
from agent.wire import MAX_NOTICE_CHARS

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs milliseconds of the apt hook's start-up budget
    from typing import Optional


def clean_notice(text: Optional[str]) -> Optional[str]:
    """The notice made one printable line of at most MAX_NOTICE_CHARS; None for none (or only blanks)."""
    if text is None:
        return None
    line = printable(text.strip())
    if not line:
        return None
    return line if len(line) <= MAX_NOTICE_CHARS else line[:MAX_NOTICE_CHARS - 3] + "..."

