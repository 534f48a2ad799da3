"""How the hub answers: a model as JSON, through FastAPI's stack or as plain ASGI messages, and every refusal.

A refusal is a ``HubHTTPError`` wherever it is found, answered as JSON ``{"error", "detail", "problems"}``
(``ErrorBody``) whose ``detail`` is one readable line, and logged once as ``hub_request_refused``.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Mapping, Optional

from pydantic import BaseModel
from starlette.responses import Response

from agent.errors import StoreError
from agent.hub.api_models import ErrorBody
from agent.log import get_logger

log = get_logger("hub.app")

MAX_PROBLEMS_IN_BODY = 20
# The error code of a refusal that the framework itself makes (an unknown path, a wrong method, ...).
STATUS_ERRORS = {400: "bad_request", 401: "unauthorized", 403: "forbidden", 404: "not_found",
                 405: "method_not_allowed", 413: "body_too_large", 415: "unsupported_media_type",
                 422: "invalid_request", 429: "too_many_requests", 503: "unavailable"}


class HubHTTPError(Exception):
    """A refusal with its status, error code and one-line detail."""

    def __init__(self, status: int, error: str, detail: str, problems: Optional[List[str]] = None,
                 headers: Optional[Dict[str, str]] = None) -> None:
        super().__init__(detail)
        self.status = status
        self.error = error
        self.detail = detail
        self.problems = problems or []
        self.headers = headers or {}


def one_line(summary: str, problems: List[str]) -> str:
    """``summary``, with the first problem and how many more there are."""
    if not problems:
        return summary
    more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
    return f"{summary}: {problems[0]}{more}"


def storage_unavailable(exc: StoreError) -> HubHTTPError:
    """503 for a database that failed; the agent retries after Retry-After."""
    return HubHTTPError(503, "unavailable", f"storage unavailable: {exc.reason}", headers={"Retry-After": "5"})


def internal_error(path: Optional[str], exc: BaseException) -> HubHTTPError:
    """Log an unexpected failure; the 500 that answers it."""
    log.error("hub_internal_error", path=path, error=repr(exc))
    return HubHTTPError(500, "internal", "internal error; see the hub's log")


def client_of(scope: Mapping[str, Any]) -> Optional[str]:
    """The peer of an ASGI request as ``host:port``, if known."""
    client = scope.get("client")
    return f"{client[0]}:{client[1]}" if client else None


def log_refusal(exc: HubHTTPError, scope: Mapping[str, Any]) -> None:
    log.info("hub_request_refused", status=exc.status, error=exc.error, detail=exc.detail, path=scope.get("path"),
             client=client_of(scope))


def _error_json(exc: HubHTTPError) -> str:
    return ErrorBody(error=exc.error, detail=exc.detail, problems=exc.problems[:MAX_PROBLEMS_IN_BODY]).model_dump_json()


# --- through FastAPI's stack ---------------------------------------------------------------------------------------

def json_response(model: BaseModel, status: int = 200, headers: Optional[Dict[str, str]] = None) -> Response:
    return Response(content=model.model_dump_json(), status_code=status, media_type="application/json",
                    headers=headers)


def error_response(exc: HubHTTPError) -> Response:
    return Response(content=_error_json(exc), status_code=exc.status, media_type="application/json",
                    headers=exc.headers)


# --- as plain ASGI -------------------------------------------------------------------------------------------------

async def send_json(send: Callable[..., Any], status: int, body: bytes,
                    headers: Optional[Dict[str, str]] = None) -> None:
    """A complete response: ``body`` (JSON) with its length and ``headers``."""
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    raw += [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})


async def send_error(send: Callable[..., Any], exc: HubHTTPError) -> None:
    await send_json(send, exc.status, _error_json(exc).encode(), exc.headers)
