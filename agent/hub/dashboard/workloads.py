"""The dashboard's verified-stack matrix (pure): /ui/workloads, per registered workload the stacks it ran on across
the fleet, with how many hosts and checks passed and failed there (agent/hub/workload_stacks.py). Every value goes
through ``e()``."""

from __future__ import annotations

import datetime as dt
from typing import Optional, Sequence

from agent.hub.dashboard.render import e, page, when
from agent.hub.workload_stacks import StackCell, describe


def _verdict(cell: StackCell) -> str:
    if cell.passes and not cell.failures:
        return '<span class="badge ok">verified</span>'
    if cell.passes:
        return '<span class="badge warn">verified, failed too</span>'
    if cell.failures:
        return '<span class="badge bad">failed only</span>'
    return '<span class="badge">not judged</span>'


def workloads_page(cells: Sequence[StackCell], now: dt.datetime, reader: Optional[str]) -> str:
    """/ui/workloads: one row per workload and stack, by workload; "verified" where a check passed."""
    rows = "".join(
        f'<tr class="workload-stack {"verified" if c.verified else "unverified"}" data-workload="{e(c.workload)}" '
        f'data-stack-id="{e(c.stack_id)}"><td>{e(c.workload)}{" (gates)" if c.gates else ""}</td>'
        f"<td>{e(describe(c.stack))}</td><td>{e(c.stack.gpu_models)}</td><td>{_verdict(c)}</td>"
        f'<td class="n">{c.hosts_passed}</td><td class="n">{c.hosts_failed}</td><td class="n">{c.passes}</td>'
        f'<td class="n">{c.failures}</td><td>{when(c.last_checked_at, now)}</td></tr>' for c in cells)
    return page("Workloads", "<h1>Verified stacks</h1><p>Per registered workload, the stacks its checks ran on "
                "across the fleet (a check counts once). A stack is verified for a workload where a check passed."
                '</p><table id="workload-stacks"><thead><tr><th>Workload</th><th>Stack</th><th>GPUs</th>'
                "<th>Verdict</th><th>Hosts passed</th><th>Hosts failed</th><th>Checks passed</th>"
                "<th>Checks failed</th><th>Last check</th></tr></thead><tbody>"
                + (rows or '<tr><td colspan="9" class="muted">no workload reported yet ([[health.workloads]])'
                   "</td></tr>") + "</tbody></table>", reader, "workloads")
