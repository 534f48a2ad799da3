"""Fleet answers computed from store rows (pure): hosts per pairing, who drifted since when, and how many hosts run
versions unknown to each of gpuguard's compatibility tables."""

from __future__ import annotations

import datetime as dt
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

from agent.hub.rows import DriftRow, HostRow, skew_beyond_bound
from agent.models import FrozenModel
from agent.wire import UNKNOWN_TABLES


class PairingKey(FrozenModel):
    """The pairing fields that make two hosts "run the same stack" for the fleet view and the dashboard."""

    os_id: Optional[str] = None
    os_version_id: Optional[str] = None
    kernel_running: Optional[str] = None
    amdgpu_loaded: Optional[str] = None
    rocm: Optional[str] = None
    nvidia_loaded: Optional[str] = None
    cuda_driver_api: Optional[str] = None


PAIRING_KEY_FIELDS = tuple(PairingKey.model_fields)


class PairingCount(PairingKey):
    """How many hosts run one driver/ROCm/CUDA/kernel pairing, and which."""

    host_count: int
    host_ids: List[str]


class DriftKindSummary(FrozenModel):
    """Events of one kind on one host in the window: received first and last (the hub's clock), and the times the
    agent gave them (its own clock, as data)."""

    event_count: int
    first_received_at: dt.datetime
    last_received_at: dt.datetime
    first_occurred_at: dt.datetime
    last_occurred_at: dt.datetime


class DriftHost(FrozenModel):
    """A host that drifted, regressed, fell back to CPU, violated policy or rolled back in the window (received by
    the hub in it), with its clock skew (``HostRow.clock_skew_seconds``: its agent times less the hub's)."""

    host_id: str
    hostname: str
    first_received_at: dt.datetime
    last_received_at: dt.datetime
    first_occurred_at: dt.datetime
    last_occurred_at: dt.datetime
    clock_skew_seconds: Optional[float] = None
    clock_skewed: bool = False
    event_count: int
    kinds: Dict[str, DriftKindSummary]


def unknown_by_table(tables_per_host: Iterable[Iterable[str]]) -> Dict[str, int]:
    """Hosts running a version unknown to each table (agent/wire.py's UNKNOWN_TABLES, 0 included), from each host's
    newest heartbeat's unknown_versions tables: a host counts once per table however many versions it reports."""
    counts = dict.fromkeys(UNKNOWN_TABLES, 0)
    for tables in tables_per_host:
        for table in set(tables) & set(UNKNOWN_TABLES):
            counts[table] += 1
    return counts


def _sort_text(value: Optional[str]) -> Tuple[int, str]:
    return (1, "") if value is None else (0, value)


def pairing_counts(hosts: Sequence[HostRow]) -> Tuple[List[PairingCount], int]:
    """Hosts grouped by pairing, most common first; and how many hosts have not reported a pairing yet."""
    groups: Dict[Tuple[Optional[str], ...], List[str]] = {}
    without = 0
    for host in hosts:
        if host.pairing is None:
            without += 1
            continue
        key = tuple(getattr(host.pairing, name) for name in PAIRING_KEY_FIELDS)
        groups.setdefault(key, []).append(host.host_id)
    counts = [PairingCount(**dict(zip(PAIRING_KEY_FIELDS, key)), host_count=len(ids), host_ids=sorted(ids))
              for key, ids in groups.items()]
    counts.sort(key=lambda c: (-c.host_count, [_sort_text(getattr(c, n)) for n in PAIRING_KEY_FIELDS]))
    return counts, without


def drift_hosts(rows: Sequence[DriftRow]) -> List[DriftHost]:
    """Per-host drift summaries, the host whose drift the hub received first first (never by the agent's clock)."""
    by_host: Dict[str, List[DriftRow]] = {}
    for row in rows:
        by_host.setdefault(row.host_id, []).append(row)
    out = []
    for host_id, host_rows in by_host.items():
        out.append(DriftHost(
            host_id=host_id, hostname=host_rows[0].hostname,
            first_received_at=min(r.first_received_at for r in host_rows),
            last_received_at=max(r.last_received_at for r in host_rows),
            first_occurred_at=min(r.first_occurred_at for r in host_rows),
            last_occurred_at=max(r.last_occurred_at for r in host_rows),
            clock_skew_seconds=host_rows[0].clock_skew_seconds,
            clock_skewed=skew_beyond_bound(host_rows[0].clock_skew_seconds),
            event_count=sum(r.event_count for r in host_rows),
            kinds={r.kind: DriftKindSummary(event_count=r.event_count, first_received_at=r.first_received_at,
                                            last_received_at=r.last_received_at,
                                            first_occurred_at=r.first_occurred_at,
                                            last_occurred_at=r.last_occurred_at)
                   for r in sorted(host_rows, key=lambda r: r.kind)}))
    out.sort(key=lambda h: (h.first_received_at, h.host_id))
    return out
