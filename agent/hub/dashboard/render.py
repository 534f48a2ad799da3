"""The dashboard's HTML, rendered from query results (pure functions, no I/O).

Every value that came from an agent (host ids, hostnames, package versions, messages) or from the query string
goes through ``e()`` (``html.escape`` with quotes), in text and in attributes alike; URLs are built with
``urlencode`` and then escaped. No script runs: the plot is inline SVG and the only style is the one inline block
whose hash the Content-Security-Policy names.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import html
import json
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple
from urllib.parse import quote, urlencode

from agent.hub.dashboard.queries import (
    FleetCounts,
    HostFilter,
    HostPage,
    PairingGroup,
    compliance_of,
    rollback_state,
)
from agent.hub.describe import DASH as _DASH
from agent.hub.describe import describe_event
from agent.hub.rows import HostRow, StoredEvent
from agent.printable import printable
from agent.snapshot.pairing import Pairing
from agent.wire import CLOCK_SKEW_BOUND_SECONDS

CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:0;color:#1d2330;background:#f5f6f8}
header{background:#1d2330;color:#fff;padding:8px 16px;display:flex;gap:16px;align-items:center}
header a{color:#cfe0ff;text-decoration:none}header .brand{font-weight:600;color:#fff}
header form{margin-left:auto}main{padding:16px;max-width:1400px}
h1{font-size:20px;margin:0 0 12px}h2{font-size:16px;margin:20px 0 8px}
table{border-collapse:collapse;background:#fff;width:100%}th,td{padding:4px 8px;border-bottom:1px solid #e2e5ea;
text-align:left;vertical-align:top}th{background:#eef0f4;font-weight:600}
.cards{display:flex;gap:12px;flex-wrap:wrap}.card{background:#fff;border:1px solid #e2e5ea;padding:8px 14px;
min-width:110px}.card .n{font-size:22px;font-weight:600;display:block}.card a{color:inherit;text-decoration:none}
.badge{padding:1px 6px;border-radius:3px;font-size:12px;white-space:nowrap}.ok{background:#d7f5dd;color:#135d22}
.bad{background:#fde0e0;color:#8a1111}.unk{background:#eceef2;color:#555}.warn{background:#fff1cc;color:#6b4e00}
form.filters{display:flex;gap:8px;flex-wrap:wrap;margin:12px 0;align-items:end}
form.filters label{display:flex;flex-direction:column;font-size:12px}input,select{font:inherit;padding:2px 4px}
.pager{margin:8px 0;display:flex;gap:12px}.muted{color:#6a7280}code{font-size:12px}
ol.timeline{list-style:none;padding:0}ol.timeline li{background:#fff;border-left:4px solid #8899aa;margin:4px 0;
padding:4px 10px}ol.timeline li.critical{border-color:#c62828}ol.timeline li.warning{border-color:#e0a800}
.login{max-width:420px;margin:60px auto;background:#fff;padding:20px;border:1px solid #e2e5ea}
.login input{width:100%;box-sizing:border-box;margin:8px 0}.error{color:#8a1111}
"""
CSS_HASH = base64.b64encode(hashlib.sha256(CSS.encode()).digest()).decode()
CONTENT_SECURITY_POLICY = (f"default-src 'none'; style-src 'sha256-{CSS_HASH}'; img-src 'self'; "
                           "form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
# busy: the functional checks passed on a GPU another job used (speed not judged), so it counts with pass;
# deferred (nothing ran beside the job) is no failure but stays visible, with skipped.
HEALTH_LEVELS = {"pass": 2, "busy": 2, "regression": 1, "cpu_fallback": 1, "skipped": 1, "deferred": 1, "failed": 0,
                 "timeout": 0}
_STALE = ' <span class="badge bad stale">stale</span>'


def e(value: Any) -> str:
    """Escaped text for HTML text and attribute values; None shows as a dash."""
    return _DASH if value is None else html.escape(printable(str(value)), quote=True)


def when(value: Optional[dt.datetime], now: dt.datetime) -> str:
    """A time as UTC text with its age, in a <time> element."""
    if value is None:
        return _DASH
    seconds = max(0.0, (now - value).total_seconds())
    if seconds < 120:
        age = f"{int(seconds)} s ago"
    elif seconds < 7200:
        age = f"{int(seconds // 60)} min ago"
    elif seconds < 172800:
        age = f"{int(seconds // 3600)} h ago"
    else:
        age = f"{int(seconds // 86400)} d ago"
    text = value.astimezone(dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%SZ")
    return (f'<time datetime="{e(value.isoformat())}" title="{e(age)}">{e(text)}</time> '
            f'<span class="muted">{e(age)}</span>')


def url(path: str, params: Mapping[str, Any]) -> str:
    """``path`` with the non-empty ``params`` as a query string (not yet HTML-escaped)."""
    query = urlencode([(k, str(v)) for k, v in params.items() if v not in (None, "")])
    return f"{path}?{query}" if query else path


def host_url(host_id: str) -> str:
    return f"/ui/hosts/{quote(host_id, safe='')}"


def page(title: str, body: str, reader: Optional[str], active: str = "") -> str:
    nav = ""
    if reader is not None:
        links = "".join(f'<a href="{href}"{" aria-current=page" if name == active else ""}>{label}</a>'
                        for name, href, label in (("fleet", "/ui/", "Fleet"), ("pairings", "/ui/pairings", "Pairings"),
                                                  ("policy", "/ui/policy", "Policy"),
                                                  ("rollouts", "/ui/rollouts", "Rollouts"),
                                                  ("workloads", "/ui/workloads", "Workloads")))
        logout = ('<form method="post" action="/ui/logout"><span class="muted">' + e(reader) +
                  '</span> <button type="submit">Log out</button></form>') if reader else ""
        nav = links + logout
    return ("<!doctype html><html lang=en><head><meta charset=utf-8>"
            f"<title>{e(title)} \u00b7 gpuguard hub</title><style>{CSS}</style></head><body>"
            f'<header><span class="brand">gpuguard hub</span>{nav}</header><main>{body}</main></body></html>')


def login_page(next_path: str, error: Optional[str] = None) -> str:
    problem = f'<p class="error" id="login-error">{e(error)}</p>' if error else ""
    body = ('<div class="login"><h1>Sign in</h1><p>Paste a reader token (<code>gpuguard hub add-reader NAME</code>)'
            f'.</p>{problem}<form method="post" action="/ui/login"><input type="hidden" name="next" '
            f'value="{e(next_path)}"><label>Reader token<input type="password" name="token" id="token" '
            'autocomplete="off" required></label><button type="submit" id="login">Sign in</button></form></div>')
    return page("Sign in", body, None)


def compliance_badge(compliant: Optional[bool]) -> str:
    state = compliance_of(compliant)
    css = {"compliant": "ok", "violating": "bad", "unknown": "unk"}[state]
    return f'<span class="badge {css} compliance">{state}</span>'


def health_badge(status: Optional[str]) -> str:
    if status is None:
        return f'<span class="badge unk">{_DASH}</span>'
    css = {2: "ok", 1: "warn", 0: "bad"}.get(HEALTH_LEVELS.get(status, 1), "warn")
    return f'<span class="badge {css}">{e(status)}</span>'


def rollback_cell(heartbeats: Sequence[Mapping[str, Any]]) -> str:
    """The rollback coverage of the newest heartbeat that carried one (``heartbeats`` newest first as the hub received
    them, ``queries.host_events``; never by the agent's clock): a badge, the count, what is missing."""
    newest = next((hb for hb in heartbeats if isinstance(hb.get("payload", {}).get("rollback_coverage"), dict)),
                  None)
    if newest is None:
        return f'<span class="badge unk" id="rollback-coverage">{_DASH}</span>'
    c = newest["payload"]["rollback_coverage"]
    state = rollback_state(c)
    css = {"complete": "ok", "inexact": "warn", "incomplete": "bad"}.get(state, "unk")
    sources = ", ".join(f"{count} {e(source)}" for source, count in sorted((c.get("by_source") or {}).items()))
    text = (f'<span class="badge {css}" id="rollback-coverage">{e(state)}</span> '
            f'{e(c.get("restorable"))}/{e(c.get("guarded"))} guarded packages restorable'
            + (f" ({sources})" if sources else ""))
    if c.get("not_restorable"):
        text += f'; not restorable: {e(", ".join(str(k) for k in c["not_restorable"][:20]))}'
    if c.get("inexact"):
        text += f'; only inexactly: {e(", ".join(str(k) for k in c["inexact"][:20]))}'
    return text


def driver_of(pairing: Optional[Pairing]) -> str:
    if pairing is None:
        return _DASH
    parts = []
    if pairing.amdgpu_loaded:
        parts.append(f"amdgpu {e(pairing.amdgpu_loaded)}")
    if pairing.rocm:
        parts.append(f"ROCm {e(pairing.rocm)}")
    if pairing.nvidia_loaded:
        parts.append(f"nvidia {e(pairing.nvidia_loaded)}")
    if pairing.cuda_driver_api:
        parts.append(f"CUDA {e(pairing.cuda_driver_api)}")
    return ", ".join(parts) or _DASH


def _card(label: str, count: int, href: str, ident: str) -> str:
    return (f'<div class="card"><a href="{e(href)}"><span class="n" id="{ident}">{count}</span>'
            f"{e(label)}</a></div>")


def _select(name: str, current: Optional[str], options: Sequence[Tuple[str, str]]) -> str:
    opts = "".join(f'<option value="{e(v)}"{" selected" if v == (current or "") else ""}>{e(label)}</option>'
                   for v, label in options)
    return f'<select name="{name}" id="f-{name}">{opts}</select>'


def filter_params(f: HostFilter) -> Dict[str, Any]:
    """The query parameters that reproduce a filter (without the page)."""
    return {"q": f.search, "compliance": f.compliance, "health": f.health,
            "stale": None if f.stale is None else ("yes" if f.stale else "no"), "os": f.os,
            "os_version": f.os_version, "kernel": f.kernel, "driver": f.driver, "rocm": f.rocm, "cuda": f.cuda}


def alerts_line(deliveries: Mapping[Tuple[str, str], int], webhooks: Sequence[str]) -> str:
    """Per webhook, its deliveries by state; dead ones stand out (they need someone to look)."""
    parts = []
    for name in webhooks:
        dead = deliveries.get((name, "dead"), 0)
        parts.append(f'<span class="webhook" data-webhook="{e(name)}">{e(name)}: '
                     f'{deliveries.get((name, "pending"), 0)} pending, {deliveries.get((name, "delivered"), 0)} '
                     f'delivered, <span class="badge {"bad" if dead else "unk"} dead">{dead} dead</span></span>')
    return f'<p id="alert-webhooks">Alert webhooks: {"; ".join(parts)}</p>' if parts else ""


# What each of gpuguard's tables is called on the dashboard (agent/wire.py's UNKNOWN_TABLES).
TABLE_NAMES = {"amd-matrix": "AMD's compatibility matrix", "therock": "the TheRock release table",
               "dcgm-exporter": "the dcgm-exporter table"}


def unknown_versions_line(counts: Mapping[str, int]) -> str:
    """How many hosts run versions newer than each of gpuguard's tables knows (reported, not judged)."""
    parts = [f'<span id="unknown-{e(table)}-count">{count}</span> unknown to {e(TABLE_NAMES.get(table, table))}'
             for table, count in counts.items()]
    return (f'<p id="unknown-versions">Hosts running versions newer than gpuguard\'s tables know: {"; ".join(parts)}'
            "</p>")


def unknown_versions_cell(h: HostRow) -> str:
    """The host's versions newer than a table of gpuguard's knows, each with the table's newest row and date."""
    items = h.unknown_versions or ()
    return ('<span id="unknown-versions">' + "; ".join(
        f'<span class="unknown" data-table="{e(u.table)}">{e(u.component)} {e(u.version)}: newer than '
        f"{e(TABLE_NAMES.get(u.table, u.table))} dated {e(u.dated)} (newest row {e(u.newest)})</span>"
        for u in items) + "</span>") if items else e(None)


def overview_page(counts: FleetCounts, hosts: HostPage, f: HostFilter, groups: Sequence[PairingGroup],
                  without_pairing: int, now: dt.datetime, stale_after_seconds: float, reader: Optional[str],
                  alerts: str = "", policy: str = "", unknown: str = "") -> str:
    c = counts.compliance
    cards = "".join([
        _card("hosts", counts.host_count, "/ui/", "count-hosts"),
        _card("compliant", c["compliant"], "/ui/?compliance=compliant", "count-compliant"),
        _card("violating", c["violating"], "/ui/?compliance=violating", "count-violating"),
        _card("compliance unknown", c["unknown"], "/ui/?compliance=unknown", "count-unknown"),
        _card(f"stale (silent > {stale_after_seconds:g} s)", counts.stale, "/ui/?stale=yes", "count-stale"),
        _card(f"clock off (> {CLOCK_SKEW_BOUND_SECONDS} s from the hub)", counts.clock_skewed, "/ui/",
              "count-clock-skewed"),
        _card("pairings", len(groups), "/ui/pairings", "count-pairings"),
    ])
    health = ", ".join(f'<a href="{e(url("/ui/", {"health": k}))}">{e(k)}</a>: {v}'
                       for k, v in counts.health.items()) or _DASH
    health_options = [("", "any")] + [(k, k) for k in counts.health]
    form = ('<form class="filters" method="get" action="/ui/">'
            f'<label>Search host<input name="q" id="f-q" value="{e(f.search or "")}" placeholder="host id or name">'
            '</label>'
            f'<label>Compliance{_select("compliance", f.compliance, [("", "any"), ("compliant", "compliant"), ("violating", "violating"), ("unknown", "unknown")])}</label>'  # noqa: E501
            f'<label>Health{_select("health", f.health, health_options)}</label>'
            f'<label>Seen{_select("stale", filter_params(f)["stale"], [("", "any"), ("no", "recently"), ("yes", "stale")])}</label>'  # noqa: E501
            + "".join(f'<label>{label}<input name="{name}" id="f-{name}" value="{e(getattr(f, name) or "")}" size="12">'
                      "</label>" for name, label in (("kernel", "Kernel"), ("driver", "Driver"), ("rocm", "ROCm"),
                                                     ("cuda", "CUDA")))
            + '<button type="submit" id="apply">Filter</button> <a href="/ui/">clear</a></form>')
    rows = []
    stale_before = now - dt.timedelta(seconds=stale_after_seconds)
    for h in hosts.hosts:
        stale = h.last_seen_at < stale_before
        kernel = h.pairing.kernel_running if h.pairing else None
        rows.append(
            f'<tr class="host" data-host-id="{e(h.host_id)}"><td><a href="{e(host_url(h.host_id))}">{e(h.host_id)}'
            f"</a></td><td>{e(h.hostname)}</td><td>{compliance_badge(h.compliant)}</td>"
            f"<td>{health_badge(h.last_health_status)}</td><td>{e(kernel)}</td><td>{driver_of(h.pairing)}</td>"
            f"<td>{when(h.last_seen_at, now)}{_STALE if stale else ''}</td></tr>")
    table = ('<table id="hosts"><thead><tr><th>Host</th><th>Hostname</th><th>Compliance</th><th>Health</th>'
             "<th>Kernel</th><th>Driver / runtime</th><th>Last seen</th></tr></thead><tbody>"
             + ("".join(rows) or '<tr><td colspan="7" class="muted">no host matches</td></tr>') + "</tbody></table>")
    shown_from = f.offset + 1 if hosts.hosts else 0
    summary = (f'<p id="match-summary">{hosts.total} matching host{"s" if hosts.total != 1 else ""}; showing '
               f"{shown_from}\u2013{f.offset + len(hosts.hosts)}</p>")
    pairings = "".join(
        f'<tr><td><a href="{e(url("/ui/", pairing_params(g)))}">{pairing_label(g)}</a></td><td>{g.host_count}</td>'
        f"<td>{g.violating_count}</td></tr>" for g in groups[:5])
    top = ("<h2>Most common pairings</h2><table><thead><tr><th>Pairing</th><th>Hosts</th><th>Violating</th></tr>"
           f'</thead><tbody>{pairings}</tbody></table><p><a href="/ui/pairings">all pairings</a>; '
           f"{without_pairing} host(s) without a pairing yet</p>")
    body = (f'<h1>Fleet</h1><div class="cards">{cards}</div><p>Last health: {health}</p>{unknown}{alerts}{form}'
            f"{summary}"
            f"{table}"
            f"{pager('/ui/', filter_params(f), f.offset, f.limit, hosts.total)}{top}{policy}")
    return page("Fleet", body, reader, "fleet")


def pager(path: str, params: Mapping[str, Any], offset: int, limit: int, total: int) -> str:
    links = []
    if offset > 0:
        links.append(f'<a rel="prev" href="{e(url(path, {**params, "page": offset // limit}))}">previous</a>')
    if offset + limit < total:
        links.append(f'<a rel="next" href="{e(url(path, {**params, "page": offset // limit + 2}))}">next</a>')
    pages = max(1, -(-total // limit))
    return f'<div class="pager">page {offset // limit + 1} of {pages} {" ".join(links)}</div>'


def pairing_params(g: PairingGroup) -> Dict[str, Any]:
    return {"os": g.os_id, "os_version": g.os_version_id, "kernel": g.kernel_running,
            "driver": g.amdgpu_loaded or g.nvidia_loaded, "rocm": g.rocm, "cuda": g.cuda_driver_api}


def pairing_label(g: PairingGroup) -> str:
    stack = driver_of(Pairing(amdgpu_loaded=g.amdgpu_loaded, rocm=g.rocm, nvidia_loaded=g.nvidia_loaded,
                              cuda_driver_api=g.cuda_driver_api))
    return f"{e(g.os_id)} {e(g.os_version_id)}, kernel {e(g.kernel_running)}, {stack}"


def pairings_page(groups: Sequence[PairingGroup], without: int, reader: Optional[str]) -> str:
    rows = "".join(
        f'<tr class="pairing"><td>{e(g.os_id)} {e(g.os_version_id)}</td><td>{e(g.kernel_running)}</td>'
        f"<td>{e(g.amdgpu_loaded)}</td><td>{e(g.rocm)}</td><td>{e(g.nvidia_loaded)}</td><td>{e(g.cuda_driver_api)}"
        f'</td><td class="n">{g.host_count}</td><td>{g.compliant_count}</td><td>{g.violating_count}</td>'
        f'<td><a href="{e(url("/ui/", pairing_params(g)))}">hosts</a></td></tr>' for g in groups)
    body = ('<h1>Pairings</h1><p>Which hosts run which driver, ROCm, CUDA and kernel (from each host\'s newest '
            f'snapshot or heartbeat). {without} host(s) have not reported a pairing yet.</p>'
            '<table id="pairings"><thead><tr><th>OS</th><th>Kernel</th><th>amdgpu</th><th>ROCm</th><th>nvidia</th>'
            "<th>CUDA</th><th>Hosts</th><th>Compliant</th><th>Violating</th><th></th></tr></thead>"
            f"<tbody>{rows}</tbody></table>")
    return page("Pairings", body, reader, "pairings")


def describe(event: Mapping[str, Any], e: Callable[[Any], str] = e) -> str:
    """One line saying what an event reports, HTML-escaped (agent/hub/describe.py, with the dashboard's ``e``)."""
    return describe_event(event, e)


def _event_items(stored: Sequence[StoredEvent], css: str) -> Tuple[str, List[Dict[str, Any]]]:
    items = []
    events = []
    for s in stored:
        event = json.loads(s.body)
        events.append(event)
        occurred = e(event.get("occurred_at"))
        items.append(f'<li class="{css} {e(event.get("severity"))}" data-kind="{e(event["payload"].get("kind"))}">'
                     f'<time datetime="{occurred}">{occurred}</time> <span class="badge unk">'
                     f'{e(event.get("severity"))}</span> {describe(event)}</li>')
    return "".join(items), events


def _time_of(event: Mapping[str, Any]) -> Optional[dt.datetime]:
    """An event's occurred_at as an aware datetime (None if it cannot be read: the point is left out)."""
    try:
        value = dt.datetime.fromisoformat(str(event.get("occurred_at")).replace("Z", "+00:00"))
    except ValueError:
        return None
    return value if value.tzinfo is not None else value.replace(tzinfo=dt.timezone.utc)


def health_plot(heartbeats: Sequence[Mapping[str, Any]], regressions: Sequence[Mapping[str, Any]],
                width: int = 900, height: int = 160) -> str:
    """Inline SVG: one point per heartbeat that carried a health status (pass high, regression/fallback middle,
    failed/timeout low), oldest left; health regressions as red ticks on the time axis."""
    points = []
    for hb in heartbeats:
        status = hb.get("payload", {}).get("last_health_status")
        at = _time_of(hb)
        if status is not None and at is not None:
            points.append((at, status))
    points.sort(key=lambda p: p[0])
    left, right, top, bottom = 90, width - 10, 14, height - 24
    levels = {2: top, 1: (top + bottom) // 2, 0: bottom}
    grid = "".join(f'<line x1="{left}" x2="{right}" y1="{y}" y2="{y}" stroke="#e2e5ea"/>'
                   f'<text x="4" y="{y + 4}" font-size="11" fill="#6a7280">{label}</text>'
                   for y, label in ((levels[2], "pass"), (levels[1], "regression"), (levels[0], "failed")))
    if not points:
        return (f'<svg id="health-plot" role="img" aria-label="no health results yet" width="{width}" '
                f'height="{height}" xmlns="http://www.w3.org/2000/svg">{grid}<text x="{left + 10}" '
                f'y="{height // 2}" fill="#6a7280">no health results reported yet</text></svg>')
    t0, t1 = points[0][0], points[-1][0]
    span = max((t1 - t0).total_seconds(), 1.0)

    def x(t: dt.datetime) -> float:
        return round(left + (right - left) * min(max((t - t0).total_seconds() / span, 0.0), 1.0), 1)

    coords = [(x(t), levels[HEALTH_LEVELS.get(status, 1)], t, status) for t, status in points]
    line = " ".join(f"{cx},{cy}" for cx, cy, _, _ in coords)
    colors = {2: "#2e7d32", 1: "#e0a800", 0: "#c62828"}
    dots = "".join(f'<circle class="point" cx="{cx}" cy="{cy}" r="3" '
                   f'fill="{colors[HEALTH_LEVELS.get(status, 1)]}"><title>{e(t.isoformat())}: {e(status)}</title>'
                   "</circle>" for cx, cy, t, status in coords)
    ticks = []
    for r in regressions:
        t = _time_of(r)
        if t is not None and t0 <= t <= t1:
            ticks.append(f'<line class="regression" x1="{x(t)}" x2="{x(t)}" y1="{bottom + 2}" y2="{bottom + 10}" '
                         f'stroke="#c62828" stroke-width="2"><title>{describe(r)}</title></line>')
    axis = (f'<text x="{left}" y="{height - 2}" font-size="11" fill="#6a7280">{e(t0.strftime("%Y-%m-%d %H:%M"))}'
            f'</text><text x="{right}" y="{height - 2}" font-size="11" fill="#6a7280" text-anchor="end">'
            f'{e(t1.strftime("%Y-%m-%d %H:%M"))}</text>')
    return (f'<svg id="health-plot" role="img" aria-label="health status of the last {len(coords)} heartbeats" '
            f'width="{width}" height="{height}" xmlns="http://www.w3.org/2000/svg" data-points="{len(coords)}">'
            f'{grid}<polyline points="{line}" fill="none" stroke="#8899aa"/>{dots}{"".join(ticks)}{axis}</svg>')


def clock_skew_cell(h: HostRow) -> str:
    """The host's clock against the hub's (its newest heartbeat's time less its receipt), flagged beyond the bound."""
    if h.clock_skew_seconds is None:
        return _DASH
    text = e(f"{h.clock_skew_seconds:+.0f} s")
    if not h.clock_skewed:
        return f'<span id="clock-skew">{text}</span>'
    return (f'<span id="clock-skew" class="badge bad">{text}: clock off by more than {CLOCK_SKEW_BOUND_SECONDS} s '
            "from the hub</span>")


def host_page(h: HostRow, now: dt.datetime, stale_after_seconds: float, drift: Sequence[StoredEvent],
              drift_offset: int, drift_limit: int, events: Sequence[StoredEvent], event_kind: Optional[str],
              kinds: Iterable[str], heartbeats: Sequence[StoredEvent], reader: Optional[str],
              policy_facts: Sequence[Tuple[str, str]] = ()) -> str:
    stale = h.last_seen_at < now - dt.timedelta(seconds=stale_after_seconds)
    p = h.pairing or Pairing()
    hb_events = [json.loads(s.body) for s in heartbeats]
    facts = [("Host id", e(h.host_id)), ("Hostname", e(h.hostname)), ("Compliance", compliance_badge(h.compliant)),
             ("Last health", health_badge(h.last_health_status)),
             ("Rollback coverage", rollback_cell(hb_events)),
             ("Agent version", e(h.agent_version)),
             ("Last seen", when(h.last_seen_at, now) + (_STALE if stale else "")),
             ("Last heartbeat", when(h.heartbeat_at, now)), ("Clock skew", clock_skew_cell(h)),
             ("First seen", when(h.first_seen_at, now)),
             ("Pairing reported", when(h.pairing_at, now)), ("Content hash", f"<code>{e(h.content_hash)}</code>"),
             ("Unknown to gpuguard's tables", unknown_versions_cell(h)), *policy_facts]
    facts += [(label, e(getattr(p, name))) for name, label in (
        ("os_id", "OS"), ("os_version_id", "OS version"), ("kernel_running", "Kernel running"),
        ("kernel_next_boot", "Kernel at next boot"), ("amdgpu_loaded", "amdgpu loaded"),
        ("amdgpu_dkms_package", "amdgpu-dkms package"), ("rocm", "ROCm"), ("rocm_core_package", "rocm-core package"),
        ("rocm_releases", "ROCm releases installed"), ("rocm_active_tree", "ROCm active tree"),
        ("nvidia_loaded", "nvidia loaded"),
        ("cuda_driver_api", "CUDA driver API"), ("gpu_count", "GPUs"), ("gpu_models", "GPU models"))]
    snapshot = ('<table id="snapshot">' + "".join(f"<tr><th>{label}</th><td>{value}</td></tr>"
                                                   for label, value in facts) + "</table>")
    drift_items, _ = _event_items(drift, "drift-entry")
    drift_html = (f'<ol class="timeline" id="drift">{drift_items}</ol>' if drift_items
                  else '<p class="muted" id="drift">no drift, regression, fallback, violation or rollback</p>')
    base = host_url(h.host_id)
    drift_pager = []
    if drift_offset > 0:
        drift_pager.append(f'<a href="{e(url(base, {"drift_page": drift_offset // drift_limit, "kind": event_kind}))}">'
                           "newer</a>")
    if len(drift) == drift_limit:
        drift_pager.append(f'<a href="{e(url(base, {"drift_page": drift_offset // drift_limit + 2, "kind": event_kind}))}">'  # noqa: E501
                           "older</a>")
    event_items, _ = _event_items(events, "event")
    kind_options = [("", "all but heartbeats")] + [(k, k) for k in kinds]
    event_form = (f'<form class="filters" method="get" action="{e(base)}"><label>Kind'
                  f'{_select("kind", event_kind, kind_options)}</label><button type="submit">Show</button></form>')
    regressions = [json.loads(s.body) for s in drift if '"health_regression"' in s.body]
    body = (f'<h1>{e(h.host_id)} <span class="muted">{e(h.hostname)}</span></h1>'
            f"<h2>Snapshot</h2>{snapshot}"
            f"<h2>Health trend</h2>{health_plot(hb_events, regressions)}"
            f'<h2>Drift timeline</h2>{drift_html}<div class="pager">{" ".join(drift_pager)}</div>'
            f'<h2>Events</h2>{event_form}<ol class="timeline" id="events">{event_items}</ol>')
    return page(h.host_id, body, reader)


def message_page(title: str, message: str, reader: Optional[str]) -> str:
    return page(title, f'<h1>{e(title)}</h1><p id="message">{e(message)}</p><p><a href="/ui/">fleet</a></p>', reader)
