"""The dashboard's staged-rollout HTML (pure): /ui/rollouts (every rollout, newest first) and /ui/rollouts/{id}
(its state and why: waiting, halted naming the failing hosts, paused, aborted; its plan, hosts per stage, and each
host's stage and evidence). Every value goes through ``e()``."""

from __future__ import annotations

import datetime as dt
from typing import Optional, Sequence
from urllib.parse import quote

from agent.hub.dashboard.render import e, host_url, page, when
from agent.hub.judge import JUDGE_ALPHA, JUDGE_MIN_SAMPLE
from agent.hub.rollout_plan import RolloutRow, RolloutStatus

_BADGE = {"running": "ok", "done": "ok", "paused": "warn", "halted": "bad", "aborted": "bad"}


def rollout_url(rollout_id: str) -> str:
    return f"/ui/rollouts/{quote(rollout_id, safe='')}"


def _state(row: RolloutRow) -> str:
    return f'<span class="badge {_BADGE.get(row.state, "")}" id="rollout-state">{e(row.state)}</span>'


def rollouts_page(rows: Sequence[RolloutRow], now: dt.datetime, reader: Optional[str]) -> str:
    """/ui/rollouts: one row per rollout, newest first, with why it stands where it does."""
    body = "".join(
        f'<tr class="rollout" data-rollout-id="{e(r.rollout_id)}"><td><a href="{e(rollout_url(r.rollout_id))}">'
        f"{e(r.rollout_id)}</a></td><td>{_state(r)}</td><td>{e(r.target_serial)}</td><td>{e(r.previous_serial)}</td>"
        f"<td>{e(r.stage)}</td><td>{when(r.created_at, now)} by {e(r.created_by)}</td><td>{e(r.reason)}</td></tr>"
        for r in rows)
    return page("Rollouts", "<h1>Staged rollouts</h1>"
                '<table id="rollouts"><thead><tr><th>Rollout</th><th>State</th><th>Target</th><th>Previous</th>'
                "<th>Stage</th><th>Started</th><th>Why</th></tr></thead><tbody>"
                + (body or '<tr><td colspan="7" class="muted">no rollout yet (gpuguard hub rollout start)</td></tr>')
                + "</tbody></table>", reader, "rollouts")


def rollout_page(status: RolloutStatus, now: dt.datetime, reader: Optional[str]) -> str:
    """/ui/rollouts/{id}: the rollout's state and why, its plan, hosts per stage, and every host's evidence."""
    r, spec = status.rollout, status.rollout.spec
    stages = ", ".join(f"{e(k)}: {v}" for k, v in sorted(status.hosts_by_stage.items()))
    facts = [("State", _state(r)), ("Why", f'<span id="rollout-reason">{e(r.reason)}</span>'),
             ("Target", f"serial {e(r.target_serial)} (previous {e(r.previous_serial)}"
                        + (f", revert {e(spec.revert_serial)}" if spec.revert_serial is not None else "") + ")"),
             ("Stage", f"{e(r.stage)} of {len(spec.batches)}, opened {when(r.stage_started_at, now)}"),
             ("Plan", f"{spec.canaries} canaries per cohort, then {e(', '.join(f'{b}%' for b in spec.batches))}; "
                      f"soak {spec.soak_seconds} s; "
                      + (f"halt when a cohort's admitted hosts fail more than its control (one-sided Fisher, "
                         f"p &lt; {JUDGE_ALPHA:g} shared by the cohorts, {JUDGE_MIN_SAMPLE}+ hosts a group), else "
                         if spec.judge == "control" else "")
                      + f"halt when a canary fails or more than {spec.halt_percent:g}% of a batch; "
                      + (f"a host not passed {spec.report_deadline_seconds} s after admission fails"
                         if spec.report_deadline_seconds else "no report deadline")),
             ("Hosts per stage", stages), ("Started", f"{when(r.created_at, now)} by {e(r.created_by)}")]
    rows = "".join(
        f'<tr class="rollout-host {e(h.evidence.result if h.evidence else "none")}" data-host-id="{e(h.host_id)}">'
        f'<td><a href="{e(host_url(h.host_id))}">{e(h.host_id)}</a></td><td>{e(h.cohort)}</td>'
        f"<td>{'-' if h.stage is None else e(h.stage)}</td><td>{when(h.admitted_at, now) if h.admitted_at else '-'}"
        f"</td><td>{e(h.evidence.result) if h.evidence else '-'}</td><td>{e(h.evidence.detail) if h.evidence else ''}"
        "</td></tr>" for h in status.hosts)
    body = (f"<h1>Rollout {e(r.rollout_id)}</h1><dl>"
            + "".join(f"<dt>{label}</dt><dd>{value}</dd>" for label, value in facts) + "</dl>"
            '<table id="rollout-hosts"><thead><tr><th>Host</th><th>Cohort</th><th>Stage</th><th>Admitted</th>'
            "<th>Result</th><th>Evidence</th></tr></thead><tbody>" + rows + "</tbody></table>")
    return page(f"Rollout {r.rollout_id}", body, reader, "rollouts")
