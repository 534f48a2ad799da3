"""OS identity from /etc/os-release (fallback /usr/lib/os-release, as os-release(5) says)."""

from __future__ import annotations

from agent.hostfacts.keyvalue import parse_key_value_lines
from agent.hostfacts.paths import read_small_text

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs milliseconds of the apt hook's start-up budget
    from typing import Dict, Optional

OS_RELEASE_PATHS = ("/etc/os-release", "/usr/lib/os-release")


def read_os_release(root: str) -> Optional[Dict[str, str]]:
    """The os-release fields of the host under ``root``; None when neither file can be read."""
    for path in OS_RELEASE_PATHS:
        text = read_small_text(root, path)
        if text is not None:
            return parse_key_value_lines(text)
    return None
