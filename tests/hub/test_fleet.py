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


def test_drift_hosts_summarise_kinds_and_sort_by_first_drift() -> None:
    """Drift rows sum up per host with its first and last time and kinds, the earliest drift first."""
    at = [T0 + dt.timedelta(hours=h) for h in range(6)]
    rows = [DriftRow(host_id="b", hostname="b.lab", kind="rollback", event_count=1, first_at=at[3], last_at=at[3]),
            DriftRow(host_id="a", hostname="a.lab", kind="snapshot_changed", event_count=2, first_at=at[4],
                     last_at=at[5]),
            DriftRow(host_id="a", hostname="a.lab", kind="cpu_fallback", event_count=1, first_at=at[2],
                     last_at=at[2])]
    [first, second] = drift_hosts(rows)
    assert (first.host_id, first.first_at, first.last_at, first.event_count) == ("a", at[2], at[5], 3)
    assert list(first.kinds) == ["cpu_fallback", "snapshot_changed"]
    assert second.host_id == "b"


def test_no_rows_no_hosts() -> None:
    """No rows give no drift hosts and no pairing counts."""
    assert drift_hosts([]) == [] and pairing_counts([]) == ([], 0)
