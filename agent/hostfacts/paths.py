"""Host paths under a root (``/`` on a live host, a chroot or fixture tree in tests), and reads that never block.

File calls go to ``posix``, the built-in module that ``os`` re-exports on Linux: importing ``os`` itself (with
``posix.path`` and ``collections.abc``) would cost the apt hook, which reads its files through here, about a
millisecond and a half of its start-up budget. The calls are the same functions.
"""

from __future__ import annotations

import errno
import posix

# stat.S_ISREG without importing stat: the file-type bits, and a regular file's, are POSIX constants.
_S_IFMT = 0o170000
_S_IFREG = 0o100000

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs milliseconds of the apt hook's start-up budget
    from typing import Optional, Tuple


def under(root: str, path: str) -> str:
    """``path`` (absolute, on the host) inside ``root``."""
    return path if root in ("", "/") else root.rstrip("/") + "/" + path.lstrip("/")


def read_small_text(root: str, path: str, limit_bytes: int = 1 << 20) -> Optional[str]:
    """The first ``limit_bytes`` of a host file, decoded leniently; None when it cannot be read."""
    try:
        fd = posix.open(under(root, path), posix.O_RDONLY | posix.O_NONBLOCK | posix.O_NOCTTY)
    except OSError:
        return None
    try:  # never block on a FIFO or read a device: /sys and /proc files are regular files too
        if posix.fstat(fd).st_mode & _S_IFMT != _S_IFREG:
            return None
        chunks, total = [], 0
        while total < limit_bytes:  # procfs hands out a page per read
            chunk = posix.read(fd, limit_bytes - total)
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
        return b"".join(chunks).decode("utf-8", errors="replace")
    except OSError:
        return None
    finally:
        posix.close(fd)


def open_regular(path: str, nofollow: bool = False) -> Tuple[int, posix.stat_result]:
    """A read-only descriptor of the regular file at ``path``, opened so that it can never block, and its fstat.

    O_NONBLOCK (a FIFO put in place of a state file opens at once instead of waiting for a writer), O_NOCTTY, and
    O_NOFOLLOW with ``nofollow`` (ELOOP for a symbolic link); then fstat: OSError(EINVAL, "not a regular file") for
    a FIFO, socket, device or directory, the descriptor closed. FileNotFoundError when there is none. The one way
    gpuguard opens a state or config file to read it (agent/files.py builds its readers on it).
    """
    flags = posix.O_RDONLY | posix.O_NONBLOCK | posix.O_NOCTTY | getattr(posix, "O_CLOEXEC", 0)
    if nofollow:
        flags |= posix.O_NOFOLLOW
    fd = posix.open(path, flags)
    try:
        info = posix.fstat(fd)
        if info.st_mode & _S_IFMT != _S_IFREG:
            raise OSError(errno.EINVAL, "not a regular file")
    except BaseException:
        posix.close(fd)
        raise
    return fd, info


def read_regular_file(path: str, max_bytes: int, nofollow: bool = False) -> bytes:
    """The bytes of the regular file at ``path``, read without ever blocking or reading past ``max_bytes``.

    Opened by :func:`open_regular`, so that a FIFO, a device or a directory put in place of a file cannot hang the
    caller (apt, dnf) or make it read without end. OSError for anything that is not a regular file of at most
    ``max_bytes`` bytes (FileNotFoundError when it does not exist; ELOOP for a link with ``nofollow``).
    """
    fd, info = open_regular(path, nofollow)
    try:
        if info.st_size > max_bytes:
            raise OSError(errno.EFBIG, f"larger than {max_bytes} bytes")
        chunks = []
        total = 0
        while True:  # a file that grows while being read is still cut at max_bytes + 1
            chunk = posix.read(fd, min(1 << 20, max_bytes + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
            if total > max_bytes:
                raise OSError(errno.EFBIG, f"larger than {max_bytes} bytes")
        return b"".join(chunks)
    finally:
        posix.close(fd)
