"""Atomic file writes shared by every room (stdlib only: the apt hook's import path uses it)."""

from __future__ import annotations

import os


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
