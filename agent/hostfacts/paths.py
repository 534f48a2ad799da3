"""Host paths under a root (``/`` on a live host, a chroot or fixture tree in tests)."""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs milliseconds of the apt hook's start-up budget
    from typing import Optional


def under(root: str, path: str) -> str:
    """``path`` (absolute, on the host) inside ``root``."""
    return path if root in ("", "/") else root.rstrip("/") + "/" + path.lstrip("/")


def read_small_text(root: str, path: str, limit_bytes: int = 1 << 20) -> Optional[str]:
    """The first ``limit_bytes`` of a host file, decoded leniently; None when it cannot be read."""
    try:
        with open(under(root, path), "rb") as handle:
            return handle.read(limit_bytes).decode("utf-8", errors="replace")
    except OSError:
        return None
