"""Facts that cannot change while the files they come from stay the same, kept on disk keyed on those files' identity.

A tool's ``--version`` cannot change while its binary is the same file, nor an ``rpm -qa`` listing while the rpm
database's files are: each is cached under the state directory (``/var/lib/gpuguard/cache/<name>.json``, under the
Host's root) with the identity of every file it depends on, (path, st_dev, st_ino, st_size, st_mtime_ns), and asked
again only when one of them changes. An upgrade replaces or rewrites the file, which changes the identity.

The cache is only ever a shortcut: a missing, unreadable or damaged file reads as empty (and is rewritten); where it
cannot be written (a user without write access, a root with no state directory: a fixture tree) the fact is simply
fetched each time. Nothing here raises.
"""

from __future__ import annotations

import json
import os
from typing import Any, Dict, List, Optional, Sequence

from agent.defaults import DEFAULT_STATE_DIR
from agent.errors import InputFileError
from agent.files import read_bytes_bounded, write_atomically
from agent.host import Host
from agent.log import get_logger
from agent.statepaths import StatePaths

log = get_logger("collectors.factcache")

# The identity of one file: [real path, device, inode, size, mtime in ns]; JSON keeps it as a list.
Identity = List[Any]
MISSING = object()
_MAX_CACHE_BYTES = 16 << 20


def file_identity(path: str) -> Optional[Identity]:
    """[real path, st_dev, st_ino, st_size, st_mtime_ns] of the file ``path`` resolves to; None if it cannot be read."""
    try:
        real = os.path.realpath(path)
        st = os.stat(real)
    except (OSError, ValueError):
        return None
    return [real, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns]


def files_identity(paths: Sequence[str]) -> Optional[List[Identity]]:
    """The identity of every file, in order; None when any one cannot be read (nothing to key a fact on)."""
    found = [file_identity(p) for p in paths]
    return None if any(i is None for i in found) else found  # type: ignore[return-value]


class FactCache:
    """One cache file of facts, each stored with the identity it was fetched for.

    ``get`` answers only for the identity the fact was stored with; ``save`` writes the facts this run used (a fact
    of a tool no longer installed is dropped), and only when one changed.
    """

    def __init__(self, host: Host, name: str) -> None:
        self._state_dir = host.file(DEFAULT_STATE_DIR)
        self.path = host.file(StatePaths().fact_cache(name))
        self._stored = self._load()
        self._used: Dict[str, Any] = {}

    def _load(self) -> Dict[str, Any]:
        try:
            data = json.loads(read_bytes_bounded(self.path, _MAX_CACHE_BYTES))
        except (InputFileError, ValueError, RecursionError):  # missing, unreadable, not JSON: start afresh
            return {}
        return data if isinstance(data, dict) else {}

    def get(self, key: str, identity: Any) -> Any:
        """The fact stored under ``key`` for exactly this identity, or MISSING."""
        entry = self._stored.get(key)
        if identity is None or not isinstance(entry, dict) or entry.get("identity") != identity or "value" not in entry:
            return MISSING
        self._used[key] = entry
        return entry["value"]

    def put(self, key: str, identity: Any, value: Any) -> None:
        """Remember ``value`` for ``identity`` (nothing is remembered without an identity)."""
        if identity is not None:
            self._used[key] = {"identity": identity, "value": value}

    def save(self) -> None:
        """Write the facts used this run when they differ from the file's; silently nothing where it cannot."""
        if self._used == self._stored or not os.path.isdir(self._state_dir):
            return  # no state directory (a fixture root, an uninstalled agent): nothing is created outside one
        try:
            write_atomically(self.path, json.dumps(self._used, sort_keys=True) + "\n")
        except OSError as exc:  # read-only, another user's directory, disk full: the facts are fetched next time
            log.debug("fact_cache_not_written", path=self.path, error=exc.strerror or str(exc))
            return
        self._stored = dict(self._used)
