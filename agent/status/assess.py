"""Judge gathered facts: one Check per area, an overall verdict and its exit code. Pure: no I/O, no clock.

Exit codes (``STATUS_EXIT_CODES``): 0 ok; 30 attention (something is stale, undelivered, unreachable or
unknown-but-expected, a stored health baseline beyond what the GPUs can do, a health rollback within the last
snapshot interval, a guarded package a rollback cannot
restore exactly, a maintenance hold still draining, a change that left the package database inconsistent and was
not rolled back); 31 failing (the daemon is not running, the host is not
compliant, the last health check failed, a state file is damaged, the last rollback failed, a maintenance hold
kept after a failed post-change check).
gpuguard's errors keep theirs (a broken agent.toml: 3).
"""

from __future__ import annotations

import datetime as dt
from typing import Dict, List, Literal, Optional

from agent.models import FrozenModel
from agent.status.facts import ChangeFacts, StatusFacts
from agent.wire import CLOCK_SKEW_BOUND_SECONDS, FAILED_HEALTH_STATUSES

CheckState = Literal["ok", "info", "warn", "fail"]
Verdict = Literal["ok", "attention", "failing"]
STATUS_EXIT_CODES: Dict[str, int] = {"ok": 0, "attention": 30, "failing": 31}
# No verdict on the stack: nothing to judge (skipped) or nothing could run beside another job yet (deferred).
# busy (functional checks passed on a GPU another job used) is ok.
UNJUDGED_HEALTH = ("skipped", "deferred")
# The guard event of a change that left the package database inconsistent (agent.report.events.DependenciesBroken).
DEPENDENCIES_BROKEN_KIND = "dependencies_broken"
CHANGE_NAMES = {"health_rollback": "health rollback", "rollback": "rollback", "transaction_blocked": "blocked"}
# Package moves a change shows; the rest are counted.
MOVES_SHOWN = 3
# A maintenance hold's phase as a check (agent/wire.py MAINTENANCE_PHASES); held is "info".
MAINTENANCE_STATES: Dict[str, CheckState] = {"kept": "fail", "draining": "warn", "rebooting": "warn"}
# Undelivered events are worth attention after this long, or after 10 delivery intervals if that is longer.
OUTBOX_STUCK_SECONDS = 600.0


class Check(FrozenModel):
    """One area's state and a one-line summary."""

    name: str
    state: CheckState
    summary: str


class Assessment(FrozenModel):
    """Every check and the verdict they add up to."""

    verdict: Verdict
    exit_code: int
    checks: List[Check]


def _age(now: dt.datetime, then: dt.datetime) -> str:
    seconds = max(0.0, (now - then).total_seconds())
    if seconds < 120:
        return f"{seconds:.0f} s ago"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min ago"
    if seconds < 172800:
        return f"{seconds / 3600:.1f} h ago"
    return f"{seconds / 86400:.1f} days ago"


def _daemon(f: StatusFacts) -> Check:
    d = f.daemon
    if d.systemd_state is not None and d.systemd_state != "active":
        return Check(name="daemon", state="fail", summary=f"gpuguard.service is {d.systemd_state}")
    if d.pids:
        return Check(name="daemon", state="ok", summary=f"running (pid {', '.join(str(p) for p in d.pids)})")
    if d.systemd_state == "active":
        return Check(name="daemon", state="ok", summary="gpuguard.service is active")
    return Check(name="daemon", state="fail", summary="not running (no `gpuguard run` process)")


def snapshot_stale(f: StatusFacts, now: dt.datetime) -> bool:
    """True when the last snapshot is older than three intervals and a minute: the daemon is not doing its work."""
    taken = f.snapshot.taken_at
    return taken is not None and (now - taken).total_seconds() > 3 * f.snapshot_interval_seconds + 60


def _snapshot(f: StatusFacts, now: dt.datetime) -> Check:
    s = f.snapshot
    if s.problem is not None:
        return Check(name="snapshot", state="fail", summary=s.problem)
    if s.taken_at is None:
        return Check(name="snapshot", state="warn", summary="no snapshot yet")
    summary = f"taken {_age(now, s.taken_at)}, {s.critical_findings} critical / {s.warning_findings} warning findings"
    if s.unknown_to_table:  # info: newer than gpuguard's tables know, reported and not judged
        summary += "; " + "; ".join(s.unknown_to_table)
    if snapshot_stale(f, now):
        return Check(name="snapshot", state="warn", summary=f"stale: {summary}")
    return Check(name="snapshot", state="warn" if s.critical_findings else "ok", summary=summary)


def _compliance(f: StatusFacts) -> Check:
    m = f.metrics
    if m.problem is not None:
        return Check(name="compliance", state="warn", summary=m.problem)
    if m.compliant is None:
        return Check(name="compliance", state="info", summary="unknown (no policy, or not evaluated yet)")
    if m.compliant:
        return Check(name="compliance", state="ok", summary="compliant with the pairing policy")
    return Check(name="compliance", state="fail", summary="NOT compliant with the pairing policy "
                                                          "(gpuguard policy explain)")


def _health(f: StatusFacts, now: dt.datetime) -> Check:
    check = _health_result(f, now)
    extra = [line for line in (f.health.deferral, f.health.gate) if line is not None]
    if f.health.gate_problem is not None:
        extra.append(f.health.gate_problem)
        if check.state in ("ok", "info"):  # the gate cannot follow changes until the file is deleted
            check = check.model_copy(update={"state": "warn"})
    if extra:
        check = check.model_copy(update={"summary": "; ".join([check.summary, *extra])})
    suspicious = f.health.suspicious_baseline
    if suspicious:
        # A baseline beyond what the GPUs can do was captured: no regression is called against it, and only the
        # operator can clear it.
        state: CheckState = "fail" if check.state == "fail" else "warn"
        check = Check(name="health", state=state, summary=f"{check.summary}; SUSPICIOUS baseline, not used: "
                      f"{suspicious[0]}" + (f" (+{len(suspicious) - 1} more)" if len(suspicious) > 1 else "")
                      + " (gpuguard health baseline show|reset)")
    return check


def _health_result(f: StatusFacts, now: dt.datetime) -> Check:
    h = f.health
    if h.problem is not None:
        return Check(name="health", state="fail", summary=h.problem)
    if h.status is None or h.finished_at is None:
        return Check(name="health", state="info", summary="no health check yet")
    summary = f"{h.status} {_age(now, h.finished_at)}" + (f": {h.summary}" if h.summary else "")
    if h.status in FAILED_HEALTH_STATUSES:
        return Check(name="health", state="fail", summary=summary)
    if f.health_enabled and (now - h.finished_at).total_seconds() > 2 * f.health_interval_seconds:
        return Check(name="health", state="warn", summary=f"stale: {summary}")
    return Check(name="health", state="info" if h.status in UNJUDGED_HEALTH else "ok", summary=summary)


def describe_change(c: ChangeFacts, now: dt.datetime) -> str:
    """``last change: health rollback 15 s ago (the health check found cpu_fallback: cuda-cudart 13.1 -> 13.0)``."""
    when = _age(now, c.at) if c.at is not None else "at an unknown time"
    failed = " FAILED" if c.succeeded is False and c.kind != "transaction_blocked" else ""
    moves = ", ".join(c.moves[:MOVES_SHOWN]) + (f" (+{len(c.moves) - MOVES_SHOWN} more)"
                                                 if len(c.moves) > MOVES_SHOWN else "")
    detail = ": ".join(part for part in (c.reason, moves) if part)
    return f"last change: {CHANGE_NAMES[c.kind]}{failed} {when}" + (f" ({detail})" if detail else "")


def _guard(f: StatusFacts, now: dt.datetime) -> Check:
    g = f.guard
    change = g.last_change
    if g.problem is not None:
        return Check(name="guard", state="warn", summary=g.problem + (
            f"; {describe_change(change, now)}" if change is not None else ""))
    if change is not None:
        summary = describe_change(change, now)
    elif g.last_kind is None:
        summary = "no guard events recorded"
    else:
        when = _age(now, g.last_at) if g.last_at is not None else "at an unknown time"
        summary = f"last: {g.last_kind} {when}" + (f" ({g.last_message})" if g.last_message else "")
    if g.reboot_required is not None:
        summary += f"; reboot needed: kernel module packages changed ({', '.join(g.reboot_required[:5])})"
    failed_rollback = (change.kind != "transaction_blocked" and change.succeeded is False if change is not None
                       else g.last_kind == "rollback" and g.last_succeeded is False)
    if failed_rollback:
        return Check(name="guard", state="fail", summary=summary)
    # A health rollback since the last snapshot: the stack was just found broken and put back; look at it.
    recent_health_rollback = (change is not None and change.kind == "health_rollback" and change.at is not None
                              and (now - change.at).total_seconds() <= f.snapshot_interval_seconds)
    # The last guard event says a change left the package database inconsistent and nothing put it back (a
    # rollback would be the newer event): not recorded as known-good, worth an operator's look.
    dependencies_broken = g.last_kind == DEPENDENCIES_BROKEN_KIND
    if dependencies_broken:
        summary = f"package dependencies broken, not recorded as known-good: {g.last_message}; " + summary
    attention = g.reboot_required is not None or recent_health_rollback or dependencies_broken
    return Check(name="guard", state="warn" if attention else "ok", summary=summary)


def _rollback(f: StatusFacts) -> Check:
    """Whether every guarded package of the known-good set can be restored, exactly (rollback-coverage.json)."""
    r = f.rollback
    if r.summary is None:
        return Check(name="rollback", state="info", summary="no known-good set recorded yet")
    if r.attention:
        return Check(name="rollback", state="warn", summary=f"{r.summary}; " + "; ".join(r.attention))
    return Check(name="rollback", state="ok", summary=r.summary)


def _outbox(f: StatusFacts, now: dt.datetime) -> Check:
    o = f.outbox
    if o.problem is not None:
        return Check(name="outbox", state="fail", summary=o.problem)
    delivered = f.metrics.last_delivery_success_at
    last = f", last delivery {_age(now, delivered)}" if delivered is not None else ""
    dropped = f", {o.dropped_total} dropped by the size bound" if o.dropped_total else ""
    if o.depth == 0:
        return Check(name="outbox", state="warn" if o.dropped_total else "ok", summary=f"empty{last}{dropped}")
    oldest = o.oldest_enqueued_at
    summary = (f"{o.depth} event(s) waiting" + (f", oldest enqueued {_age(now, oldest)}" if oldest else "")
               + last + dropped)
    stuck_after = max(OUTBOX_STUCK_SECONDS, 10 * f.delivery_interval_seconds)
    stuck = oldest is not None and (now - oldest).total_seconds() > stuck_after
    return Check(name="outbox", state="warn" if stuck or o.dropped_total else "ok", summary=summary)


def _hub(f: StatusFacts) -> Check:
    h = f.hub
    if h.endpoint_url is None:
        return Check(name="hub", state="info", summary="no endpoint_url configured: events stay in the outbox")
    if not h.checked:
        return Check(name="hub", state="info", summary=f"{h.endpoint_url}: not checked (--offline)")
    if h.error is not None:
        return Check(name="hub", state="warn", summary=f"{h.endpoint_url}: unreachable: {h.error}")
    ok = h.status_code is not None and h.status_code < 500
    summary = f"{h.endpoint_url}: HTTP {h.status_code} in {h.latency_ms:.0f} ms"
    offset = h.clock_offset_seconds
    if offset is not None and abs(offset) > CLOCK_SKEW_BOUND_SECONDS:
        # the hub judges on its own clock, but this host's logs, events and checks carry this one: fix NTP
        return Check(name="hub", state="warn", summary=f"{summary}; clock off by {offset:+.0f} s from the hub "
                                                       f"(more than {CLOCK_SKEW_BOUND_SECONDS} s): check NTP")
    return Check(name="hub", state="ok" if ok else "warn", summary=summary)


def _policy(f: StatusFacts, at: dt.datetime) -> Check:
    p = f.policy
    if p.problem is not None:
        return Check(name="policy", state="warn", summary=p.problem)
    summary = p.description
    if p.bundle_expires is not None and at >= p.bundle_expires:
        # Still enforced (an expired bundle never un-guards a host), but the signers' word has run out.
        return Check(name="policy", state="warn",
                     summary=f"{summary}; expired at {p.bundle_expires:%Y-%m-%dT%H:%M:%SZ}: still enforced, a new "
                             f"bundle is needed")
    if p.stale is not None:
        return Check(name="policy", state="warn", summary=f"{summary}; {p.stale}: still enforced")
    if p.denied_installed:
        return Check(name="policy", state="warn",
                     summary=f"{summary}; known-bad version installed (deny list serial {p.deny_serial}): "
                             + "; ".join(p.denied_installed[:5]))
    if p.source == "local" and p.bundle_serial is not None:
        summary += f" (bundle serial {p.bundle_serial} installed, not in force: [guard] policy_source is local)"
    if p.tables is not None:
        summary += f"; {p.tables}"
    if p.rollout is not None:
        summary += f"; {p.rollout}"
    if p.refusal_pending:
        serial = f"serial {p.refused_serial}" if p.refused_serial is not None else "a bundle"
        kind = f" ({p.refused_kind})" if p.refused_kind is not None else ""
        return Check(name="policy", state="warn", summary=f"{summary}; {serial} refused{kind}: {p.refused_reason}")
    if p.hub_below:
        offered = f"serial {p.hub_below_offered}" if p.hub_below_offered is not None else "nothing"
        since = f" since {p.hub_below_since:%Y-%m-%d %H:%M} UTC" if p.hub_below_since else ""
        return Check(name="policy", state="warn",
                     summary=f"{summary}; serial {p.bundle_serial} in force is above every serial the hub offers "
                             f"({offered}{since}): a withdrawn bundle still in force or a fast-forward; push a new "
                             f"bundle above it, or install the offered one with policy install --allow-rollback")
    if p.source == "bundle" and p.bundle_serial is None:
        return Check(name="policy", state="warn", summary=summary)
    return Check(name="policy", state="ok", summary=summary)


def _maintenance(f: StatusFacts, now: dt.datetime) -> Optional[Check]:
    """The scheduler hand-off, only while there is one: draining is worth attention (jobs still run there, the hook
    refuses guarded changes), held is the change window, kept means a post-change check failed and the node stays
    out of service until an operator looks."""
    m = f.maintenance
    if m.problem is not None:
        return Check(name="maintenance", state="fail", summary=m.problem)
    if m.phase is None:
        return None
    since = f" (begun {_age(now, m.began_at)})" if m.began_at is not None else ""
    owner = "" if m.drained_by_us else " (drained by someone else: gpuguard will not resume it)"
    summary = f"{m.scheduler} node {m.node} {m.phase}{since}{owner}: {m.reason}" + (
        f"; {m.detail}" if m.detail else "")
    return Check(name="maintenance", state=MAINTENANCE_STATES.get(m.phase, "info"), summary=summary)


def assess(facts: StatusFacts, now: Optional[dt.datetime] = None) -> Assessment:
    """The checks for ``facts`` as of ``now`` (default: when they were gathered)."""
    at = now or facts.gathered_at
    checks = [_daemon(facts), _snapshot(facts, at), _compliance(facts), _health(facts, at), _guard(facts, at),
              _rollback(facts), _policy(facts, at), _outbox(facts, at), _hub(facts)]
    held = _maintenance(facts, at)
    if held is not None:
        checks.insert(1, held)
    states = {c.state for c in checks}
    verdict: Verdict = "failing" if "fail" in states else "attention" if "warn" in states else "ok"
    return Assessment(verdict=verdict, exit_code=STATUS_EXIT_CODES[verdict], checks=checks)
