"""The hub's ASGI middleware: what a request body may be, checked before anything parses it.

    BodySizeLimit  over ``max_body_bytes`` is 413 ``body_too_large``: a declared Content-Length at once, without
                   reading the body; a chunked body, or one whose Content-Length lies, as soon as it passes the limit
    BodyTimeout    a body not complete ``body_timeout_seconds`` after the request started ends as a disconnect for
                   the app, and the client gets 408 ``request_timeout`` (unless the app answered already)

Both answer with ``Connection: close``. ``create_app`` puts BodySizeLimit in FastAPI's stack and around the direct
ingest path; ``server.serve`` wraps the whole app in BodyTimeout. Slow request headers are cut off a level below
ASGI, in uvicorn's protocol (``header_timeout.py``).
"""

from __future__ import annotations

import asyncio
from typing import Any, Callable, Dict, Optional

from agent.hub.responses import HubHTTPError, client_of, log_refusal, send_error
from agent.log import get_logger

# Both slow-client cut-offs (this body deadline and header_timeout.py's) log as one component.
log = get_logger("hub.timeouts")

App = Callable[..., Any]


class WatchedSend:
    """An ASGI ``send`` that remembers the status of the response once it started."""

    __slots__ = ("_send", "status")

    def __init__(self, send: Callable[..., Any]) -> None:
        self._send = send
        self.status: Optional[int] = None

    @property
    def started(self) -> bool:
        return self.status is not None

    async def __call__(self, message: Dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            self.status = message["status"]
        await self._send(message)


class BodyTooLarge(Exception):
    """Raised by BodySizeLimit's ``receive`` once the body passes the limit; BodySizeLimit answers 413."""


class BodySizeLimit:
    """ASGI wrapper: a body over ``max_body_bytes`` is refused with 413 before anything parses it."""

    def __init__(self, app: App, max_body_bytes: int) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes

    def _too_large(self) -> HubHTTPError:
        return HubHTTPError(413, "body_too_large", f"request body is over the {self.max_body_bytes}-byte limit",
                            headers={"Connection": "close"})

    async def __call__(self, scope: Dict[str, Any], receive: Callable[..., Any], send: Callable[..., Any]) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                if not value.isdigit():
                    await _refuse(scope, send, HubHTTPError(400, "bad_request", "Content-Length is not a number",
                                                            headers={"Connection": "close"}))
                    return
                if int(value) > self.max_body_bytes:
                    await _refuse(scope, send, self._too_large())
                    return
        received = 0

        async def limited_receive() -> Dict[str, Any]:
            nonlocal received
            message: Dict[str, Any] = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_body_bytes:
                    raise BodyTooLarge()
            return message

        watched = WatchedSend(send)
        try:
            await self.app(scope, limited_receive, watched)
        except BodyTooLarge:
            if watched.started:
                raise
            await _refuse(scope, send, self._too_large())


async def _refuse(scope: Dict[str, Any], send: Callable[..., Any], exc: HubHTTPError) -> None:
    log_refusal(exc, scope)
    await send_error(send, exc)


class BodyTimeout:
    """ASGI wrapper: an HTTP request body must be complete ``body_timeout_seconds`` after the request started."""

    def __init__(self, app: App, body_timeout_seconds: float) -> None:
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

        async def timed_receive() -> Dict[str, Any]:
            nonlocal timed_out, body_done
            if timed_out:
                return {"type": "http.disconnect"}
            if body_done:
                return await receive()  # after the body only a disconnect comes: no deadline on waiting for it
            try:
                message: Dict[str, Any] = await asyncio.wait_for(receive(), max(0.0, deadline - loop.time()))
            except asyncio.TimeoutError:
                timed_out = True
                return {"type": "http.disconnect"}
            if message["type"] == "http.request" and not message.get("more_body", False):
                body_done = True
            return message

        watched = WatchedSend(send)
        await self.app(scope, timed_receive, watched)
        if timed_out and not watched.started:
            log.info("hub_connection_timed_out", phase="body", timeout_seconds=self.body_timeout_seconds,
                     path=scope.get("path"), client=client_of(scope))
            await send_error(send, HubHTTPError(408, "request_timeout", (
                f"the request body was not complete within {self.body_timeout_seconds:g} s"),
                headers={"Connection": "close"}))
