"""Slow request headers are cut off: a connection whose headers are not complete in time is closed.

uvicorn closes idle keep-alive connections but waits forever for a request whose headers or body trickle in (one
byte a second, or a Content-Length larger than what is sent), so one client could hold a connection, and the
memory of its half-read request, indefinitely. ``with_header_timeout(protocol_class, seconds)`` (wired by
``server.serve``) is a subclass of uvicorn's HTTP protocol that closes a connection whose request headers are not
complete ``seconds`` after it opened or after its previous response; no answer is sent, there is no request yet.
The body's deadline is ASGI middleware (``middleware.BodyTimeout``).
"""

from __future__ import annotations

import asyncio
from typing import Any, Optional

from agent.log import get_logger

log = get_logger("hub.timeouts")


def with_header_timeout(base: type, header_timeout_seconds: float) -> type:
    """``base`` (uvicorn's httptools or h11 protocol) closing connections that send headers too slowly."""

    class HeaderTimeoutProtocol(base):
        _header_deadline: Optional[asyncio.TimerHandle] = None

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self._arm_header_deadline()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._arm_header_deadline()

        def connection_lost(self, exc: Optional[Exception]) -> None:
            if self._header_deadline is not None:
                self._header_deadline.cancel()
                self._header_deadline = None
            super().connection_lost(exc)

        def _arm_header_deadline(self) -> None:
            if self._header_deadline is not None:
                self._header_deadline.cancel()
            self._header_deadline = self.loop.call_later(header_timeout_seconds, self._header_deadline_passed)

        def _header_deadline_passed(self) -> None:
            self._header_deadline = None
            cycle = getattr(self, "cycle", None)
            waiting_for_headers = cycle is None or cycle.response_complete
            transport = getattr(self, "transport", None)
            if waiting_for_headers and transport is not None and not transport.is_closing():
                peer = transport.get_extra_info("peername")
                log.info("hub_connection_timed_out", phase="headers", timeout_seconds=header_timeout_seconds,
                         client=f"{peer[0]}:{peer[1]}" if peer else None)
                transport.close()

    HeaderTimeoutProtocol.__name__ = f"HeaderTimeout{base.__name__}"
    return HeaderTimeoutProtocol
