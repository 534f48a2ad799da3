"""Reading and writing snapshot files: atomic writes, one-line errors that name the file."""

from __future__ import annotations

from pydantic import ValidationError

from agent.errors import InputFileError
from agent.files import read_json_file
from agent.models import first_validation_problem
from agent.snapshot.model import Snapshot


def load_snapshot(path: str) -> Snapshot:
    """Read a snapshot JSON file; InputFileError names the file and the first problem."""
    data = read_json_file(path, missing_reason="no such file")
    try:
        return Snapshot.model_validate(data)
    except ValidationError as exc:
        raise InputFileError(path, f"not a gpuguard snapshot: {first_validation_problem(exc)}") from None


