"""Where the guard keeps its state under the state directory, and the small file helpers it needs.

Standard library only (the apt hook appends audit lines and reads override windows from here).
"""

from __future__ import annotations

import errno

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs milliseconds of the apt hook's start-up budget
    from typing import Any, Dict, Sequence


class GuardPaths:
    """Host paths (absolute, before any root prefix) of the guard's files under ``state_dir``."""

    __slots__ = ("state_dir",)

    def __init__(self, state_dir: str = "/var/lib/gpuguard") -> None:
        self.state_dir = state_dir

    def _join(self, name: str) -> str:
        return self.state_dir.rstrip("/") + "/" + name

    @property
    def compiled_policy(self) -> str:
        return self._join("policy.compiled.json")

    @property
    def overrides(self) -> str:
        return self._join("overrides.json")

    @property
    def audit_log(self) -> str:
        return self._join("audit.log")

    @property
    def events(self) -> str:
        """Guard events (blocked transactions, violations, rollbacks) waiting for the daemon's report outbox."""
        return self._join("guard-events.jsonl")

    @property
    def known_good(self) -> str:
        return self._join("known-good.json")

    @property
    def debs(self) -> str:
        return self._join("debs")

    @property
    def rpms(self) -> str:
        return self._join("rpms")

    @property
    def reboot_required(self) -> str:
        return self._join("reboot-required")


def append_json_line(path: str, record: Dict[str, Any]) -> None:
    """Append one JSON object as a line (O_APPEND: concurrent writers never interleave within a line)."""
    append_json_lines(path, [record])


def append_json_lines(path: str, records: Sequence[Dict[str, Any]]) -> None:
    """Append JSON objects, one per line, in one O_APPEND write (each line whole; one open for any number)."""
    import json  # only when something is recorded: an allowed transaction records nothing (nor imports these)
    import os
    import stat

    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    encode = json.JSONEncoder(sort_keys=True, separators=(",", ":")).encode
    data = "".join(encode(r) + "\n" for r in records).encode("utf-8")
    # O_NONBLOCK: a FIFO put in place of the file must not hang apt (with no reader the open fails at once).
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK | os.O_NOCTTY, 0o640)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file")
        view = memoryview(data)
        while view:  # a regular file takes it in one write; a short write still continues where it stopped
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)
