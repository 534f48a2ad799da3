"""The hub's HTTP API: the FastAPI app, its routes and refusals, and what runs beside it while it serves.

    POST /v1/events   a host's EventBatch (host token)      -> {"accepted": [...], "duplicates": [...]}
    GET  /v1/hosts    each host's latest pairing, last seen, compliance       (reader token)
    GET  /v1/pairings hosts per driver/ROCm/CUDA/kernel pairing               (reader token)
    GET  /v1/drift    hosts with drift/regression/fallback/violation/rollback events received since a time (reader)
    GET  /v1/events   stored events by host, kind, time                        (reader token)
    POST /v1/policy/bundles                 store a signed policy bundle (admin token; 409 unless its serial is new)
    GET  /v1/policy/bundles                 every stored bundle, newest first (reader or admin)
    GET  /v1/policy/bundles/{serial}        one bundle, with its bytes and signature (reader or admin)
    POST /v1/policy/bundles/{serial}/withdraw  stop offering a bundle (admin)
    GET  /v1/policy/hosts                   each host's serial in force, the one offered, behind, refused (reader)
    GET  /v1/audit                          pushes, refused pushes and withdrawals, newest first (reader or admin)
    GET  /v1/policy/bundle                  the newest bundle in the calling host's scope (host token; ETag, 304, 204);
                                            while a staged rollout is active, its target only to admitted hosts
    GET  /v1/policy/deny                    the deny list of known-bad versions, once it verifies (host token; 204)
    POST /v1/policy/deny                    put a signed deny list in place (admin; 422 refused, 409 serial not
                                            above the one in place; audited; agent/hub/deny.py)
    POST /v1/rollouts                       start a staged rollout of a pushed bundle (admin; agent/hub/rollouts.py)
    GET  /v1/rollouts                       every rollout, newest first (reader or admin)
    GET  /v1/rollouts/{id}                  one rollout with its hosts, stages and evidence (reader or admin)
    POST /v1/rollouts/{id}/pause|resume|abort  operator actions (admin)
    GET  /v1/workloads/stacks               per registered workload, the stacks it passed and failed on (reader;
                                            agent/hub/workload_stacks.py)
    GET  /v1/workloads/verified             per workload, the (driver, ROCm/CUDA) stacks it passed on: the list a
                                            host caches for its [workloads] rule (host token)
    GET  /healthz     liveness and database reachability (no token)
    GET  /metrics     Prometheus text format (reader token; agent/hub/metrics.py)
    GET  /ui/...      the web dashboard (reader token or session; agent/hub/dashboard/)

Every refusal is a JSON ``{"error", "detail", "problems"}`` whose ``detail`` is one readable line (responses.py);
the order of the checks on POST /v1/events is in ingest.py, the body limits in middleware.py, the token rules in
access.py. The bodies are the models of api_models.py, from which the OpenAPI spec is generated.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import datetime as dt
from typing import (
    Any,
    AsyncContextManager,
    AsyncIterator,
    Callable,
    Dict,
    Literal,
    Optional,
    Sequence,
    Tuple,
    Type,
    TypeVar,
    Union,
)

from fastapi import Depends, FastAPI, Path, Query, Request
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
from agent.bundle.format import MAX_SERIAL
from agent.errors import StoreError
from agent.hub import workload_stacks
from agent.hub.access import admin_of, host_of, reader_of
from agent.hub.alerts import AlertDeliverer, AlertQueue
from agent.hub.api_models import (
    AuditResponse,
    BundleDetail,
    BundleOffer,
    BundlePush,
    BundlesResponse,
    DenyPush,
    DenySummary,
    DriftResponse,
    ErrorBody,
    EventRecord,
    EventsResponse,
    Health,
    HostsResponse,
    PairingsResponse,
    PayloadKind,
    SignedDocument,
)
from agent.hub.bundles import PolicyBundles, PolicyRollout
from agent.hub.dashboard import mount_dashboard
from agent.hub.deny import HubDeny
from agent.hub.fleet import drift_hosts, pairing_counts, unknown_by_table
from agent.hub.ingest import Ingest
from agent.hub.metrics import HubMetrics
from agent.hub.middleware import BodySizeLimit
from agent.hub.periodic import Periodic
from agent.hub.responses import (
    STATUS_ERRORS,
    HubHTTPError,
    error_response,
    internal_error,
    json_response,
    log_refusal,
    one_line,
    storage_unavailable,
)
from agent.hub.retention import RetentionWorker, retention_worker
from agent.hub.rollout_plan import RolloutRow, RolloutSpec, RolloutsResponse, RolloutStatus
from agent.hub.rollouts import Rollouts, RolloutWorker
from agent.hub.rows import DRIFT_KINDS, BatchResult, BundleSummary, EventQuery, utc, utc_now
from agent.hub.settings import HubSettings
from agent.hub.store import SqlStore
from agent.hub.tokens import Principal, TokenRegistry
from agent.hub.trust import FreshnessSigner, RootChain, root_files, root_or_keys_check
from agent.hub.writer import GroupCommitWriter
from agent.log import get_logger
from agent.report.events import EVENT_SCHEMA_VERSION, Event, EventBatch
from agent.validation import validation_problems
from agent.wire import (
    BUNDLE_PATH,
    DENY_PATH,
    FRESHNESS_PATH,
    INGEST_PATH,
    ROOT_PATH,
    VERIFIED_STACKS_PATH,
    etag_of,
)

log = get_logger("hub.app")

_DEFAULT_DRIFT_WINDOW = dt.timedelta(days=1)

_Default = TypeVar("_Default", bound=Optional[dt.datetime])
_Read = TypeVar("_Read")
_Body = TypeVar("_Body", bound=BaseModel)


def _since(value: Optional[dt.datetime], default: _Default) -> Union[dt.datetime, _Default]:
    if value is None:
        return default
    try:
        return utc(value)  # a time without offset is taken as UTC
    except OverflowError:
        raise HubHTTPError(422, "invalid_request", "since: out of range", ["query -> since: out of range"]) \
            from None


def _invalid(errors: Sequence[Any]) -> HubHTTPError:
    """422 for a request the schema refuses: the first problem in the one-line detail, every one in ``problems``."""
    problems = validation_problems(errors, top="(body)")
    return HubHTTPError(422, "invalid_request", one_line("invalid request", problems), problems)


def _base64(value: str, field: str) -> bytes:
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise HubHTTPError(422, "invalid_request", f"{field}: not base64 (standard alphabet, padded)",
                           [f"(body) -> {field}: not base64"]) from None


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


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


_ERROR_RESPONSES: Dict[int, Dict[str, Any]] = {
    status: {"model": ErrorBody, "description": description} for status, description in (
        (400, "Malformed JSON"),
        (401, "Missing or invalid bearer token"),
        (403, "Token valid but not allowed this (wrong host, or wrong kind of token)"),
        (404, "No such policy bundle or rollout"),
        (409, "Conflicts with what is stored (a serial not above the highest, a bundle already withdrawn, a rollout "
              "already active or in a state that does not allow the action)"),
        (413, "Body over the size limit"),
        (422, "Body or query does not match the schema"),
        (503, "Storage busy or unavailable; retry after Retry-After seconds"),
    )
}


def _responses(*statuses: int) -> Dict[Union[int, str], Dict[str, Any]]:
    return {s: _ERROR_RESPONSES[s] for s in statuses}


_READ_ERRORS = _responses(401, 403, 422, 503)


def _lifespan(settings: HubSettings, store: SqlStore, registry: TokenRegistry, writer: GroupCommitWriter,
              alert_queue: AlertQueue, deliverer: AlertDeliverer, periodic: Periodic,
              retention: RetentionWorker) -> Callable[[FastAPI], AsyncContextManager[None]]:
    """What runs beside the app while it serves: the store opened, the writer, the alert deliverer and the periodic
    work started, and all of it stopped in the reverse order when the server stops."""

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        await run_in_threadpool(store.open)
        writer.start()
        await run_in_threadpool(alert_queue.open)
        deliverer.start()
        periodic.start()
        log.info("hub_started", store=type(store).__name__, token_count=len(registry),
                 max_body_bytes=settings.max_body_bytes)
        if len(registry) == 0:
            log.warning("hub_has_no_tokens", tokens_file=settings.tokens_file,
                        hint="every request will get 401; run: gpuguard hub add-host HOST_ID")
        try:
            yield
        finally:
            retention.stop()
            await run_in_threadpool(periodic.stop, settings.shutdown_timeout_seconds)
            await run_in_threadpool(deliverer.stop, settings.shutdown_timeout_seconds)
            await run_in_threadpool(writer.stop, settings.shutdown_timeout_seconds)
            await run_in_threadpool(store.close)
            log.info("hub_stopped", commit_count=writer.commit_count, batch_count=writer.batch_count)

    return lifespan


def _add_error_handlers(app: FastAPI) -> None:
    """Every refusal as the JSON of responses.py: the hub's own, the schema's (422), Starlette's, and anything
    unexpected (500, logged)."""

    @app.exception_handler(HubHTTPError)
    async def _hub_error(request: Request, exc: HubHTTPError) -> Response:
        log_refusal(exc, request.scope)
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _invalid_request(request: Request, exc: RequestValidationError) -> Response:
        return await _hub_error(request, _invalid(exc.errors()))

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> Response:
        return error_response(HubHTTPError(exc.status_code, STATUS_ERRORS.get(exc.status_code, "error"),
                                           str(exc.detail), headers=getattr(exc, "headers", None)))

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> Response:
        return error_response(internal_error(request.url.path, exc))


def _reader_check(settings: HubSettings, registry: TokenRegistry, bearer: HTTPBearer) -> Callable[..., None]:
    """The dependency of the fleet API's routes: a reader token, unless ``fleet_api_requires_token`` is off."""

    def require_reader(credentials: Optional[HTTPAuthorizationCredentials] = Depends(bearer)) -> None:
        if settings.fleet_api_requires_token:
            reader_of(registry, credentials.credentials if credentials is not None else None)

    return require_reader


def read(operation: Callable[[], _Read]) -> _Read:
    """What ``operation`` reads from the store; 503 when the store is busy or unavailable."""
    try:
        return operation()
    except StoreError as exc:
        raise storage_unavailable(exc) from None


def token_of(credentials: Optional[HTTPAuthorizationCredentials]) -> Optional[str]:
    return credentials.credentials if credentials is not None else None


async def admin_body(registry: TokenRegistry, request: Request, credentials: Optional[HTTPAuthorizationCredentials],
                     model: Type[_Body]) -> Tuple[Principal, _Body]:
    """The admin calling, and the request's JSON body as ``model`` (401/403 before the body is read, 422)."""
    principal = admin_of(registry, token_of(credentials))
    try:
        return principal, model.model_validate_json(await request.body())
    except ValidationError as exc:
        raise _invalid(exc.errors()) from None


def _add_ingest_route(app: FastAPI, ingest: Ingest, registry: TokenRegistry, bearer: HTTPBearer) -> None:
    """POST /v1/events through FastAPI's routing (the fast path, HubApp.fast_ingest, runs the same steps)."""

    @app.post(INGEST_PATH, response_model=BatchResult, summary="Ingest a host's EventBatch",
              responses=_responses(400, 401, 403, 413, 422, 503),
              openapi_extra={"requestBody": {"required": True, "content": {"application/json": {
                  "schema": {"$ref": "#/components/schemas/EventBatch"}}}}})
    async def post_events(request: Request,
                          credentials: Optional[HTTPAuthorizationCredentials] = Depends(bearer)) -> Response:
        principal = host_of(registry, credentials.credentials if credentials is not None else None)
        return json_response(await ingest.store(principal, await request.body()))


def _add_fleet_routes(app: FastAPI, store: SqlStore, clock: Callable[[], dt.datetime],
                      require_reader: Callable[..., None]) -> None:
    """The fleet API (reader token): hosts, pairings, drift, stored events."""

    @app.get("/v1/hosts", response_model=HostsResponse, summary="Each host's latest pairing, last seen, compliance",
             responses=_READ_ERRORS, dependencies=[Depends(require_reader)])
    def get_hosts() -> Response:
        hosts = read(store.hosts)
        unknown = unknown_by_table([u.table for u in h.unknown_versions or ()] for h in hosts)
        return json_response(HostsResponse(host_count=len(hosts), hosts_unknown_by_table=unknown, hosts=hosts))

    @app.get("/v1/pairings", response_model=PairingsResponse, summary="Hosts per driver/ROCm/CUDA/kernel pairing",
             responses=_READ_ERRORS, dependencies=[Depends(require_reader)])
    def get_pairings() -> Response:
        hosts = read(store.hosts)
        counts, without = pairing_counts(hosts)
        return json_response(PairingsResponse(host_count=len(hosts), hosts_without_pairing=without, pairings=counts))

    @app.get("/v1/drift", response_model=DriftResponse, summary="Hosts that drifted or regressed since a time",
             responses=_READ_ERRORS, dependencies=[Depends(require_reader)])
    def get_drift(since: Optional[dt.datetime] = Query(
            None, description="ISO 8601 time, on the hub's clock (events it received since then); without offset "
                              "it is UTC; default: 24 hours ago")) -> Response:
        start = _since(since, clock() - _DEFAULT_DRIFT_WINDOW)
        hosts = drift_hosts(read(lambda: store.drift(start, DRIFT_KINDS)))
        return json_response(DriftResponse(since=start, kinds=list(DRIFT_KINDS), host_count=len(hosts), hosts=hosts))

    @app.get(INGEST_PATH, response_model=EventsResponse, summary="Stored events, the last received first by default",
             responses=_READ_ERRORS, dependencies=[Depends(require_reader)])
    def get_events(host_id: Optional[str] = Query(None, min_length=1, max_length=128),
                   kind: Optional[PayloadKind] = Query(None),
                   since: Optional[dt.datetime] = Query(None, description="ISO 8601, on the hub's clock (events it "
                                                        "received since then); without offset it is UTC"),
                   limit: int = Query(100, ge=1, le=1000),
                   order: Literal["desc", "asc"] = Query("desc")) -> Response:
        query = EventQuery(host_id=host_id, kind=kind, since=_since(since, None), limit=limit,
                           newest_first=order == "desc")
        stored = read(lambda: store.events(query))
        records = [EventRecord(received_at=s.received_at, event=Event.model_validate_json(s.body)) for s in stored]
        return json_response(EventsResponse(count=len(records), events=records))

    @app.get("/v1/workloads/stacks", response_model=workload_stacks.StacksResponse,
             summary="Per registered workload, the stacks it passed and failed on across the fleet",
             responses=_READ_ERRORS, dependencies=[Depends(require_reader)])
    def get_workload_stacks() -> Response:
        return json_response(workload_stacks.stacks_response(read(lambda: workload_stacks.matrix(store))))


def _add_policy_routes(app: FastAPI, registry: TokenRegistry, bearer: HTTPBearer,
                       require_reader: Callable[..., None], bundles: PolicyBundles, rollouts: Rollouts) -> None:
    """Signed policy bundles: push and withdraw (admin), list, show, the hosts' serials and the audit (reader), and
    the offer a host fetches (host token)."""

    @app.post("/v1/policy/bundles", response_model=BundleSummary, status_code=201,
              summary="Store a signed policy bundle (admin)", responses=_responses(401, 403, 409, 413, 422, 503),
              openapi_extra={"requestBody": {"required": True, "content": {"application/json": {
                  "schema": BundlePush.model_json_schema()}}}})
    async def push_bundle(request: Request,
                          credentials: Optional[HTTPAuthorizationCredentials] = Depends(bearer)) -> Response:
        principal, body = await admin_body(registry, request, credentials, BundlePush)
        data, signature = _base64(body.bundle, "bundle"), _base64(body.signature, "signature")
        summary = await run_in_threadpool(read, lambda: rollouts.push(principal, data, signature, body.staged))
        return json_response(summary, status=201, headers={"Location": f"/v1/policy/bundles/{summary.serial}"})

    @app.get("/v1/policy/bundles", response_model=BundlesResponse, summary="Every stored policy bundle, newest first",
             responses=_READ_ERRORS, dependencies=[Depends(require_reader)])
    def list_bundles() -> Response:
        found = read(bundles.summaries)
        return json_response(BundlesResponse(count=len(found), bundles=found))

    @app.get("/v1/policy/bundles/{serial}", response_model=BundleDetail, summary="One policy bundle with its bytes",
             responses=_responses(401, 403, 404, 422, 503), dependencies=[Depends(require_reader)])
    def show_bundle(serial: int = Path(..., ge=1, le=MAX_SERIAL)) -> Response:
        summary = read(lambda: bundles.summary(serial))
        data, signature = read(lambda: bundles.content(serial))
        parsed = read(lambda: bundles.bundle(serial))
        return json_response(BundleDetail(summary=summary, policy_files=sorted(parsed.policy_files),
                                          bundle=_b64(data), signature=_b64(signature)))

    @app.post("/v1/policy/bundles/{serial}/withdraw", response_model=BundleSummary,
              summary="Stop offering a policy bundle to hosts (admin)",
              responses=_responses(401, 403, 404, 409, 422, 503))
    def withdraw_bundle(serial: int = Path(..., ge=1, le=MAX_SERIAL),
                        credentials: Optional[HTTPAuthorizationCredentials] = Depends(bearer)) -> Response:
        principal = admin_of(registry, token_of(credentials))
        return json_response(read(lambda: bundles.withdraw(principal, serial)))

    @app.get("/v1/policy/hosts", response_model=PolicyRollout,
             summary="Each host's policy serial in force, the serial offered to it, and its last refusal",
             responses=_READ_ERRORS, dependencies=[Depends(require_reader)])
    def policy_hosts() -> Response:
        return json_response(read(bundles.rollout))

    @app.get("/v1/audit", response_model=AuditResponse, summary="Policy pushes and withdrawals, newest first",
             responses=_READ_ERRORS, dependencies=[Depends(require_reader)])
    def get_audit(limit: int = Query(100, ge=1, le=1000)) -> Response:
        entries = read(lambda: bundles.audit(limit))
        return json_response(AuditResponse(count=len(entries), entries=entries))

    @app.get(VERIFIED_STACKS_PATH, response_model=workload_stacks.VerifiedListing,
             summary="Per registered workload, the stacks it passed on (host token)",
             responses=_responses(401, 403, 503))
    def verified_stacks(credentials: Optional[HTTPAuthorizationCredentials] = Depends(bearer)) -> Response:
        host_of(registry, token_of(credentials))
        return json_response(read(lambda: workload_stacks.verified_listing(bundles.store, utc_now())))

    @app.get(BUNDLE_PATH, response_model=BundleOffer,
             summary="The newest policy bundle in this host's scope (host token); 304 when unchanged, 204 when none",
             responses={204: {"description": "No bundle is offered in this host's scope"},
                        304: {"description": "The bundle If-None-Match names is still the one offered"},
                        **_responses(401, 403, 503)})
    def fetch_bundle(request: Request,
                     credentials: Optional[HTTPAuthorizationCredentials] = Depends(bearer)) -> Response:
        principal = host_of(registry, token_of(credentials))
        offered = read(lambda: rollouts.offer(principal.subject))
        serial = offered.serial
        notice = offered.headers()
        if serial is None:
            return Response(status_code=204, headers=notice)
        etag = etag_of(serial)
        tags = [tag.strip() for tag in (request.headers.get("if-none-match") or "").split(",")]
        if etag in tags or "*" in tags:
            return Response(status_code=304, headers={"ETag": etag, **notice})
        offer = read(lambda: bundles.offer(serial))
        return json_response(BundleOffer(serial=serial, bundle=_b64(offer.bundle), signature=_b64(offer.signature),
                                         rollout=offered.notice, rollout_id=offered.rollout_id, state=offered.state,
                                         admitted_stage=offered.admitted_stage),
                             headers={"ETag": etag, "Cache-Control": "no-cache", **notice})


def _add_trust_routes(app: FastAPI, registry: TokenRegistry, bearer: HTTPBearer, settings: HubSettings,
                      bundles: PolicyBundles, signer: FreshnessSigner, deny: HubDeny) -> None:
    """The roots the hub was given, the deny list (host token; pushed with an admin token, agent/hub/deny.py) and
    its signed freshness statement (host token; agent/hub/trust.py)."""

    @app.get(ROOT_PATH, response_model=SignedDocument, summary="Root version N and its signatures (host token)",
             responses={204: {"description": "The hub has no root of that version"}, **_responses(401, 403, 422, 503)})
    def fetch_root(version: int = Query(..., ge=1, le=2**63 - 1),
                   credentials: Optional[HTTPAuthorizationCredentials] = Depends(bearer)) -> Response:
        host_of(registry, token_of(credentials))
        found = root_files(settings.root_dir, version)
        if found is None:
            return Response(status_code=204)
        return json_response(SignedDocument(root=_b64(found[0]), signature=_b64(found[1])))

    @app.get(DENY_PATH, response_model=SignedDocument,
             summary="The signed deny list of known-bad versions, outside every rollout (host token)",
             responses={204: {"description": "The hub has no deny list"}, **_responses(401, 403, 503)})
    def fetch_deny(credentials: Optional[HTTPAuthorizationCredentials] = Depends(bearer)) -> Response:
        host_of(registry, token_of(credentials))
        served = deny.served()
        if served is None:
            return Response(status_code=204)
        return json_response(SignedDocument(deny=_b64(served.data), signature=_b64(served.signature)),
                             headers={"Cache-Control": "no-cache"})

    @app.post(DENY_PATH, response_model=DenySummary,
              summary="Put a signed deny list in place (admin): a threshold of a fleet-wide policy role of the root",
              responses=_responses(401, 403, 409, 413, 422, 503),
              openapi_extra={"requestBody": {"required": True, "content": {"application/json": {
                  "schema": DenyPush.model_json_schema()}}}})
    async def push_deny(request: Request,
                        credentials: Optional[HTTPAuthorizationCredentials] = Depends(bearer)) -> Response:
        principal, body = await admin_body(registry, request, credentials, DenyPush)
        data, signature = _base64(body.deny, "deny"), _base64(body.signature, "signature")
        return json_response(await run_in_threadpool(read, lambda: deny.push(principal, data, signature)))

    @app.get(FRESHNESS_PATH, response_model=SignedDocument,
             summary="The hub's signed freshness statement: newest serial per scope, withdrawn serials (host token)",
             responses={204: {"description": "The hub signs no freshness statement"}, **_responses(401, 403, 503)})
    def fetch_freshness(credentials: Optional[HTTPAuthorizationCredentials] = Depends(bearer)) -> Response:
        host_of(registry, token_of(credentials))
        if not signer.enabled:
            return Response(status_code=204)
        data, signature = read(lambda: signer.statement(bundles.offered_scopes(), bundles.withdrawn_serials(),
                                                        deny.served_serial()))
        return json_response(SignedDocument(statement=_b64(data), signature=_b64(signature)),
                             headers={"Cache-Control": "no-cache"})


def _add_rollout_routes(app: FastAPI, registry: TokenRegistry, bearer: HTTPBearer,
                        require_reader: Callable[..., None], rollouts: Rollouts) -> None:
    """Staged rollouts: start, pause, resume and abort (admin), list and show (reader)."""

    @app.post("/v1/rollouts", response_model=RolloutStatus, status_code=201,
              summary="Start a staged rollout of a pushed bundle (admin)",
              responses=_responses(401, 403, 404, 409, 422, 503),
              openapi_extra={"requestBody": {"required": True, "content": {"application/json": {
                  "schema": RolloutSpec.model_json_schema()}}}})
    async def start_rollout(request: Request,
                            credentials: Optional[HTTPAuthorizationCredentials] = Depends(bearer)) -> Response:
        principal, spec = await admin_body(registry, request, credentials, RolloutSpec)
        status = await run_in_threadpool(read, lambda: rollouts.start(principal, spec))
        return json_response(status, status=201, headers={"Location": f"/v1/rollouts/{status.rollout.rollout_id}"})

    @app.get("/v1/rollouts", response_model=RolloutsResponse, summary="Every staged rollout, newest first",
             responses=_READ_ERRORS, dependencies=[Depends(require_reader)])
    def list_rollouts() -> Response:
        found = read(rollouts.rows)
        return json_response(RolloutsResponse(count=len(found), rollouts=found))

    @app.get("/v1/rollouts/{rollout_id}", response_model=RolloutStatus,
             summary="One rollout with its hosts, their stage and evidence",
             responses=_responses(401, 403, 404, 422, 503), dependencies=[Depends(require_reader)])
    def show_rollout(rollout_id: str = Path(..., max_length=64)) -> Response:
        return json_response(read(lambda: rollouts.status(rollout_id)))

    @app.post("/v1/rollouts/{rollout_id}/{action}", response_model=RolloutRow,
              summary="Pause, resume or abort a rollout (admin)", responses=_responses(401, 403, 404, 409, 422, 503))
    def change_rollout(rollout_id: str = Path(..., max_length=64),
                       action: Literal["pause", "resume", "abort"] = Path(...),
                       credentials: Optional[HTTPAuthorizationCredentials] = Depends(bearer)) -> Response:
        principal = admin_of(registry, token_of(credentials))
        operation = {"pause": rollouts.pause, "resume": rollouts.resume, "abort": rollouts.abort}[action]
        return json_response(read(lambda: operation(principal, rollout_id)))


def _add_health_and_metrics(app: FastAPI, store: SqlStore, hub_metrics: HubMetrics,
                            require_reader: Callable[..., None]) -> None:
    """/healthz (no token) and /metrics (reader token, as the fleet API)."""

    @app.get("/healthz", response_model=Health, summary="Liveness and database reachability",
             responses=_responses(503))
    def healthz() -> Response:
        read(store.ping)
        return json_response(Health(status="ok", store=type(store).__name__, event_schema_version=EVENT_SCHEMA_VERSION))

    @app.get("/metrics", include_in_schema=False, dependencies=[Depends(require_reader)])
    def metrics() -> Response:
        # Same access rule as the fleet API: Prometheus sends the reader token (authorization: credentials_file).
        return Response(generate_latest(hub_metrics.registry), media_type=CONTENT_TYPE_LATEST)


def _install_openapi(app: FastAPI) -> None:
    """The OpenAPI spec, with EventBatch's schema (the body POST /v1/events reads itself) among its components."""

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
    bundles = PolicyBundles(store, root_or_keys_check(settings.root_dir, settings.policy_keys_dir), clock)
    rollouts = Rollouts(store, bundles, alert_queue, clock, stale_after_seconds=settings.stale_after_seconds)
    rollout_worker = RolloutWorker(rollouts, settings.rollout_tick_seconds)
    periodic = Periodic()
    retention.schedule(periodic)
    rollout_worker.schedule(periodic)
    hub_metrics = HubMetrics(store, alert_queue, settings.stale_after_seconds, clock, policy_rollout=bundles.rollout,
                             staged_rollout=rollouts.current)
    bearer = HTTPBearer(auto_error=False, description="`gpuguard hub add-host HOST_ID` (host token), "
                                                      "`gpuguard hub add-reader NAME` (reader token) or "
                                                      "`gpuguard hub add-admin NAME` (admin token)")
    lifespan = _lifespan(settings, store, registry, writer, alert_queue, deliverer, periodic, retention)
    app = HubApp(title="gpuguard hub", version=__version__, lifespan=lifespan, docs_url=None, redoc_url=None,
                 separate_input_output_schemas=False,
                 description="Receives gpuguard host reports (event schema v1) and answers fleet questions.")
    app.state.writer = writer
    app.state.store = store
    app.state.rollouts = rollouts
    ingest = Ingest(settings, registry, writer, alert_queue, on_stored=rollout_worker.nudge, clock=clock)
    if fast_ingest:
        app.fast_ingest = hub_metrics.timed(BodySizeLimit(ingest.asgi, settings.max_body_bytes))
    app.add_middleware(BodySizeLimit, max_body_bytes=settings.max_body_bytes)
    _add_error_handlers(app)
    require_reader = _reader_check(settings, registry, bearer)
    _add_ingest_route(app, ingest, registry, bearer)
    _add_fleet_routes(app, store, clock, require_reader)
    _add_policy_routes(app, registry, bearer, require_reader, bundles, rollouts)
    _add_rollout_routes(app, registry, bearer, require_reader, rollouts)
    _add_trust_routes(app, registry, bearer, settings, bundles,
                      FreshnessSigner(settings.freshness_gnupg_home, settings.freshness_key,
                                      settings.freshness_hours, clock),
                      HubDeny(settings.root_dir, RootChain(settings.root_dir), bundles, clock))
    _add_health_and_metrics(app, store, hub_metrics, require_reader)
    mount_dashboard(app, settings, store, registry, clock, alert_counts=alert_queue.counts, bundles=bundles,
                    rollouts=rollouts)
    _install_openapi(app)
    return app
