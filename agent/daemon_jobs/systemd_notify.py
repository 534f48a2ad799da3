"""sd_notify(3) for ``gpuguard run`` under systemd (``Type=notify``): READY=1, WATCHDOG=1, STATUS= and STOPPING=1.

The datagram goes to ``$NOTIFY_SOCKET`` (AF_UNIX; '@' means the abstract namespace); without it every call is a
no-op, so the same daemon runs outside systemd. ``$WATCHDOG_USEC`` counts only when ``$WATCHDOG_PID`` is unset or
this process: the daemon pings at half of it from a scheduler job, so a wedged scheduler stops the pings.

The datagram goes out through ``_socket``, the C module under ``socket``: socket.py's enums, wrappers and selectors
would be 0.3 MiB of the resident daemon for one sendto (issue #28).
"""

from __future__ import annotations

import _socket
import os
from typing import Mapping, Optional

from agent.log import get_logger

log = get_logger("daemon")


class SystemdNotifier:
    """sd_notify(3) over $NOTIFY_SOCKET (AF_UNIX datagram; '@' means the abstract namespace); no-op without it."""

    def __init__(self, env: Mapping[str, str] = os.environ) -> None:
        address = env.get("NOTIFY_SOCKET") or ""
        self._address: Optional[str] = None
        if address.startswith("@"):
            self._address = "\0" + address[1:]
        elif address.startswith("/"):
            self._address = address
        self.watchdog_seconds: Optional[float] = None
        usec, pid = env.get("WATCHDOG_USEC"), env.get("WATCHDOG_PID")
        if usec and usec.isdigit() and int(usec) > 0 and (not pid or pid == str(os.getpid())):
            self.watchdog_seconds = int(usec) / 1_000_000

    def notify(self, *lines: str) -> None:
        if self._address is None:
            return
        try:
            # Non-blocking: a full receive queue on the other side must never stall shutdown or the scheduler.
            sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_DGRAM | _socket.SOCK_CLOEXEC | _socket.SOCK_NONBLOCK)
            try:
                sock.sendto("\n".join(lines).encode("utf-8"), self._address)
            finally:
                sock.close()
        except OSError as exc:
            log.debug("sd_notify_failed", error=str(exc))
