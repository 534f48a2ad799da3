"""The hub's web dashboard under ``/ui/``: server-rendered HTML, no script, no external resource.

    /ui/                 fleet overview: counts, host list with search and filters (query parameters), paginated
    /ui/hosts/{host_id}  one host: snapshot, health trend (inline SVG), drift timeline, events
    /ui/pairings         hosts per driver/ROCm/CUDA/kernel pairing
    /ui/policy           policy bundles, hosts on an older serial, hosts that refused a bundle and why, the audit
    /ui/rollouts         staged rollouts; /ui/rollouts/{id}: state and why (a halt names the hosts), hosts' evidence
    /ui/workloads        the verified-stack matrix: per registered workload, the stacks it passed and failed on
    /ui/login, /ui/logout

Access needs a reader token, like the fleet API: either ``Authorization: Bearer`` on every request, or once at
``/ui/login``, which sets a signed session cookie (session.py). Without it every page redirects to the login form
and shows no fleet data. ``fleet_api_requires_token = false`` opens the dashboard like the API.

    queries.py  counts and paginated host lists in SQL
    render.py   HTML from query results (pure)
    policy.py   the policy section, page and host rows (pure)
    rollouts.py the staged-rollout pages (pure)
    workloads.py the verified-stack matrix page (pure)
    session.py  the session cookie
"""

from __future__ import annotations

import datetime as dt
from typing import Annotated, Callable, Mapping, Optional, Sequence, Tuple
from urllib.parse import parse_qs, quote

from fastapi import FastAPI, Query, Request
from starlette.concurrency import run_in_threadpool
from starlette.responses import HTMLResponse, RedirectResponse, Response

from agent.errors import StoreError
from agent.hub.bundles import PolicyBundles
from agent.hub.dashboard import policy, queries, render
from agent.hub.dashboard import rollouts as rollout_pages
from agent.hub.dashboard import workloads as workload_pages
from agent.hub.dashboard.session import COOKIE_NAME, SessionSigner
from agent.hub.rollouts import Rollouts
from agent.hub.rows import DRIFT_KINDS
from agent.hub.settings import HubSettings
from agent.hub.store import SqlStore
from agent.hub.tokens import TokenRegistry
from agent.hub.workload_stacks import matrix
from agent.log import get_logger
from agent.report.events import PAYLOAD_KINDS

log = get_logger("hub.dashboard")

HOSTS_PER_PAGE = 50
DRIFT_PER_PAGE = 50
EVENTS_SHOWN = 50
HEARTBEATS_PLOTTED = 200
AUDIT_SHOWN = 100
# The timeline: everything in the fleet API's drift kinds, plus what the guard refused.
TIMELINE_KINDS = (*DRIFT_KINDS, "transaction_blocked", "override_used")
# One alias for every text filter: FastAPI copies the Query per parameter (one shared Query() default would not).
_Text = Annotated[Optional[str], Query(max_length=200)]
_HEADERS = {"Content-Security-Policy": render.CONTENT_SECURITY_POLICY, "X-Content-Type-Options": "nosniff",
            "Referrer-Policy": "no-referrer", "Cache-Control": "no-store", "X-Frame-Options": "DENY"}


class _BadQuery(Exception):
    """A query the page cannot answer: its message is shown, with ``status``."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


def _html(body: str, status: int = 200) -> HTMLResponse:
    return HTMLResponse(body, status_code=status, headers=_HEADERS)


def _choice(name: str, value: Optional[str], allowed: Sequence[str]) -> Optional[str]:
    if value in (None, ""):
        return None
    if value not in allowed:
        raise _BadQuery(f"{name}: must be one of {', '.join(allowed)}")
    return value


def _safe_next(value: Optional[str]) -> str:
    """Where to go after login: a dashboard path only (never another site)."""
    if value and value.startswith("/ui/") and not value.startswith("//") and "\\" not in value:
        return value
    return "/ui/"


def _over_https(request: Request) -> bool:
    """Whether the browser reached the hub over https: directly, or through a TLS-terminating proxy that says so
    (a client forging the header only marks its own cookie Secure)."""
    return request.url.scheme == "https" or request.headers.get("x-forwarded-proto", "").lower() == "https"


def mount_dashboard(app: FastAPI, settings: HubSettings, store: SqlStore, registry: TokenRegistry,
                    clock: Callable[[], dt.datetime],
                    alert_counts: Optional[Callable[[], Mapping[Tuple[str, str], int]]] = None,
                    bundles: Optional[PolicyBundles] = None, rollouts: Optional[Rollouts] = None) -> None:
    """Add the dashboard's routes to ``app`` (not in the OpenAPI spec: they answer HTML); ``alert_counts`` gives
    the alert deliveries by (webhook, state) for the overview; ``bundles`` the policy bundles and their rollout;
    ``rollouts`` the staged rollouts."""
    signer = SessionSigner(store, settings.dashboard_session_seconds)
    stale_after = settings.stale_after_seconds

    def reader_of(request: Request) -> Optional[str]:
        """The reader's name; "" when the fleet API is open; None when the request is not allowed."""
        if not settings.fleet_api_requires_token:
            return ""
        authorization = request.headers.get("authorization")
        if authorization:
            principal = registry.authenticate(authorization)
            return principal.subject if principal is not None and principal.can_read else None
        return signer.reader_of(request.cookies.get(COOKIE_NAME))

    def to_login(request: Request) -> Response:
        target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        return RedirectResponse(f"/ui/login?next={quote(target, safe='')}", status_code=303, headers=_HEADERS)

    def guarded(request: Request, build: Callable[[str], str]) -> Response:
        reader: Optional[str] = None
        try:
            reader = reader_of(request)
            if reader is None:
                return to_login(request)
            return _html(build(reader))
        except _BadQuery as exc:
            title = "Not found" if exc.status == 404 else "Bad request"
            return _html(render.message_page(title, str(exc), reader), exc.status)
        except StoreError as exc:
            return _html(render.message_page("Database unavailable", f"storage unavailable: {exc.reason}",
                                             reader), 503)

    @app.get("/ui", include_in_schema=False)
    def ui_root() -> Response:
        return RedirectResponse("/ui/", status_code=308)

    @app.get("/ui/", include_in_schema=False)
    def overview(request: Request, q: _Text = None, compliance: _Text = None,
                 health: _Text = None, stale: _Text = None, os: _Text = None,
                 os_version: _Text = None, kernel: _Text = None, driver: _Text = None,
                 rocm: _Text = None, cuda: _Text = None,
                 page: int = Query(1, ge=1, le=1_000_000)) -> Response:
        def build(reader: str) -> str:
            stale_choice = _choice("stale", stale, ("yes", "no"))
            f = queries.HostFilter(
                search=q or None, compliance=_choice("compliance", compliance, ("compliant", "violating", "unknown")),
                health=health or None, stale=None if stale_choice is None else stale_choice == "yes", os=os or None,
                os_version=os_version or None, kernel=kernel or None, driver=driver or None, rocm=rocm or None,
                cuda=cuda or None, offset=(page - 1) * HOSTS_PER_PAGE, limit=HOSTS_PER_PAGE)
            now = clock()
            stale_before = now - dt.timedelta(seconds=stale_after)
            counts = queries.fleet_counts(store, stale_before)
            hosts = queries.host_page(store, f, stale_before)
            groups, without = queries.pairing_groups(store)
            webhooks = [w.name for w in settings.alert_webhooks]
            alerts = render.alerts_line(alert_counts(), webhooks) if alert_counts is not None and webhooks else ""
            section = policy.policy_section(bundles.rollout()) if bundles is not None else ""
            unknown = render.unknown_versions_line(queries.unknown_version_counts(store))
            return render.overview_page(counts, hosts, f, groups, without, now, stale_after, reader, alerts, section,
                                        unknown)

        return guarded(request, build)

    @app.get("/ui/pairings", include_in_schema=False)
    def pairings(request: Request) -> Response:
        def build(reader: str) -> str:
            groups, without = queries.pairing_groups(store)
            return render.pairings_page(groups, without, reader)

        return guarded(request, build)

    @app.get("/ui/policy", include_in_schema=False)
    def policy_overview(request: Request) -> Response:
        def build(reader: str) -> str:
            if bundles is None:
                raise _BadQuery("this hub keeps no policy bundles", 404)
            return policy.policy_page(bundles.rollout(), bundles.summaries(), bundles.audit(AUDIT_SHOWN), clock(),
                                      reader)

        return guarded(request, build)

    @app.get("/ui/rollouts", include_in_schema=False)
    def rollouts_overview(request: Request) -> Response:
        def build(reader: str) -> str:
            if rollouts is None:
                raise _BadQuery("this hub runs no rollouts", 404)
            return rollout_pages.rollouts_page(rollouts.rows(), clock(), reader)

        return guarded(request, build)

    @app.get("/ui/rollouts/{rollout_id}", include_in_schema=False)
    def rollout_detail(request: Request, rollout_id: str) -> Response:
        def build(reader: str) -> str:
            if rollouts is None or not any(r.rollout_id == rollout_id for r in rollouts.rows()):
                raise _BadQuery(f"no rollout {rollout_id!r}", 404)
            return rollout_pages.rollout_page(rollouts.status(rollout_id), clock(), reader)

        return guarded(request, build)

    @app.get("/ui/workloads", include_in_schema=False)
    def workloads_overview(request: Request) -> Response:
        def build(reader: str) -> str:
            return workload_pages.workloads_page(matrix(store), clock(), reader)

        return guarded(request, build)

    @app.get("/ui/hosts/{host_id:path}", include_in_schema=False)
    def host(request: Request, host_id: str, kind: _Text = None,
             drift_page: int = Query(1, ge=1, le=1_000_000)) -> Response:
        def build(reader: str) -> str:
            event_kind = _choice("kind", kind, PAYLOAD_KINDS)
            state = queries.host(store, host_id)
            if state is None:
                raise _BadQuery(f"no host {host_id!r} has reported to this hub", 404)
            offset = (drift_page - 1) * DRIFT_PER_PAGE
            drift = queries.host_events(store, host_id, TIMELINE_KINDS, DRIFT_PER_PAGE, offset)
            shown_kinds = [event_kind] if event_kind else [k for k in PAYLOAD_KINDS if k != "heartbeat"]
            events = queries.host_events(store, host_id, shown_kinds, EVENTS_SHOWN)
            heartbeats = queries.host_events(store, host_id, ["heartbeat"], HEARTBEATS_PLOTTED)
            facts = policy.host_policy_facts(bundles.host_policy(state)) if bundles is not None else []
            return render.host_page(state, clock(), stale_after, drift, offset, DRIFT_PER_PAGE, events, event_kind,
                                    PAYLOAD_KINDS, heartbeats, reader, facts)

        return guarded(request, build)

    @app.get("/ui/login", include_in_schema=False)
    def login_form(request: Request, next: Optional[str] = Query(None, max_length=2000)) -> Response:  # noqa: A002
        if reader_of(request) is not None:
            return RedirectResponse(_safe_next(next), status_code=303, headers=_HEADERS)
        return _html(render.login_page(_safe_next(next)))

    @app.post("/ui/login", include_in_schema=False)
    async def login(request: Request) -> Response:
        try:
            form = parse_qs((await request.body()).decode("utf-8", "replace"), max_num_fields=10)
        except ValueError:  # more fields than a login form has
            return _html(render.login_page("/ui/", "unexpected form fields"), 400)
        token = (form.get("token") or [""])[0].strip()
        next_path = _safe_next((form.get("next") or [""])[0])
        principal = registry.authenticate_token(token)
        if principal is None or not principal.can_read:
            problem = "a host token cannot open the dashboard; use a reader token" if principal is not None \
                else "invalid reader token"
            log.info("hub_dashboard_login_refused", reason=problem, client=request.client.host if request.client
                     else None)
            return _html(render.login_page(next_path, problem), 401)
        try:
            cookie = await run_in_threadpool(signer.issue, principal.subject)
        except StoreError as exc:
            return _html(render.message_page("Database unavailable", f"storage unavailable: {exc.reason}", None), 503)
        log.info("hub_dashboard_login", reader=principal.subject)
        response = RedirectResponse(next_path, status_code=303, headers=_HEADERS)
        response.set_cookie(COOKIE_NAME, cookie, max_age=int(settings.dashboard_session_seconds), path="/ui/",
                            httponly=True, samesite="strict", secure=_over_https(request))
        return response

    @app.post("/ui/logout", include_in_schema=False)
    def logout() -> Response:
        response = RedirectResponse("/ui/login", status_code=303, headers=_HEADERS)
        response.delete_cookie(COOKIE_NAME, path="/ui/", httponly=True, samesite="strict")
        return response
