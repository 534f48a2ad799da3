"""The hub's staged-rollout notice, for the line a refusal adds: "rollout R: waiting for stage 2 (...)".

The policy fetch keeps the newest notice in ``policy-bundle/state.json`` (agent/bundle/state.py, field
``rollout``); a refusing hook reads only that field, and only when it refuses. The notice is advice: a state file
that is missing, damaged or too large gives no line and never changes the decision. Standard library only.
"""

from __future__ import annotations

from agent.bundle.rollout import clean_notice
from agent.hostfacts.paths import read_regular_file
from agent.wire import MAX_STATE_FILE_BYTES

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs milliseconds of the apt hook's start-up budget
    from typing import Optional



def rollout_notice(state_path: str) -> Optional[str]:
    """The notice kept in the bundle state at ``state_path``, one printable bounded line; None when there is none
    or the file cannot be read."""
    import json

    try:
        value = json.loads(read_regular_file(state_path, MAX_STATE_FILE_BYTES).decode("utf-8"))
    except (OSError, ValueError, RecursionError):  # missing, unreadable, too large, not UTF-8, not JSON
        return None
    notice = value.get("rollout") if isinstance(value, dict) else None
    return clean_notice(notice) if isinstance(notice, str) else None
