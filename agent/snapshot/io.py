"""Reading and writing snapshot files: atomic writes, one-line errors that name the file."""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import ValidationError

from agent.errors import InputFileError
from agent.models import first_validation_problem
from agent.snapshot.model import Snapshot


def load_snapshot(path: str) -> Snapshot:
    """Read a snapshot JSON file; InputFileError names the file and the first problem."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputFileError(path, "no such file") from None
    except OSError as exc:
        raise InputFileError(path, exc.strerror or str(exc)) from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputFileError(path, f"not valid JSON (line {exc.lineno}: {exc.msg})") from None
    try:
        return Snapshot.model_validate(data)
    except ValidationError as exc:
        raise InputFileError(path, f"not a gpuguard snapshot: {first_validation_problem(exc)}") from None


