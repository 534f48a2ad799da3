"""The one-shot authorization that lets the agent's own rollback through its own guard, and nothing else.

A rollback goes back to the recorded known-good set; the guard would refuse some of those transactions (a
``[frozen]`` package forced to another version must move back; a pairing rule sees the forced state as
"before"). Before it runs apt or dnf, :func:`agent.guard.rollback.core.check_and_rollback` writes
``StatePaths.rollback_authorization`` (root-owned, mode 0600, written atomically) naming the exact target
set (every guarded package key and its known-good version) and an expiry a few minutes ahead; it removes the file
when the rollback is over, whatever happened.

:func:`authorizing` is what the hot path asks: it honours the file only when it is a regular file (not a link)
owned by root with no group or other permission bits, has not expired, and the guarded part of the set the
transaction would leave equals the target set exactly (same keys, same versions). Anything else (a missing,
unreadable, malformed, foreign-owned, group-writable or expired file, or any other resulting set) is no
authorization at all, and the guard decides as it always does. Standard library only: on the hot path.
"""

from __future__ import annotations

import json
import os

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs milliseconds of the apt hook's start-up budget
    import datetime as dt
    from typing import Callable, Dict, Mapping, Optional, Sequence

FORMAT = 1


def render(target: Mapping[str, str], reason: str, created_at: dt.datetime, expires_at: dt.datetime,
           authorization_id: str) -> str:
    """The file's JSON text."""
    return json.dumps({"format": FORMAT, "id": authorization_id, "reason": reason,
                       "created_at": created_at.isoformat(), "expires_at": expires_at.isoformat(),
                       "target": dict(sorted(target.items()))}, indent=2, sort_keys=True) + "\n"


def load(path: str, now: dt.datetime, warn: Optional[Callable[[str], None]] = None) -> Optional[Dict[str, object]]:
    """The authorization at host path ``path`` when it may be honoured at ``now``, else None.

    Opened without blocking and without following a link (agent/hostfacts/paths.py's ``open_regular``): a FIFO in
    its place used to hold apt forever. Something there that is not a regular file is no authorization, and
    ``warn`` gets one line naming it (the guard then refuses as it always does: fail closed).
    """
    import datetime as dt

    from agent.hostfacts.paths import open_regular

    try:
        fd, info = open_regular(path, nofollow=True)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if warn is not None:
            warn(f"warning: {path}: {exc.strerror or exc}: the rollback authorization is ignored")
        return None
    try:
        if info.st_uid != 0 or info.st_mode & 0o077 or info.st_size > 1 << 20:
            return None
        raw = os.read(fd, info.st_size + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    try:
        data = json.loads(raw.decode("utf-8"))
        if data.get("format") != FORMAT or not isinstance(data.get("target"), dict):
            return None
        expires = dt.datetime.fromisoformat(str(data["expires_at"]))
        target = {str(k): str(v) for k, v in data["target"].items()}
    except (ValueError, KeyError, TypeError, AttributeError):
        return None
    if expires.tzinfo is None or now >= expires:
        return None
    data["target"] = target
    return data


def authorizing(path: str, now: dt.datetime, after: Mapping[str, str], guarded: Sequence[str],
                warn: Optional[Callable[[str], None]] = None) -> Optional[Dict[str, object]]:
    """The authorization when the guarded part of ``after`` (the resulting set) is exactly its target, else None
    (``warn``: as for :func:`load`)."""
    data = load(path, now, warn)
    if data is None:
        return None
    from agent.policy.compiled import guarded_names

    resulting = {key: after[key] for key in guarded_names(list(after), guarded)}
    return data if resulting == data["target"] else None
