"""Fleet answers computed from store rows (pure): hosts per pairing, who drifted since when, and how many hosts run
versions unknown to each of gpuguard's compatibility tables."""

from __future__ import annotations

import datetime as dt
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

from agent.hub.rows import DriftRow, HostRow
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
    """Events of one kind on one host in the window."""

    event_count: int
    first_at: dt.datetime
    last_at: dt.datetime


class DriftHost(FrozenModel):
    """A host that drifted, regressed, fell back to CPU, violated policy or rolled back in the window."""

    host_id: str
    hostname: str
    first_at: dt.datetime
    last_at: dt.datetime
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
    """Per-host drift summaries, the host that drifted first first."""
    by_host: Dict[str, List[DriftRow]] = {}
    for row in rows:
        by_host.setdefault(row.host_id, []).append(row)
    out = []
    for host_id, host_rows in by_host.items():
        out.append(DriftHost(
            host_id=host_id, hostname=host_rows[0].hostname,
            first_at=min(r.first_at for r in host_rows), last_at=max(r.last_at for r in host_rows),
            event_count=sum(r.event_count for r in host_rows),
            kinds={r.kind: DriftKindSummary(event_count=r.event_count, first_at=r.first_at, last_at=r.last_at)
                   for r in sorted(host_rows, key=lambda r: r.kind)}))
    out.sort(key=lambda h: (h.first_at, h.host_id))
    return out
