"""Waiting for a package manager's lock: dpkg, apt and rpm all use POSIX record locks (fcntl), dnf4 a pid file.

Shared by the apt and dnf tools so that neither imports the other.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
import time
from typing import Callable, Sequence, Tuple

from agent.errors import CommandError, CommandTimeout
from agent.host import Host

LockCheck = Callable[[str], bool]


def record_lock_is_free(path: str) -> bool:
    """Try the package manager's own kind of lock (an fcntl record lock) and give it back at once."""
    try:  # O_NONBLOCK and a regular file only: a FIFO or a device put there is refused at once, never waited on
        fd = os.open(path, os.O_RDWR | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as exc:
        raise CommandError(["open", path], exc.strerror or str(exc)) from exc
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise CommandError(["open", path], "not a regular file")
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in (errno.EACCES, errno.EAGAIN):
            return False
        raise CommandError(["lock", path], exc.strerror or str(exc)) from exc
    else:
        fcntl.lockf(fd, fcntl.LOCK_UN)
        return True
    finally:
        os.close(fd)


def wait_for_locks(host: Host, locks: Sequence[Tuple[str, LockCheck]], timeout_seconds: float,
                   sleep: Callable[[float], None] = time.sleep) -> float:
    """Wait until every existing lock file (host path, how to test it) is free; the seconds waited.

    Raises CommandTimeout once ``timeout_seconds`` have passed with a lock still held.
    """
    started = time.monotonic()
    for lock_path, is_free in locks:
        path = host.path(lock_path)
        if not path.is_file():
            continue
        while not is_free(str(path)):
            if time.monotonic() - started > timeout_seconds:
                raise CommandTimeout(["wait-for-lock", lock_path], timeout_seconds)
            sleep(0.5)
    return time.monotonic() - started
