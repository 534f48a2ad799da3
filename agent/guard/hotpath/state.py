"""Appending JSON lines to the guard's state files (named in agent/statepaths.py).

Standard library only (the apt hook appends guard events and audit lines with these).
"""

from __future__ import annotations

import errno

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs milliseconds of the apt hook's start-up budget
    from typing import Any, Dict, Sequence


def append_json_line(path: str, record: Dict[str, Any]) -> None:
    """Append one JSON object as a line (O_APPEND: concurrent writers never interleave within a line)."""
    append_json_lines(path, [record])


def append_json_lines(path: str, records: Sequence[Dict[str, Any]]) -> None:
    """Append JSON objects, one per line, in one O_APPEND write (each line whole; one open for any number).

    StateWriteError (an OSError too) when the file cannot be written: a full disk, a FIFO or directory in its place.
    """
    import json  # only when something is recorded: an allowed transaction records nothing (nor imports these)
    import os
    import stat

    from agent.errors import StateWriteError

    encode = json.JSONEncoder(sort_keys=True, separators=(",", ":")).encode
    data = "".join(encode(r) + "\n" for r in records).encode("utf-8")
    try:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        # O_NONBLOCK: a FIFO put in place of the file must not hang apt (with no reader the open fails at once).
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK | os.O_NOCTTY, 0o640)
    except OSError as exc:
        raise StateWriteError.of(path, exc) from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file")
        view = memoryview(data)
        while view:  # a regular file takes it in one write; a short write still continues where it stopped
            view = view[os.write(fd, view):]
    except OSError as exc:  # a full disk: the lines before stay whole; a cut last line is quarantined by its reader
        raise StateWriteError.of(path, exc) from None
    finally:
        os.close(fd)
