"""Atomic file writes shared by every room (stdlib only: the apt hook's import path uses it)."""

from __future__ import annotations

import os

from agent.errors import InputFileError

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs milliseconds of the apt hook's start-up budget
    from typing import Any, Optional


def write_atomically(path: str, text: str, mode: int = 0o644) -> None:
    """Write text so that readers see the old or the new file, never half of one (fsync + rename)."""
    import tempfile  # not at module level: the apt hook imports this module and never writes atomically

    directory = os.path.dirname(str(path)) or "."
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(str(path)) + ".", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def read_json_file(path: str, missing_reason: "Optional[str]" = None) -> "Any":
    """Parse a JSON file; InputFileError names the file for unreadable or invalid JSON.

    A missing file gives None, or InputFileError(missing_reason) when a reason is given (the file is required).
    """
    import json  # not at module level: most importers only write

    try:
        with open(path, "r", encoding="utf-8") as handle:
            text = handle.read()
    except FileNotFoundError:
        if missing_reason is None:
            return None
        raise InputFileError(path, missing_reason) from None
    except OSError as exc:
        raise InputFileError(path, exc.strerror or str(exc)) from None
    try:
        return json.loads(text)
    except ValueError as exc:
        raise InputFileError(path, f"not valid JSON ({exc})") from None
