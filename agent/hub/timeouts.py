"""Slow clients are cut off: a request's headers and its body each have a deadline.

uvicorn closes idle keep-alive connections but waits forever for a request whose headers or body trickle in (one
byte a second, or a Content-Length larger than what is sent), so one client could hold a connection, and the
memory of its half-read request, indefinitely. Two pieces, wired by ``server.serve``:

- ``with_header_timeout(protocol_class, seconds)``: a subclass of uvicorn's HTTP protocol that closes a connection
  whose request headers are not complete ``seconds`` after it opened or after its previous response;
- ``BodyTimeout``: the outermost ASGI wrapper; a body not fully received within ``seconds`` of the request's start
  ends as a disconnect for the app, and the client gets 408 ``request_timeout`` with ``Connection: close`` (unless
  the app answered already).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, Callable, Dict, Optional

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


class _Timeout(Exception):
    pass


class BodyTimeout:
    """ASGI wrapper: an HTTP request body must be complete ``body_timeout_seconds`` after the request started."""

    def __init__(self, app: Any, body_timeout_seconds: float) -> None:
        self.app = app
        self.body_timeout_seconds = body_timeout_seconds

    async def __call__(self, scope: Dict[str, Any], receive: Callable[..., Any], send: Callable[..., Any]) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.body_timeout_seconds
        timed_out = False
        body_done = False
        response_started = False

        async def timed_receive() -> Dict[str, Any]:
            nonlocal timed_out, body_done
            if timed_out:
                return {"type": "http.disconnect"}
            if body_done:
                return await receive()  # after the body only a disconnect comes: no deadline on waiting for it
            try:
                message = await asyncio.wait_for(receive(), max(0.0, deadline - loop.time()))
            except asyncio.TimeoutError:
                timed_out = True
                return {"type": "http.disconnect"}
            if message["type"] == "http.request" and not message.get("more_body", False):
                body_done = True
            return message

        async def tracking_send(message: Dict[str, Any]) -> None:
            nonlocal response_started
            if message["type"] == "http.response.start":
                response_started = True
            await send(message)

        await self.app(scope, timed_receive, tracking_send)
        if timed_out and not response_started:
            client = scope.get("client")
            log.info("hub_connection_timed_out", phase="body", timeout_seconds=self.body_timeout_seconds,
                     path=scope.get("path"), client=f"{client[0]}:{client[1]}" if client else None)
            body = json.dumps({"error": "request_timeout", "detail": (
                f"the request body was not complete within {self.body_timeout_seconds:g} s"), "problems": []}).encode()
            await send({"type": "http.response.start", "status": 408, "headers": [
                (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                (b"connection", b"close")]})
            await send({"type": "http.response.body", "body": body})
