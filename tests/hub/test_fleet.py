"""Fleet answers from store rows (pure)."""

from __future__ import annotations

import datetime as dt

from agent.hub.fleet import drift_hosts, pairing_counts
from agent.hub.rows import DriftRow, HostRow
from tests.hub.factories import CUDA_12, ROCM_62, ROCM_63, T0


def host(host_id: str, pairing=None) -> HostRow:
    return HostRow(host_id=host_id, hostname=f"{host_id}.lab", first_seen_at=T0, last_seen_at=T0,
                     last_event_at=T0, last_sequence=1, pairing=pairing)


def test_pairing_counts_group_by_stack_most_common_first() -> None:
    """Hosts are counted per stack (the GPU count aside), the most common first, and hosts without a pairing apart."""
    hosts = [host("a", ROCM_62), host("b", ROCM_63), host("c", ROCM_62),
             host("d", ROCM_62.model_copy(update={"gpu_count": 4})), host("e", CUDA_12), host("f")]
    counts, without = pairing_counts(hosts)
    assert without == 1
    assert [(c.rocm, c.nvidia_loaded, c.host_count, c.host_ids) for c in counts] == [
        ("6.2.0", None, 3, ["a", "c", "d"]),  # gpu_count is not part of the stack
        (None, "550.90.07", 1, ["e"]),
        ("6.3.1", None, 1, ["b"]),
    ]


AHEAD, BEHIND = dt.timedelta(days=1), -dt.timedelta(minutes=10)
SKEW = {"a": AHEAD, "b": BEHIND}


def row(host_id: str, kind: str, count: int, first: dt.datetime, last: dt.datetime) -> DriftRow:
    """A drift row the hub received from ``first`` to ``last``, dated by an agent SKEW[host_id] off."""
    skew = SKEW[host_id]
    return DriftRow(host_id=host_id, hostname=f"{host_id}.lab", kind=kind, event_count=count,
                    first_received_at=first, last_received_at=last, first_occurred_at=first + skew,
                    last_occurred_at=last + skew, clock_skew_seconds=skew.total_seconds())


def test_drift_hosts_summarise_kinds_and_sort_by_first_drift() -> None:
    """Drift rows sum up per host with its first and last time on both clocks, its skew and kinds, the drift the hub
    received first first (host b's clock, behind, dates its drift before host a's)."""
    at = [T0 + dt.timedelta(hours=h) for h in range(6)]
    rows = [row("b", "rollback", 1, at[3], at[3]), row("a", "snapshot_changed", 2, at[4], at[5]),
            row("a", "cpu_fallback", 1, at[2], at[2])]
    [first, second] = drift_hosts(rows)
    assert (first.host_id, first.first_received_at, first.last_received_at, first.event_count) == (
        "a", at[2], at[5], 3)
    assert (first.first_occurred_at, first.last_occurred_at) == (at[2] + AHEAD, at[5] + AHEAD)
    assert (first.clock_skew_seconds, first.clock_skewed) == (AHEAD.total_seconds(), True)
    assert list(first.kinds) == ["cpu_fallback", "snapshot_changed"]
    assert (second.host_id, second.first_occurred_at, second.clock_skewed) == ("b", at[3] + BEHIND, True)


def test_no_rows_no_hosts() -> None:
    """No rows give no drift hosts and no pairing counts."""
    assert drift_hosts([]) == [] and pairing_counts([]) == ([], 0)
