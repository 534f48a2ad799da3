"""Reading a front end's input from a file descriptor, bounded in bytes and in time.

apt writes the hook's input on a pipe and closes it, dnf's plugin and dnf5's actions plugin likewise; a writer
that never closes (or stops answering) must not hang the package manager, and one that never stops must not make
the hook read without end. Standard library only: ``select`` (a quarter of a millisecond) and ``time`` are the
only imports, and only when input is read.
"""

from __future__ import annotations

import posix  # os's own functions, without importing os (see agent/hostfacts/paths.py)

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs milliseconds of the apt hook's start-up budget
    from typing import List, Optional, Tuple

DEFAULT_TIMEOUT_SECONDS = 60.0  # apt and dnf write everything at once: seconds would do, a loaded host gets minutes


class Reader:
    """Reads ``fd`` until end of input, at most ``max_bytes`` (more is a problem) and until ``deadline`` (a
    ``time.monotonic()`` value: no end by then is a problem). ``problem`` says what went wrong, or is None."""

    def __init__(self, fd: int, max_bytes: int, timeout_seconds: float) -> None:
        import select
        import time

        self.fd = fd
        self.max_bytes = max_bytes
        self.timeout_seconds = timeout_seconds
        self.deadline = time.monotonic() + timeout_seconds
        self._clock = time.monotonic
        self._poller = select.poll()
        self._poller.register(fd, select.POLLIN | select.POLLPRI)
        self.total = 0
        self.problem: Optional[str] = None
        self._pending = b""

    def _chunk(self, size: int) -> bytes:
        """One read of at most ``size`` bytes once ``fd`` is readable; b"" at end of input, and also when it sets
        ``problem`` (no input by the deadline, a read error)."""
        while True:
            left = self.deadline - self._clock()
            if left <= 0:
                self.problem = (f"no end of input after {self.timeout_seconds:g} seconds (the writer never closed "
                                f"it): refused")
                return b""
            if self._poller.poll(max(1, int(left * 1000))):
                try:
                    return posix.read(self.fd, size)
                except BlockingIOError:  # a non-blocking descriptor that had nothing after all: wait again
                    continue
                except OSError as exc:
                    self.problem = f"cannot be read ({exc.strerror or exc})"
                    return b""

    def read_all(self) -> bytes:
        """Everything up to end of input, or up to the first problem (what was read by then, cut at max_bytes)."""
        chunks: List[bytes] = [self._pending]
        self._pending = b""
        while self.problem is None:
            chunk = self._chunk(min(1 << 20, self.max_bytes + 1 - self.total))
            if not chunk:
                break
            chunks.append(chunk)
            self.total += len(chunk)
            if self.total > self.max_bytes:
                self.problem = f"larger than {self.max_bytes} bytes: refused unread"
        return b"".join(chunks)[:self.max_bytes]

    def read_line(self) -> bytes:
        """The next line (with its newline; without one at end of input), within the same byte and time bounds."""
        chunks: List[bytes] = []
        data = self._pending
        while self.problem is None:
            newline = data.find(b"\n")
            if newline >= 0:
                chunks.append(data[:newline + 1])
                self._pending = data[newline + 1:]
                return b"".join(chunks)
            chunks.append(data)
            if self.total > self.max_bytes:
                self.problem = f"larger than {self.max_bytes} bytes: refused unread"
                break
            data = self._chunk(1 << 16)
            if not data:
                break
            self.total += len(data)
        self._pending = b""
        return b"".join(chunks)


def read_bounded(fd: int, max_bytes: int, timeout_seconds: float) -> Tuple[bytes, Optional[str]]:
    """All of ``fd``'s input (at most ``max_bytes``) and None, or what could be read and what went wrong."""
    reader = Reader(fd, max_bytes, timeout_seconds)
    data = reader.read_all()
    return data, reader.problem
