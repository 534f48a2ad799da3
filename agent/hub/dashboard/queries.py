"""Read queries for the dashboard and ``/metrics``: counts grouped in SQL, host lists filtered and paginated in SQL,
so a page costs the same for 50 hosts as for 50,000.

They run over the hub's SQL store (SQLite or PostgreSQL) through ``SqlStore.query`` and its dialect; the tables are
the store's own (``hosts``, ``events``), read only.
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any, Dict, List, Literal, NamedTuple, Optional, Sequence, Tuple

from agent.hub.fleet import PAIRING_KEY_FIELDS, PairingKey, unknown_by_table
from agent.hub.rows import HostRow, StoredEvent
from agent.hub.schema import HOST_COLUMNS, host_from_row
from agent.hub.store import SqlStore
from agent.models import FrozenModel
from agent.wire import CLOCK_SKEW_BOUND_SECONDS

Compliance = Literal["compliant", "violating", "unknown"]
# Query fields that filter on one pairing field; "driver" matches the amdgpu or the nvidia module version.
PAIRING_FILTERS: Dict[str, Tuple[str, ...]] = {
    "os": ("os_id",), "os_version": ("os_version_id",), "kernel": ("kernel_running",),
    "driver": ("amdgpu_loaded", "nvidia_loaded"), "rocm": ("rocm",), "cuda": ("cuda_driver_api",)}


class HostFilter(FrozenModel):
    """What the host list shows: a search over host_id and hostname, compliance, health, staleness, pairing."""

    search: Optional[str] = None
    compliance: Optional[Compliance] = None
    health: Optional[str] = None
    stale: Optional[bool] = None
    os: Optional[str] = None
    os_version: Optional[str] = None
    kernel: Optional[str] = None
    driver: Optional[str] = None
    rocm: Optional[str] = None
    cuda: Optional[str] = None
    offset: int = 0
    limit: int = 50


class HostPage(NamedTuple):
    total: int
    hosts: List[HostRow]


class FleetCounts(FrozenModel):
    """Hosts by compliance, by last health status and by staleness; one grouped query."""

    host_count: int
    compliance: Dict[str, int]
    health: Dict[str, int]
    stale: int
    clock_skewed: int = 0  # hosts whose newest heartbeat's clock skew is beyond agent/wire.py's bound


class PairingGroup(PairingKey):
    """Hosts running one driver/ROCm/CUDA/kernel pairing, with their compliance counts."""

    host_count: int
    compliant_count: int
    violating_count: int


class RollbackCounts(NamedTuple):
    """Hosts by the rollback coverage of their newest heartbeat, and the guarded packages no host can restore."""

    hosts: Dict[str, int]  # complete | incomplete | inexact | unknown -> hosts
    not_restorable: int


def rollback_state(coverage: Optional[Dict[str, Any]]) -> str:
    """complete (every guarded package restorable, exactly), incomplete (some not restorable), inexact (all
    restorable, some only inexactly), unknown (no coverage reported)."""
    if not isinstance(coverage, dict):
        return "unknown"
    if int(coverage.get("restorable") or 0) < int(coverage.get("guarded") or 0):
        return "incomplete"
    return "inexact" if coverage.get("inexact") else "complete"


class EventCount(NamedTuple):
    kind: str
    severity: str
    event_count: int


def compliance_of(compliant: Optional[bool]) -> Compliance:
    return "unknown" if compliant is None else ("compliant" if compliant else "violating")


def _like(text: str) -> str:
    escaped = text.lower().replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%"


def _host_where(store: SqlStore, f: HostFilter, stale_before: dt.datetime) -> Tuple[str, List[Any]]:
    where: List[str] = []
    params: List[Any] = []
    if f.search:
        where.append("(LOWER(host_id) LIKE ? ESCAPE '\\' OR LOWER(hostname) LIKE ? ESCAPE '\\')")
        params += [_like(f.search), _like(f.search)]
    if f.compliance == "unknown":
        where.append("compliant IS NULL")
    elif f.compliance is not None:
        where.append("compliant = ?")
        params.append(f.compliance == "compliant")
    if f.health == "none":
        where.append("last_health_status IS NULL")
    elif f.health:
        where.append("last_health_status = ?")
        params.append(f.health)
    if f.stale is not None:
        where.append("last_seen_at < ?" if f.stale else "last_seen_at >= ?")
        params.append(store.dialect.to_db_time(stale_before))
    for field, columns in PAIRING_FILTERS.items():
        value = getattr(f, field)
        if value:
            where.append("(" + " OR ".join(f"{store.dialect.json_field('pairing', c)} = ?" for c in columns) + ")")
            params += [value] * len(columns)
    return ("WHERE " + " AND ".join(where)) if where else "", params


def host_page(store: SqlStore, f: HostFilter, stale_before: dt.datetime) -> HostPage:
    """One page of hosts matching ``f`` (by host_id), and how many match in all."""
    where, params = _host_where(store, f, stale_before)
    total = store.query("dashboard_hosts", f"SELECT COUNT(*) FROM hosts {where}", params)[0][0]
    rows = store.query("dashboard_hosts", f"SELECT {HOST_COLUMNS} FROM hosts {where} ORDER BY host_id "
                                          "LIMIT ? OFFSET ?", [*params, f.limit, f.offset])
    return HostPage(int(total), [host_from_row(r, store.dialect.from_db_time) for r in rows])


def host(store: SqlStore, host_id: str) -> Optional[HostRow]:
    return store.host(host_id)


def fleet_counts(store: SqlStore, stale_before: dt.datetime) -> FleetCounts:
    rows = store.query(
        "fleet_counts", "SELECT compliant, last_health_status, CASE WHEN last_seen_at < ? THEN 1 ELSE 0 END, "
                        "CASE WHEN ABS(clock_skew_seconds) > ? THEN 1 ELSE 0 END, COUNT(*) FROM hosts "
                        "GROUP BY 1, 2, 3, 4", [store.dialect.to_db_time(stale_before), CLOCK_SKEW_BOUND_SECONDS])
    compliance: Dict[str, int] = {"compliant": 0, "violating": 0, "unknown": 0}
    health: Dict[str, int] = {}
    stale = skewed = total = 0
    for compliant, status, is_stale, is_skewed, count in rows:
        total += count
        compliance[compliance_of(None if compliant is None else bool(compliant))] += count
        health[status or "none"] = health.get(status or "none", 0) + count
        stale += count if is_stale else 0
        skewed += count if is_skewed else 0
    return FleetCounts(host_count=total, compliance=compliance, health=dict(sorted(health.items())), stale=stale,
                       clock_skewed=skewed)


def unknown_version_counts(store: SqlStore) -> Dict[str, int]:
    """Hosts running a version unknown to each of gpuguard's tables (agent/hub/fleet.py unknown_by_table), from the
    unknown_versions the hub stored of each host's newest heartbeat."""
    rows = store.query("unknown_version_counts",
                       "SELECT unknown_versions FROM hosts WHERE unknown_versions IS NOT NULL", [])
    return unknown_by_table([str(item.get("table")) for item in json.loads(text)] for (text,) in rows)


def rollback_counts(store: SqlStore) -> RollbackCounts:
    """The rollback coverage each host's newest heartbeat carried: the one the hub received last (its receipt and
    sequence, as ``hosts`` keeps them; one (host_id, received_at) lookup per host), whatever its own time says."""
    rows = store.query("rollback_counts", "SELECT e.body FROM hosts h LEFT JOIN events e ON e.host_id = h.host_id "
                                          "AND e.received_at = h.heartbeat_received_at "
                                          "AND e.sequence = h.heartbeat_sequence AND e.kind = 'heartbeat'", [])
    hosts = {"complete": 0, "incomplete": 0, "inexact": 0, "unknown": 0}
    missing = 0
    for (body,) in rows:
        coverage = json.loads(body).get("payload", {}).get("rollback_coverage") if body else None
        hosts[rollback_state(coverage)] += 1
        if isinstance(coverage, dict):
            missing += max(0, int(coverage.get("guarded") or 0) - int(coverage.get("restorable") or 0))
    return RollbackCounts(hosts, missing)


def pairing_groups(store: SqlStore) -> Tuple[List[PairingGroup], int]:
    """Hosts per pairing (most common first), with compliance; and how many hosts have no pairing yet."""
    rows = store.query("pairing_groups", "SELECT pairing, compliant, COUNT(*) FROM hosts GROUP BY pairing, compliant")
    groups: Dict[Tuple[Optional[str], ...], Dict[str, int]] = {}
    without = 0
    for pairing, compliant, count in rows:
        if pairing is None:
            without += count
            continue
        fields = json.loads(pairing)
        key = tuple(fields.get(name) for name in PAIRING_KEY_FIELDS)
        group = groups.setdefault(key, {"host_count": 0, "compliant_count": 0, "violating_count": 0})
        group["host_count"] += count
        if compliant is not None:
            group["compliant_count" if compliant else "violating_count"] += count
    out = [PairingGroup(**dict(zip(PAIRING_KEY_FIELDS, key)), **counts) for key, counts in groups.items()]
    out.sort(key=lambda g: (-g.host_count, [getattr(g, n) or "" for n in PAIRING_KEY_FIELDS]))
    return out, without


def event_counts(store: SqlStore, since: dt.datetime, kinds: Sequence[str]) -> List[EventCount]:
    """Events of ``kinds`` the hub received at or after ``since`` (its clock), by kind and severity. Naming the kinds
    lets the (kind, received_at) index skip the heartbeats, which are most of the rows."""
    marks = ", ".join("?" * len(kinds))
    rows = store.query("event_counts", f"SELECT kind, severity, COUNT(*) FROM events WHERE kind IN ({marks}) AND "
                                       "received_at >= ? GROUP BY kind, severity ORDER BY kind, severity",
                       [*kinds, store.dialect.to_db_time(since)])
    return [EventCount(r[0], r[1], int(r[2])) for r in rows]


def host_events(store: SqlStore, host_id: str, kinds: Optional[Sequence[str]], limit: int,
                offset: int = 0) -> List[StoredEvent]:
    """A host's events of ``kinds`` (all kinds when None), the one the hub received last first (its clock; within
    one commit, the higher sequence), whatever time the agent gave them."""
    where, params = "host_id = ?", [host_id]
    if kinds is not None:
        # "kind || ''" keeps the planner off the (kind, received_at) index, which for a common kind (heartbeat)
        # means walking every host's rows; (host_id, received_at) reads only this host's.
        where += f" AND (kind || '') IN ({', '.join('?' * len(kinds))})"
        params += list(kinds)
    rows = store.query("host_events", f"SELECT body, received_at FROM events WHERE {where} "
                                      "ORDER BY received_at DESC, sequence DESC, event_id DESC LIMIT ? OFFSET ?",
                       [*params, limit, offset])
    return [StoredEvent(body=r[0], received_at=store.dialect.from_db_time(r[1])) for r in rows]
