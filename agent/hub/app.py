"""The hub's HTTP API: ingest host reports, answer fleet questions.

    POST /v1/events   a host's EventBatch (host token)      -> {"accepted": [...], "duplicates": [...]}
    GET  /v1/hosts    each host's latest pairing, last seen, compliance       (reader token)
    GET  /v1/pairings hosts per driver/ROCm/CUDA/kernel pairing               (reader token)
    GET  /v1/drift    hosts with drift/regression/fallback/violation/rollback events since a time (reader)
    GET  /v1/events   stored events by host, kind, time                        (reader token)
    GET  /healthz     liveness and database reachability (no token)
    GET  /metrics     Prometheus text format (reader token; agent/hub/metrics.py)
    GET  /ui/...      the web dashboard (reader token or session; agent/hub/dashboard/)

A request is checked in this order, and every refusal is a JSON ``{"error", "detail", "problems"}`` whose
``detail`` is one readable line: body size (413, before anything is parsed), token (401; 403 for the wrong
kind of token), JSON syntax (400), schema (422), event hosts against the token's host (403). Writes go through
the group-commit writer; a full queue or a failing database is 503 with Retry-After, which the agent retries.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import math
import re
from typing import Any, AsyncIterator, Callable, Dict, Iterator, List, Literal, Mapping, Optional, TypeVar, Union

from fastapi import Depends, FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel, ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from agent import __version__
from agent.errors import StoreError, WriterBusy
from agent.hub.alerts import AlertDeliverer, AlertQueue
from agent.hub.dashboard import mount_dashboard
from agent.hub.fleet import DriftHost, PairingCount, drift_hosts, pairing_counts
from agent.hub.metrics import HubMetrics
from agent.hub.retention import retention_worker
from agent.hub.rows import DRIFT_KINDS, BatchResult, EventQuery, HostState, utc, utc_now
from agent.hub.settings import HubSettings
from agent.hub.store import SqlStore
from agent.hub.tokens import Principal, TokenRegistry, bearer_token
from agent.hub.writer import GroupCommitWriter
from agent.log import get_logger
from agent.models import FrozenModel
from agent.report.events import EVENT_SCHEMA_VERSION, PAYLOAD_KINDS, Event, EventBatch
from agent.validation import validation_problems

log = get_logger("hub.app")

# Every kind in the event schema; built from the tuple at run time, which a type checker cannot follow.
PayloadKind = Literal[PAYLOAD_KINDS]  # type: ignore[valid-type]
INGEST_PATH = "/v1/events"
_MAX_BIGINT = 2 ** 63 - 1
_MAX_PROBLEMS_IN_BODY = 20
_DEFAULT_DRIFT_WINDOW = dt.timedelta(days=1)


# --- response models (the OpenAPI spec is generated from these) ------------------------------------------------

class ErrorBody(FrozenModel):
    """Every refusal: a machine-readable ``error``, a one-line ``detail``, and each problem when there are several."""

    error: str
    detail: str
    problems: List[str] = []


class Health(FrozenModel):
    status: Literal["ok"]
    store: str
    event_schema_version: int


class HostsResponse(FrozenModel):
    host_count: int
    hosts: List[HostState]


class PairingsResponse(FrozenModel):
    host_count: int
    hosts_without_pairing: int
    pairings: List[PairingCount]


class DriftResponse(FrozenModel):
    since: dt.datetime
    kinds: List[str]
    host_count: int
    hosts: List[DriftHost]


class EventRecord(FrozenModel):
    received_at: dt.datetime
    event: Event


class EventsResponse(FrozenModel):
    count: int
    events: List[EventRecord]


# --- refusals ---------------------------------------------------------------------------------------------------

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


def _json(model: BaseModel, status: int = 200, headers: Optional[Dict[str, str]] = None) -> Response:
    return Response(content=model.model_dump_json(), status_code=status, media_type="application/json",
                    headers=headers)


def _error_response(status: int, error: str, detail: str, problems: Optional[List[str]] = None,
                    headers: Optional[Dict[str, str]] = None) -> Response:
    return _json(ErrorBody(error=error, detail=detail, problems=(problems or [])[:_MAX_PROBLEMS_IN_BODY]),
                 status, headers)


_STATUS_ERRORS = {400: "bad_request", 401: "unauthorized", 403: "forbidden", 404: "not_found",
                  405: "method_not_allowed", 413: "body_too_large", 415: "unsupported_media_type",
                  422: "invalid_request", 429: "too_many_requests", 503: "unavailable"}


def _one_line(summary: str, problems: List[str]) -> str:
    if not problems:
        return summary
    more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
    return f"{summary}: {problems[0]}{more}"


# --- body size limit --------------------------------------------------------------------------------------------

class _BodyTooLarge(Exception):
    pass


class BodySizeLimitMiddleware:
    """Refuse bodies over ``max_body_bytes`` with 413 before anything parses them.

    A declared Content-Length over the limit is refused without reading the body; a body without one (chunked)
    or one that lies is counted as it streams in and refused as soon as it passes the limit.
    """

    def __init__(self, app: Any, max_body_bytes: int) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Dict[str, Any], receive: Callable[..., Any], send: Callable[..., Any]) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    await self._refuse(scope, send, 400, "bad_request", "Content-Length is not a number")
                    return
                if declared > self.max_body_bytes:
                    await self._refuse(scope, send, 413, "body_too_large", self._too_large_detail())
                    return
        received = 0
        response_started = False

        async def limited_receive() -> Dict[str, Any]:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_body_bytes:
                    raise _BodyTooLarge()
            return message

        async def tracking_send(message: Dict[str, Any]) -> None:
            nonlocal response_started
            if message["type"] == "http.response.start":
                response_started = True
            await send(message)

        try:
            await self.app(scope, limited_receive, tracking_send)
        except _BodyTooLarge:
            if response_started:
                raise
            await self._refuse(scope, send, 413, "body_too_large", self._too_large_detail())

    def _too_large_detail(self) -> str:
        return f"request body is over the {self.max_body_bytes}-byte limit"

    async def _refuse(self, scope: Dict[str, Any], send: Callable[..., Any], status: int, error: str,
                      detail: str) -> None:
        log.info("hub_request_refused", status=status, error=error, path=scope.get("path"),
                 client=_client_of(scope))
        response = _error_response(status, error, detail, headers={"Connection": "close"})
        await response(scope, _no_receive, send)


async def _no_receive() -> Dict[str, Any]:  # pragma: no cover - a plain Response never reads the body
    return {"type": "http.disconnect"}


def _client_of(scope: Mapping[str, Any]) -> Optional[str]:
    client = scope.get("client")
    return f"{client[0]}:{client[1]}" if client else None


# --- validation beyond the schema -------------------------------------------------------------------------------

def _unstorable(value: Any, where: str) -> Iterator[str]:
    """Values the schema allows but no database should hold: NUL in text, NaN and infinities."""
    if isinstance(value, BaseModel):
        for name in type(value).model_fields:
            yield from _unstorable(getattr(value, name), f"{where} -> {name}")
    elif isinstance(value, str):
        if "\x00" in value:
            yield f"{where}: must not contain NUL (U+0000)"
    elif isinstance(value, float):
        if not math.isfinite(value):
            yield f"{where}: must be a finite number"
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _unstorable(key, f"{where} (key)")
            yield from _unstorable(item, f"{where} -> {key}")
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value, 1):
            yield from _unstorable(item, f"{where} -> {index}")


# Only a body containing one of these can hold NUL, NaN or an infinity (1e400, or 400 digits); others skip the
# deep walk.
_SUSPECT = re.compile(rb"\\u0000|NaN|Infinity|[0-9][eE][+-]?[0-9]{3}|[0-9]{300}")


def batch_problems(batch: EventBatch, body: Optional[bytes] = None) -> List[str]:
    """What the hub refuses in a schema-valid batch: times without offset or out of range, huge sequences,
    NUL characters and non-finite numbers. With the raw ``body``, the walk over every value is skipped when the
    body cannot contain NUL or a non-finite number."""
    deep = body is None or _SUSPECT.search(body) is not None
    problems: List[str] = []
    for index, event in enumerate(batch.events, 1):
        where = f"events -> {index}"
        if event.occurred_at.utcoffset() is None:
            problems.append(f"{where} -> occurred_at: needs a UTC offset (RFC 3339), e.g. 2026-01-01T00:00:00Z")
        else:
            try:
                utc(event.occurred_at)
            except OverflowError:
                problems.append(f"{where} -> occurred_at: out of range")
        if event.sequence > _MAX_BIGINT:
            problems.append(f"{where} -> sequence: must be at most {_MAX_BIGINT}")
        if deep:
            problems.extend(_unstorable(event, where))
    return problems


def parse_batch(body: bytes) -> EventBatch:
    """The batch in a request body; HubHTTPError 400 for broken JSON, 422 for a body that is not an EventBatch."""
    try:
        batch = EventBatch.model_validate_json(body)
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
        broken = [e for e in errors if e["type"] == "json_invalid"]
        if broken:
            raise HubHTTPError(400, "malformed_json", f"body is not valid JSON: {broken[0]['msg']}") from None
        problems = validation_problems(errors, top="(body)")
        raise HubHTTPError(422, "schema_invalid", _one_line(
            f"body is not an EventBatch (schema v{EVENT_SCHEMA_VERSION})", problems), problems) from None
    problems = batch_problems(batch, body)
    if problems:
        raise HubHTTPError(422, "schema_invalid", _one_line("body cannot be stored", problems), problems)
    return batch


_Default = TypeVar("_Default", bound=Optional[dt.datetime])


def _since(value: Optional[dt.datetime], default: _Default) -> Union[dt.datetime, _Default]:
    if value is None:
        return default
    try:
        return utc(value)  # a time without offset is taken as UTC
    except OverflowError:
        raise HubHTTPError(422, "invalid_request", "since: out of range", ["query -> since: out of range"]) \
            from None


# --- ingest: the hot path ----------------------------------------------------------------------------------------

_MISSING_TOKEN = "missing bearer token (Authorization: Bearer <token>)"
_UNAUTHORIZED = {"WWW-Authenticate": "Bearer"}


class Ingest:
    """POST /v1/events, step by step; the FastAPI route and the direct ASGI path both run these steps."""

    def __init__(self, settings: HubSettings, registry: TokenRegistry, writer: GroupCommitWriter) -> None:
        self.settings = settings
        self.registry = registry
        self.writer = writer
        self.alerts: Optional[AlertQueue] = None

    def too_large(self) -> HubHTTPError:
        return HubHTTPError(413, "body_too_large",
                            f"request body is over the {self.settings.max_body_bytes}-byte limit",
                            headers={"Connection": "close"})

    def host_of(self, token: Optional[str]) -> Principal:
        """The host a token belongs to; 401 without a valid token, 403 for a reader token."""
        if not token:
            raise HubHTTPError(401, "unauthorized", _MISSING_TOKEN, headers=_UNAUTHORIZED)
        principal = self.registry.authenticate_token(token)
        if principal is None:
            raise HubHTTPError(401, "unauthorized", "invalid bearer token", headers=_UNAUTHORIZED)
        if principal.role != "host":
            raise HubHTTPError(403, "forbidden", "a reader token cannot post events; use the host's token")
        return principal

    async def store(self, principal: Principal, body: bytes) -> BatchResult:
        """Parse, check the hosts, queue for the writer and wait for the commit."""
        batch = parse_batch(body)
        foreign = sorted({e.host_id for e in batch.events if e.host_id != principal.subject})
        if foreign:
            raise HubHTTPError(403, "forbidden", f"token is for host {principal.subject!r}, not for "
                                                 f"{', '.join(repr(h) for h in foreign[:3])}")
        try:
            future = self.writer.submit(batch.events)
        except WriterBusy as exc:
            raise HubHTTPError(503, "unavailable", str(exc), headers={"Retry-After": "1"}) from None
        timeout = self.settings.write_timeout_seconds
        try:
            result: BatchResult = await asyncio.wait_for(asyncio.wrap_future(future), timeout)
        except asyncio.TimeoutError:
            raise HubHTTPError(503, "unavailable", f"storing took over {timeout:g} s; retry (stored events are "
                                                   "answered as duplicates)", headers={"Retry-After": "5"}) from None
        except StoreError as exc:
            raise HubHTTPError(503, "unavailable", f"storage unavailable: {exc.reason}",
                               headers={"Retry-After": "5"}) from None
        if self.alerts is not None and self.alerts.wanted(batch.events):
            # Queued before the answer: if this fails the agent resends, and the duplicates are queued then.
            try:
                await run_in_threadpool(self.alerts.enqueue, batch.events, utc_now())
            except StoreError as exc:
                raise HubHTTPError(503, "unavailable", f"storage unavailable: {exc.reason}",
                                   headers={"Retry-After": "5"}) from None
        log.debug("hub_batch_stored", host_id=principal.subject, accepted_count=len(result.accepted),
                  duplicate_count=len(result.duplicates))
        return result

    async def asgi(self, scope: Dict[str, Any], receive: Callable[..., Any], send: Callable[..., Any]) -> None:
        """The whole request as plain ASGI: no routing, no dependency injection, no middleware stack (together
        about half of the hub's CPU per report in the bench); same checks in the same order, same answers."""
        try:
            declared: Optional[bytes] = None
            authorization: Optional[bytes] = None
            for name, value in scope["headers"]:
                if name == b"content-length":
                    declared = value
                elif name == b"authorization":
                    authorization = value
            if declared is not None:
                if not declared.isdigit():
                    raise HubHTTPError(400, "bad_request", "Content-Length is not a number",
                                       headers={"Connection": "close"})
                if int(declared) > self.settings.max_body_bytes:
                    raise self.too_large()
            principal = self.host_of(bearer_token(authorization.decode("latin-1")) if authorization else None)
            chunks: List[bytes] = []
            received = 0
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    return  # the client is gone; nothing to answer
                chunk = message.get("body", b"")
                received += len(chunk)
                if received > self.settings.max_body_bytes:
                    raise self.too_large()
                chunks.append(chunk)
                if not message.get("more_body", False):
                    break
            result = await self.store(principal, b"".join(chunks))
            await _send_json(send, 200, result.model_dump_json().encode())
        except HubHTTPError as exc:
            log.info("hub_request_refused", status=exc.status, error=exc.error, detail=exc.detail,
                     path=scope.get("path"), client=_client_of(scope))
            body = ErrorBody(error=exc.error, detail=exc.detail, problems=exc.problems[:_MAX_PROBLEMS_IN_BODY])
            await _send_json(send, exc.status, body.model_dump_json().encode(), exc.headers)
        except Exception as exc:  # noqa: BLE001 - answer 500 as the framework would, and log it
            log.error("hub_internal_error", path=scope.get("path"), error=repr(exc))
            body = ErrorBody(error="internal", detail="internal error; see the hub's log")
            await _send_json(send, 500, body.model_dump_json().encode())


async def _send_json(send: Callable[..., Any], status: int, body: bytes,
                     headers: Optional[Dict[str, str]] = None) -> None:
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    raw += [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})


class HubApp(FastAPI):
    """FastAPI, with POST /v1/events answered by ``Ingest.asgi`` before the framework's stack when ``fast_ingest``
    is set. The FastAPI route stays: it documents the operation in the OpenAPI spec and runs the same steps."""

    fast_ingest: Optional[Callable[..., Any]] = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (self.fast_ingest is not None and scope["type"] == "http" and scope["path"] == INGEST_PATH
                and scope["method"] == "POST"):
            await self.fast_ingest(scope, receive, send)
            return
        await super().__call__(scope, receive, send)


# --- the app ----------------------------------------------------------------------------------------------------

_ERROR_RESPONSES: Dict[int, Dict[str, Any]] = {
    status: {"model": ErrorBody, "description": description} for status, description in (
        (400, "Malformed JSON"),
        (401, "Missing or invalid bearer token"),
        (403, "Token valid but not allowed this (wrong host, or wrong kind of token)"),
        (413, "Body over the size limit"),
        (422, "Body or query does not match the schema"),
        (503, "Storage busy or unavailable; retry after Retry-After seconds"),
    )
}


def _responses(*statuses: int) -> Dict[Union[int, str], Dict[str, Any]]:
    return {s: _ERROR_RESPONSES[s] for s in statuses}


_READ_ERRORS = _responses(401, 403, 422, 503)


def create_app(settings: HubSettings, store: SqlStore, tokens: Optional[TokenRegistry] = None,
               clock: Callable[[], dt.datetime] = utc_now, fast_ingest: bool = True) -> FastAPI:
    """The hub app over ``store``; the lifespan opens the store and runs the group-commit writer.

    ``fast_ingest=False`` sends POST /v1/events through FastAPI's routing like every other route (the tests run
    both ways and expect the same answers)."""
    registry = tokens if tokens is not None else TokenRegistry(settings.tokens_file, settings.tokens_reload_seconds)
    writer = GroupCommitWriter(store, max_pending_batches=settings.max_pending_batches,
                               max_events_per_commit=settings.max_events_per_commit, clock=clock)
    retention = retention_worker(settings, store, clock)
    alert_queue = AlertQueue(store, settings.alert_webhooks)
    deliverer = AlertDeliverer(settings, alert_queue, clock)
    hub_metrics = HubMetrics(store, alert_queue, settings.stale_after_seconds, clock)
    bearer = HTTPBearer(auto_error=False, description="`gpuguard hub add-host HOST_ID` (host token) or "
                                                      "`gpuguard hub add-reader NAME` (reader token)")

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        await run_in_threadpool(store.open)
        writer.start()
        await run_in_threadpool(alert_queue.open)
        deliverer.start()
        retention.start()
        log.info("hub_started", store=type(store).__name__, token_count=len(registry),
                 max_body_bytes=settings.max_body_bytes)
        if len(registry) == 0:
            log.warning("hub_has_no_tokens", tokens_file=settings.tokens_file,
                        hint="every request will get 401; run: gpuguard hub add-host HOST_ID")
        try:
            yield
        finally:
            await run_in_threadpool(retention.stop, settings.shutdown_timeout_seconds)
            await run_in_threadpool(deliverer.stop, settings.shutdown_timeout_seconds)
            await run_in_threadpool(writer.stop, settings.shutdown_timeout_seconds)
            await run_in_threadpool(store.close)
            log.info("hub_stopped", commit_count=writer.commit_count, batch_count=writer.batch_count)

    app = HubApp(title="gpuguard hub", version=__version__, lifespan=lifespan, docs_url=None, redoc_url=None,
                 separate_input_output_schemas=False,
                 description="Receives gpuguard host reports (event schema v1) and answers fleet questions.")
    app.state.writer = writer
    app.state.store = store
    ingest = Ingest(settings, registry, writer)
    ingest.alerts = alert_queue
    if fast_ingest:
        app.fast_ingest = hub_metrics.timed(ingest.asgi)
    app.add_middleware(BodySizeLimitMiddleware, max_body_bytes=settings.max_body_bytes)

    @app.exception_handler(HubHTTPError)
    async def _hub_error(request: Request, exc: HubHTTPError) -> Response:
        log.info("hub_request_refused", status=exc.status, error=exc.error, detail=exc.detail,
                 path=request.url.path, client=_client_of(request.scope))
        return _error_response(exc.status, exc.error, exc.detail, exc.problems, exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _invalid_request(request: Request, exc: RequestValidationError) -> Response:
        problems = validation_problems(exc.errors(), top="(body)")
        return await _hub_error(request, HubHTTPError(422, "invalid_request", _one_line("invalid request",
                                                                                         problems), problems))

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> Response:
        error = _STATUS_ERRORS.get(exc.status_code, "error")
        return _error_response(exc.status_code, error, str(exc.detail), headers=getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> Response:
        log.error("hub_internal_error", path=request.url.path, error=repr(exc))
        return _error_response(500, "internal", "internal error; see the hub's log")

    def principal_of(credentials: Optional[HTTPAuthorizationCredentials]) -> Principal:
        if credentials is None:
            raise HubHTTPError(401, "unauthorized", _MISSING_TOKEN, headers=_UNAUTHORIZED)
        principal = registry.authenticate_token(credentials.credentials)
        if principal is None:
            raise HubHTTPError(401, "unauthorized", "invalid bearer token", headers=_UNAUTHORIZED)
        return principal

    def require_reader(credentials: Optional[HTTPAuthorizationCredentials] = Depends(bearer)) -> None:
        if not settings.fleet_api_requires_token:
            return
        principal = principal_of(credentials)
        if principal.role != "reader":
            raise HubHTTPError(403, "forbidden", "a host token cannot read the fleet API; use a reader token")

    def read(operation: Callable[[], Any]) -> Any:
        try:
            return operation()
        except StoreError as exc:
            raise HubHTTPError(503, "unavailable", f"storage unavailable: {exc.reason}",
                               headers={"Retry-After": "5"}) from None

    @app.post(INGEST_PATH, response_model=BatchResult, summary="Ingest a host's EventBatch",
              responses=_responses(400, 401, 403, 413, 422, 503),
              openapi_extra={"requestBody": {"required": True, "content": {"application/json": {
                  "schema": {"$ref": "#/components/schemas/EventBatch"}}}}})
    async def post_events(request: Request,
                          credentials: Optional[HTTPAuthorizationCredentials] = Depends(bearer)) -> Response:
        principal = ingest.host_of(credentials.credentials if credentials is not None else None)
        return _json(await ingest.store(principal, await request.body()))

    @app.get("/v1/hosts", response_model=HostsResponse, summary="Each host's latest pairing, last seen, compliance",
             responses=_READ_ERRORS, dependencies=[Depends(require_reader)])
    def get_hosts() -> Response:
        hosts = read(store.hosts)
        return _json(HostsResponse(host_count=len(hosts), hosts=hosts))

    @app.get("/v1/pairings", response_model=PairingsResponse, summary="Hosts per driver/ROCm/CUDA/kernel pairing",
             responses=_READ_ERRORS, dependencies=[Depends(require_reader)])
    def get_pairings() -> Response:
        hosts = read(store.hosts)
        counts, without = pairing_counts(hosts)
        return _json(PairingsResponse(host_count=len(hosts), hosts_without_pairing=without, pairings=counts))

    @app.get("/v1/drift", response_model=DriftResponse, summary="Hosts that drifted or regressed since a time",
             responses=_READ_ERRORS, dependencies=[Depends(require_reader)])
    def get_drift(since: Optional[dt.datetime] = Query(
            None, description="ISO 8601 time; without offset it is UTC; default: 24 hours ago")) -> Response:
        start = _since(since, clock() - _DEFAULT_DRIFT_WINDOW)
        hosts = drift_hosts(read(lambda: store.drift(start, DRIFT_KINDS)))
        return _json(DriftResponse(since=start, kinds=list(DRIFT_KINDS), host_count=len(hosts), hosts=hosts))

    @app.get("/v1/events", response_model=EventsResponse, summary="Stored events, newest first by default",
             responses=_READ_ERRORS, dependencies=[Depends(require_reader)])
    def get_events(host_id: Optional[str] = Query(None, min_length=1, max_length=128),
                   kind: Optional[PayloadKind] = Query(None),
                   since: Optional[dt.datetime] = Query(None, description="ISO 8601; without offset it is UTC"),
                   limit: int = Query(100, ge=1, le=1000),
                   order: Literal["desc", "asc"] = Query("desc")) -> Response:
        query = EventQuery(host_id=host_id, kind=kind, since=_since(since, None), limit=limit,
                           newest_first=order == "desc")
        stored = read(lambda: store.events(query))
        records = [EventRecord(received_at=s.received_at, event=Event.model_validate_json(s.body)) for s in stored]
        return _json(EventsResponse(count=len(records), events=records))

    @app.get("/healthz", response_model=Health, summary="Liveness and database reachability",
             responses=_responses(503))
    def healthz() -> Response:
        read(store.ping)
        return _json(Health(status="ok", store=type(store).__name__, event_schema_version=EVENT_SCHEMA_VERSION))

    @app.get("/metrics", include_in_schema=False, dependencies=[Depends(require_reader)])
    def metrics() -> Response:
        # Same access rule as the fleet API: Prometheus sends the reader token (authorization: credentials_file).
        return Response(generate_latest(hub_metrics.registry), media_type=CONTENT_TYPE_LATEST)

    mount_dashboard(app, settings, store, registry, clock, alert_counts=alert_queue.counts)

    def openapi() -> Dict[str, Any]:
        if app.openapi_schema is None:
            spec = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
            batch_schema = EventBatch.model_json_schema(ref_template="#/components/schemas/{model}")
            schemas = spec.setdefault("components", {}).setdefault("schemas", {})
            for name, definition in batch_schema.pop("$defs", {}).items():
                schemas.setdefault(name, definition)
            schemas["EventBatch"] = batch_schema
            app.openapi_schema = spec
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
    return app
