"""The hub's staged-rollout notice as the agent keeps it: one bounded, printable line, and what it says of this host.

The hub answers ``GET /v1/policy/bundle`` during a rollout with a notice (header ``X-Gpuguard-Rollout``, and the
JSON field ``rollout`` on 200; docs/hub.md, "Staged rollouts"), for example::

    rollout r43-1a2b3c: waiting for stage 2 (3/3 stage 1 hosts passed, soak ends 14:20 UTC)
    rollout r43-1a2b3c: admitted at stage 0

:func:`clean_notice` makes what the hub sent safe to keep and show (agent/printable.py, at most
:data:`MAX_NOTICE_CHARS`); :func:`admission` reads the rollout id and stage of an admitted host. Both pure, standard
library only.
"""

from __future__ import annotations

import re
from typing import Optional, Tuple

from agent.printable import printable

MAX_NOTICE_CHARS = 300  # the hub cuts its notice there too (agent/hub/rollouts.py)
_ADMITTED = re.compile(r"rollout ([A-Za-z0-9._-]{1,64}): admitted at stage (\d{1,4})")
_HANDOFF = re.compile(r"rollout ([A-Za-z0-9._-]{1,64}) stage \d{1,4}")


def clean_notice(text: Optional[str]) -> Optional[str]:
    """The notice made one printable line of at most MAX_NOTICE_CHARS; None for none (or only blanks)."""
    if text is None:
        return None
    line = printable(text.strip())
    if not line:
        return None
    return line if len(line) <= MAX_NOTICE_CHARS else line[:MAX_NOTICE_CHARS - 3] + "..."


def admission(notice: Optional[str]) -> Optional[Tuple[str, int]]:
    """The rollout id and stage when the notice says this host was admitted; None otherwise."""
    found = _ADMITTED.fullmatch(notice or "")
    return (found.group(1), int(found.group(2))) if found else None


def handoff_reason(notice: Optional[str], serial: Optional[int]) -> str:
    """Why the host hands its node to the scheduler for an installed bundle: ``rollout R stage N`` when the
    notice says this host was admitted, else ``policy bundle serial N``."""
    admitted = admission(notice)
    if admitted is not None:
        return f"rollout {admitted[0]} stage {admitted[1]}"
    return f"policy bundle serial {serial}"


def rollout_of_reason(reason: str) -> Optional[str]:
    """The rollout id of a hand-off reason that :func:`handoff_reason` made for a rollout; None for any other."""
    found = _HANDOFF.fullmatch(reason)
    return found.group(1) if found else None
