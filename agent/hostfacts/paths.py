"""Host paths under a root (``/`` on a live host, a chroot or fixture tree in tests)."""

from __future__ import annotations

import errno
import os
import stat

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs milliseconds of the apt hook's start-up budget
    from typing import Optional


def under(root: str, path: str) -> str:
    """``path`` (absolute, on the host) inside ``root``."""
    return path if root in ("", "/") else root.rstrip("/") + "/" + path.lstrip("/")


def read_small_text(root: str, path: str, limit_bytes: int = 1 << 20) -> Optional[str]:
    """The first ``limit_bytes`` of a host file, decoded leniently; None when it cannot be read."""
    try:
        fd = os.open(under(root, path), os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
    except OSError:
        return None
    try:  # never block on a FIFO or read a device: /sys and /proc files are regular files too
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        chunks, total = [], 0
        while total < limit_bytes:  # procfs hands out a page per read
            chunk = os.read(fd, limit_bytes - total)
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
        return b"".join(chunks).decode("utf-8", errors="replace")
    except OSError:
        return None
    finally:
        os.close(fd)


def read_regular_file(path: str, max_bytes: int) -> bytes:
    """The bytes of the regular file at ``path``, read without ever blocking or reading past ``max_bytes``.

    Opened with O_NONBLOCK and checked with fstat, so that a FIFO, a device or a directory put in place of a file
    cannot hang the caller (apt, dnf) or make it read without end. OSError for anything that is not a regular
    file of at most ``max_bytes`` bytes (FileNotFoundError when it does not exist).
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0))
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise OSError(errno.EINVAL, "not a regular file")
        if info.st_size > max_bytes:
            raise OSError(errno.EFBIG, f"larger than {max_bytes} bytes")
        chunks = []
        total = 0
        while True:  # a file that grows while being read is still cut at max_bytes + 1
            chunk = os.read(fd, min(1 << 20, max_bytes + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
            if total > max_bytes:
                raise OSError(errno.EFBIG, f"larger than {max_bytes} bytes")
        return b"".join(chunks)
    finally:
        os.close(fd)
