"""Reading snapshots back: strict validation by pydantic, one-line errors that name the file.

Only here (and in code that reads a snapshot from another process) is pydantic loaded for a snapshot: it validates
the same frozen records ``gpuguard snapshot`` builds without it (agent/frozen.py: made standard-library dataclasses
for pydantic first), with their ``__pydantic_config__`` rules.
"""

from __future__ import annotations

from functools import lru_cache
from typing import TYPE_CHECKING, Any

from agent.errors import InputFileError
from agent.files import read_json_file
from agent.frozen import as_dataclasses
from agent.models import first_validation_problem
from agent.snapshot.model import Snapshot

if TYPE_CHECKING:  # pragma: no cover
    from pydantic import TypeAdapter


@lru_cache(maxsize=1)
def _adapter() -> "TypeAdapter[Snapshot]":
    from pydantic import TypeAdapter

    as_dataclasses()
    return TypeAdapter(Snapshot)


def validate_snapshot(data: Any) -> Snapshot:
    """A snapshot from JSON-decoded data; pydantic's ValidationError when it is not a valid one."""
    return _adapter().validate_python(data)


def parse_snapshot_json(text: "str | bytes") -> Snapshot:
    """A snapshot from JSON text (another process's output); pydantic's ValidationError when it is not a valid one."""
    return _adapter().validate_json(text)


def load_snapshot(path: str) -> Snapshot:
    """Read a snapshot JSON file; InputFileError names the file and the first problem."""
    from pydantic import ValidationError

    data = read_json_file(path, missing_reason="no such file")
    try:
        return validate_snapshot(data)
    except ValidationError as exc:
        raise InputFileError(path, f"not a gpuguard snapshot: {first_validation_problem(exc)}") from None
