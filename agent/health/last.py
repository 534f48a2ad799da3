"""How the health check's last result is read back (``StatePaths.health_last_result``).

Apart from runner.py: the daemon only reads the last status back at start, so it loads neither the runner nor, while
there is no result yet, the health models (issue #17).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Optional

from agent.errors import InputFileError
from agent.files import FileMissing, decode_text, read_bytes_bounded
from agent.statepaths import StatePaths

if TYPE_CHECKING:  # pragma: no cover
    from agent.health.model import HealthResult

def load_last_result(state_dir: str) -> Optional["HealthResult"]:
    """The last check's result from the state directory, or None when there is none yet."""
    path = Path(StatePaths(state_dir).health_last_result)
    try:
        text = decode_text(str(path), read_bytes_bounded(str(path)))  # never blocks on a FIFO in its place
    except FileMissing:
        return None
    except InputFileError as exc:
        raise InputFileError(str(path), f"unreadable health result: {exc.reason}") from None
    from agent.health.model import HealthResult  # the models only when there is a result to validate

    try:
        return HealthResult.model_validate(json.loads(text))
    except ValueError as exc:
        raise InputFileError(str(path), f"unreadable health result: {exc}") from None
