"""Staged rollouts of a policy bundle (issue #33): their rows, what each host is offered, and the stage decision
made exactly once across hub processes.

    start    an admin names a pushed bundle (the target) and the stages; the hosts in the target's scope (and the
             label selector) become rows of ``rollout_hosts`` with their cohort; the canaries are admitted at once
    evaluate in one transaction holding the rollout's row lock (``SELECT ... FOR UPDATE`` on PostgreSQL, BEGIN
             IMMEDIATE on SQLite): read the hosts, their evidence and the control (only what can have changed
             since this process's last evaluation, kept in ``_Judged``, unless another process evaluated it since:
             ``_changed``, ``_control_refreshed``, ``FULL_EVALUATION_EVERY``), ``rollout_plan.decide``, write what
             it says
             (admit, halt with an alert, done) and audit it. Whichever hub process evaluates first decides; the
             others then see the stage already open. A restarted hub carries on from the rows.
    offer    while a rollout is running, paused or halted, its target is offered only to admitted hosts; every
             other host is offered the newest bundle below the target in its scope (so its hook keeps refusing the
             change). Every answer names the rollout in typed fields (``HostOffer.rollout_id``, ``state``,
             ``admitted_stage``: what the agent decides on, agent/wire.py) and a one-line notice for people
             ("rollout R: waiting for stage 2 (...)"), which nothing reads back.
    pause    who paused it is the row's ``paused_by`` column (the reason is text for people).
    abort    withdraws the target bundle (an audited withdrawal): no host is offered it again. Hosts that already
             enforce it keep it, because an agent never installs a lower serial (agent/bundle). To return them
             the previous policy must come back under a higher serial, signed by the operator's offline key: the
             rollout's revert bundle (``revert_serial``, pushed staged with the target) is released to its whole
             scope at abort (and withdrawn when the rollout is done); without one, push the previous policy again
             under a new serial.

One rollout is active at a time (running, paused or halted); a halted rollout is ended by abort.
"""

from __future__ import annotations

import datetime as dt
import json
import secrets
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Sequence, Set, Tuple

from agent.bundle.scope import scope_facts, scope_refusal
from agent.hub import schema, workload_stacks
from agent.hub.bundles import PolicyBundles, offered_serial
from agent.hub.periodic import Periodic
from agent.hub.responses import HubHTTPError
from agent.hub.rollout_plan import (
    ACTIVE_STATES,
    FAILURE_EVENT_KINDS,
    ControlTally,
    Evidence,
    HostOffer,
    RolloutHost,
    RolloutRow,
    RolloutSpec,
    RolloutStatus,
    StageStep,
    Tally,
    cohort_of,
    counts_by_stage,
    decide,
    host_evidence,
    overdue,
    waiting_line,
    window_starts,
)
from agent.hub.rows import BundleSummary, ControlRow, HostRow, utc_now
from agent.hub.store import SqlStore
from agent.hub.tokens import Principal
from agent.log import get_logger
from agent.wire import FAILED_HEALTH_STATUSES, MAX_NOTICE_CHARS

if TYPE_CHECKING:
    from agent.hub.alerts import AlertQueue

log = get_logger("hub.rollouts")

# PostgreSQL advisory lock held by a start's transaction (SQLite: BEGIN IMMEDIATE), so one rollout is active at a time.
START_LOCK_KEY = 0x67707567_0033
HUB_ACTOR = Principal(role="admin", subject="hub")  # the actor of automatic decisions in the audit trail
# An evaluation reads and re-judges only the hosts whose evidence or control state can have changed since this
# process's last evaluation of the rollout (issue 43); a full one at least every this many evaluations (the safety
# net: about 5 minutes at the default 10 s tick), and on the first evaluation in a process (a hub restart), after a
# stage change, whenever the clock went back and when another process evaluated the rollout since (its
# ``evaluations`` counter moved).
FULL_EVALUATION_EVERY = 30
# How far before the last evaluation's time an incremental one looks: a report received just before it but
# committed after it read is still seen.
INCREMENTAL_MARGIN_SECONDS = 5.0
# Host ids per ``IN (...)`` list when only the hosts that changed are read: well under either database's bound.
ROWS_PER_READ = 500
# The ``IN (...)`` placeholders of the failure event kinds, in every read of a rollout's failure events.
_FAILURE_KIND_MARKS = ", ".join("?" * len(FAILURE_EVENT_KINDS))
_ROLLOUT_COLUMNS = ("rollout_id, target_serial, previous_serial, spec, state, stage, stage_started_at, created_at, "
                    "created_by, updated_at, reason, paused_by")


@dataclass
class _Control:
    """What the control of a rollout reads, kept between evaluations: when its window opened (the first admission;
    None: none yet), the rows of the hosts not admitted (also what tells a silent host; empty when neither the
    control nor the silence is used), each host's failure events (kind, received_at) in the window before its
    admission (under judgement with a control only), the silent hosts and the control's tally (None under the
    absolute rule)."""

    window_start: Optional[dt.datetime]
    states: Dict[str, ControlRow]
    failures: Dict[str, Tuple[Tuple[str, dt.datetime], ...]]
    silent: Set[str]
    tally: Optional[ControlTally]


@dataclass
class _Judged:
    """What one hub process knew of a rollout after its last evaluation (issue 43), so the next one reads only what
    changed since: its stage then, when it ran, how many evaluations since the last full one, the rollout row's
    ``evaluations`` counter it left (another process's evaluation since bumps it), every host with its evidence by
    host_id (in host_id order), their tally and the control. The next evaluation updates it in place; one that
    fails drops it (``Rollouts.evaluate``)."""

    stage: int
    evaluated_at: dt.datetime
    since_full: int
    evaluations: int
    hosts: Dict[str, RolloutHost]
    tally: Tally
    control: _Control


def _paused_line(paused_by: Optional[str]) -> str:
    """``paused by alice``, from the row's typed ``paused_by`` (None: a row paused before the column existed)."""
    return f"paused by {paused_by}" if paused_by else "paused"


class Rollouts:
    """Rollouts in the hub's store."""

    def __init__(self, store: SqlStore, bundles: PolicyBundles, alerts: Optional["AlertQueue"] = None,
                 clock: Callable[[], dt.datetime] = utc_now, stale_after_seconds: Optional[float] = None,
                 full_every: int = FULL_EVALUATION_EVERY) -> None:
        self.store = store
        self.bundles = bundles
        self.alerts = alerts
        self.clock = clock
        # a host not heard from this long when a rollout starts is left out of it (None: none is)
        self.stale_after_seconds = stale_after_seconds
        self.full_every = full_every
        # rollout_id -> what this process's last evaluation of it knew (the next one reads only what changed since)
        self._judged: Dict[str, _Judged] = {}

    def _t(self, value: Optional[dt.datetime]) -> Any:
        return None if value is None else self.store.dialect.to_db_time(value)

    def _from(self, value: Any) -> Optional[dt.datetime]:
        return None if value is None else self.store.dialect.from_db_time(value)

    def _row(self, r: Sequence[Any]) -> RolloutRow:
        spec = json.loads(r[3])
        spec.setdefault("judge", "absolute")  # a rollout started before judgement with a control keeps its rule
        return RolloutRow(rollout_id=r[0], target_serial=int(r[1]), previous_serial=None if r[2] is None else int(r[2]),
                          spec=RolloutSpec.model_validate(spec), state=r[4], stage=int(r[5]),
                          stage_started_at=self._from(r[6]), created_at=self._from(r[7]), created_by=r[8],
                          updated_at=self._from(r[9]), reason=r[10], paused_by=r[11])

    def _audit(self, cur: Any, principal: Principal, action: str, rollout: RolloutRow, detail: str) -> None:
        self.bundles.audit_in(cur, principal, action, rollout.target_serial, f"rollout {rollout.rollout_id}: {detail}")

    # --- start ---------------------------------------------------------------------------------------------
    def start(self, principal: Principal, spec: RolloutSpec) -> RolloutStatus:
        """Start a rollout of ``spec.target_serial``; 422 for a bad spec, 404/409 for a target that cannot be
        rolled out, 409 while another rollout is active."""
        problems = spec.problems()
        if problems:
            raise HubHTTPError(422, "invalid_request", f"rollout: {problems[0]}", [f"(body) -> {p}" for p in problems])
        target = self.bundles.summary(spec.target_serial)
        if target.withdrawn_at is not None:
            raise HubHTTPError(409, "target_withdrawn", f"bundle {spec.target_serial} was withdrawn; push it again "
                                                        "under a new serial")
        scope = self.bundles.bundle(spec.target_serial).scope
        if spec.revert_serial is not None:
            self._check_revert(spec.revert_serial, scope)
        older = [s for s in self.bundles.offered_scopes() if s[0] < spec.target_serial]
        previous = older[0][0] if older else None
        now = self.clock()
        silent_since = None if self.stale_after_seconds is None else now - dt.timedelta(
            seconds=self.stale_after_seconds)
        members: List[Tuple[str, str]] = []
        silent = 0
        for host in self.store.hosts():
            facts = scope_facts(host.host_id, host.labels or {}, host.pairing)
            if scope_refusal(scope, facts) is None and all((host.labels or {}).get(k) == v
                                                           for k, v in spec.labels.items()):
                if silent_since is not None and host.last_seen_at < silent_since:
                    silent += 1  # decommissioned or down: it would be admitted and never report
                    continue
                members.append((host.host_id, cohort_of(host)))
        if not members:
            raise HubHTTPError(409, "no_hosts", f"no host the hub knows is in bundle {spec.target_serial}'s scope"
                                                f"{' and the label selector' if spec.labels else ''}"
                                                + (f" and was heard from in the last {self.stale_after_seconds:g}s "
                                                   f"({silent} silent)" if silent else ""))
        rollout_id = f"r{spec.target_serial}-{secrets.token_hex(3)}"
        sql = self.store.dialect.sql

        def work(cur: Any) -> None:
            self.store.dialect.lock(cur, START_LOCK_KEY)  # two starts at once: the second sees the first's row
            cur.execute(sql("SELECT rollout_id FROM rollouts WHERE state IN (?, ?, ?)"), ACTIVE_STATES)
            active = cur.fetchone()
            if active is not None:
                raise HubHTTPError(409, "rollout_active", f"rollout {active[0]} is still active; abort it or let it "
                                                          "finish first")
            cur.execute(sql(f"INSERT INTO rollouts ({_ROLLOUT_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"),
                        (rollout_id, spec.target_serial, previous, spec.model_dump_json(), "running", -1, None,
                         self._t(now), principal.subject, self._t(now), "starting", None))
            for host_id, cohort in members:
                cur.execute(sql("INSERT INTO rollout_hosts (rollout_id, host_id, cohort) VALUES (?, ?, ?)"),
                            (rollout_id, host_id, cohort))
            row = self._locked(cur, rollout_id)
            cohorts = len({c for _, c in members})
            self._audit(cur, principal, "rollout_start", row,
                        f"{len(members)} hosts in {cohorts} cohorts, previous serial {previous}, canaries "
                        f"{spec.canaries}, batches {','.join(map(str, spec.batches))}%, soak {spec.soak_seconds}s, "
                        f"halt above {spec.halt_percent:g}%"
                        + (f", {silent} hosts silent for over {self.stale_after_seconds:g}s left out"
                           if silent else ""))

        self.store.write("rollout_start", work)
        log.info("hub_rollout_started", rollout_id=rollout_id, actor=principal.subject, target=spec.target_serial,
                 host_count=len(members), silent_host_count=silent)
        self.evaluate(rollout_id)
        return self.status(rollout_id)

    def _check_revert(self, serial: int, target_scope: Any) -> None:
        """A revert bundle must wait unseen until an abort (staged, not withdrawn) and reach every host the target
        can: the same scope."""
        revert = self.bundles.summary(serial)
        if revert.withdrawn_at is not None or not revert.staged:
            raise HubHTTPError(409, "revert_not_staged", f"revert bundle {serial} must be pushed staged and not be "
                                                         "withdrawn: otherwise it reaches hosts before any abort")
        if self.bundles.bundle(serial).scope != target_scope:
            raise HubHTTPError(409, "revert_scope", f"revert bundle {serial}'s scope differs from the target's: "
                                                    "admitted hosts outside it would keep the target after an abort")

    def push(self, principal: Principal, data: bytes, signature: bytes, staged: bool = False) -> BundleSummary:
        """Store a pushed bundle (``PolicyBundles.push``); 409 for one offered at once while a rollout is active: its
        serial is above the target, so it would reach only the admitted hosts while every other host, held below
        the target, never saw it until the rollout ended."""
        active = self.active()
        if active is not None and not staged:
            raise HubHTTPError(409, "rollout_active", f"rollout {active.rollout_id} of bundle {active.target_serial} "
                                                      f"is {active.state}: a bundle pushed now would reach only its "
                                                      "admitted hosts; push it staged, or end the rollout first")
        return self.bundles.push(principal, data, signature, staged)

    # --- the decision --------------------------------------------------------------------------------------
    def _locked(self, cur: Any, rollout_id: str) -> RolloutRow:
        cur.execute(self.store.dialect.sql(f"SELECT {_ROLLOUT_COLUMNS} FROM rollouts WHERE rollout_id = ?"
                                           + self.store.dialect.for_update), (rollout_id,))
        row = cur.fetchone()
        if row is None:
            raise HubHTTPError(404, "not_found", f"no rollout {rollout_id}")
        return self._row(row)

    def _hosts(self, cur: Any, rollout_id: str) -> Dict[str, RolloutHost]:
        """Every host of the rollout with its stored evidence, by host_id (in host_id order)."""
        cur.execute(self.store.dialect.sql("SELECT host_id, cohort, stage, admitted_at, evidence, evidence_detail "
                                           "FROM rollout_hosts WHERE rollout_id = ? ORDER BY host_id"), (rollout_id,))
        return {r[0]: RolloutHost(host_id=r[0], cohort=r[1], stage=r[2], admitted_at=self._from(r[3]),
                                  evidence=Evidence(result=r[4], detail=r[5] or "") if r[4] else None)
                for r in cur.fetchall()}

    def _failures_since(self, cur: Any, since: dt.datetime) -> List[Tuple[str, str, dt.datetime]]:
        """Every failure event (host_id, kind, received_at) the hub received since ``since``, by its index: what an
        incremental evaluation reads once for the evidence (``_changed``) and the control (``_control_refreshed``)."""
        cur.execute(self.store.dialect.sql(f"SELECT host_id, kind, received_at FROM events "
                                           f"WHERE kind IN ({_FAILURE_KIND_MARKS}) AND received_at >= ?"),
                    (*FAILURE_EVENT_KINDS, self._t(since)))
        from_db_time = self.store.dialect.from_db_time
        return [(host_id, kind, from_db_time(at)) for host_id, kind, at in cur.fetchall()]

    def _changed(self, cur: Any, rollout: RolloutRow, hosts: Dict[str, RolloutHost], since: dt.datetime,
                 now: dt.datetime, failures: Sequence[Tuple[str, str, dt.datetime]]) -> List[str]:
        """The admitted hosts whose evidence can have changed since ``since``: a heartbeat or failure event received,
        admitted, or the report deadline passed since then. Each part is read by an index (schema version 11)
        alone, the rollout's hosts told apart here (``hosts``), so neither database walks the rollout's rows. A
        host's row is never deleted, and its gating workloads' verdicts are stored in the same commit as the
        heartbeat that carries them (``SqlStore.ingest``), so a new verdict always comes with a new
        ``heartbeat_received_at``."""
        sql = self.store.dialect.sql
        t = self._t(since)
        cur.execute(sql("SELECT host_id FROM hosts WHERE heartbeat_received_at >= ?"), (t,))
        found = {r[0] for r in cur.fetchall()}
        found.update(host_id for host_id, _, _ in failures)
        cur.execute(sql("SELECT host_id FROM rollout_hosts WHERE rollout_id = ? AND admitted_at >= ?"),
                    (rollout.rollout_id, t))
        found.update(r[0] for r in cur.fetchall())
        if rollout.spec.report_deadline_seconds:
            deadline = dt.timedelta(seconds=rollout.spec.report_deadline_seconds)
            cur.execute(sql("SELECT host_id FROM rollout_hosts WHERE rollout_id = ? AND admitted_at >= ? "
                            "AND admitted_at <= ?"),
                        (rollout.rollout_id, self._t(since - deadline), self._t(now - deadline)))
            found.update(r[0] for r in cur.fetchall())
        return sorted(h for h in found if h in hosts and hosts[h].stage is not None)

    def _evidence(self, cur: Any, rollout: RolloutRow, hosts: Dict[str, RolloutHost], now: dt.datetime,
                  changed: Optional[Sequence[str]] = None, tally: Optional[Tally] = None) -> None:
        """Judge the admitted hosts again (``changed``: only those; None: every one) from their heartbeats, failure
        events since admission and gating workloads, the evidence they had (a pass stands) and the report deadline;
        the new evidence goes into ``hosts`` (and ``tally``) and, where it changed, the store. A host not judged
        again keeps its
        stored evidence, which is what judging it again would give (tests/hub/test_rollout_evidence_fixpoint.py)."""
        sql = self.store.dialect.sql
        rid = rollout.rollout_id
        if changed is None:
            filters: List[Tuple[str, List[Any]]] = [("r.rollout_id = ? AND r.admitted_at IS NOT NULL", [rid])]
        else:
            filters = [(f"r.rollout_id = ? AND r.host_id IN ({', '.join('?' * len(chunk))})", [rid, *chunk])
                       for chunk in (changed[i:i + ROWS_PER_READ] for i in range(0, len(changed), ROWS_PER_READ))]
        states: Dict[str, HostRow] = {}
        failures: Dict[str, List[Tuple[str, dt.datetime]]] = {}
        gating: Dict[str, List[workload_stacks.GatingVerdict]] = {}
        from_db_time = self.store.dialect.from_db_time
        for condition, params in filters:
            cur.execute(sql(f"SELECT {', '.join('h.' + c.strip() for c in schema.HOST_COLUMNS.split(','))} "
                            f"FROM hosts h JOIN rollout_hosts r ON r.host_id = h.host_id WHERE {condition}"), params)
            for row in cur.fetchall():
                state = schema.host_from_row(row, from_db_time)
                states[state.host_id] = state
            # received since admission (the hub's clock; issue 43), whatever the agent's clock said
            cur.execute(sql("SELECT e.host_id, e.kind, e.received_at FROM events e JOIN rollout_hosts r "
                            f"ON r.host_id = e.host_id WHERE {condition} AND r.admitted_at IS NOT NULL "
                            f"AND e.kind IN ({_FAILURE_KIND_MARKS}) AND e.received_at >= r.admitted_at"),
                        (*params, *FAILURE_EVENT_KINDS))
            for host_id, kind, at in cur.fetchall():
                failures.setdefault(host_id, []).append((kind, from_db_time(at)))
            cur.execute(sql(workload_stacks.gating_verdicts_sql(condition)), params)
            for row in cur.fetchall():
                host_id, verdict = workload_stacks.gating_verdict_of(row)
                gating.setdefault(host_id, []).append(verdict)
        for host_id in (list(hosts) if changed is None else changed):
            h = hosts[host_id]
            if h.stage is None or h.admitted_at is None:
                continue
            evidence = overdue(host_evidence(rollout.target_serial, h.admitted_at, states.get(host_id),
                                             failures.get(host_id, []), h.evidence, gating.get(host_id, ())),
                               h.admitted_at, now, rollout.spec)
            if evidence != h.evidence:
                cur.execute(sql("UPDATE rollout_hosts SET evidence = ?, evidence_detail = ? "
                                "WHERE rollout_id = ? AND host_id = ?"),
                            (evidence.result, evidence.detail, rid, host_id))
                hosts[host_id] = judged = h.model_copy(update={"evidence": evidence})
                if tally is not None:
                    tally.add(h, -1)
                    tally.add(judged)

    def _control_read(self, cur: Any, rollout: RolloutRow, hosts: Dict[str, RolloutHost],
                      now: dt.datetime) -> _Control:
        """The control read in full: the rows of the hosts not admitted (for the control and the silence; none when
        neither is used) and, under judgement with a control, every failure event of the rollout's hosts before
        their admission since the cohort windows opened (the first admission)."""
        starts = window_starts(hosts.values())
        window_start = min(starts.values()) if starts else None
        tally = ControlTally(starts) if rollout.spec.judge == "control" else None
        control = _Control(window_start, {}, {}, set(), tally)
        if rollout.spec.judge != "control" and self.stale_after_seconds is None:
            return control
        sql = self.store.dialect.sql
        from_db_time = self.store.dialect.from_db_time
        cur.execute(sql(f"SELECT {', '.join('h.' + c.strip() for c in schema.CONTROL_COLUMNS.split(','))} "
                        "FROM hosts h JOIN rollout_hosts r ON r.host_id = h.host_id WHERE r.rollout_id = ? "
                        "AND r.admitted_at IS NULL"), (rollout.rollout_id,))
        control.states.update((row[0], schema.control_row_from(row, from_db_time)) for row in cur.fetchall())
        if tally is not None and window_start is not None:
            cur.execute(sql("SELECT e.host_id, e.kind, e.received_at FROM events e JOIN rollout_hosts r "
                            "ON r.host_id = e.host_id WHERE r.rollout_id = ? "
                            f"AND e.kind IN ({_FAILURE_KIND_MARKS}) AND e.received_at >= ? "
                            "AND (r.admitted_at IS NULL OR e.received_at < r.admitted_at)"),
                        (rollout.rollout_id, *FAILURE_EVENT_KINDS, self._t(window_start)))
            for host_id, kind, at in cur.fetchall():
                control.failures[host_id] = control.failures.get(host_id, ()) + ((kind, from_db_time(at)),)
        for h in hosts.values():
            self._recount(control, h, now)
        return control

    def _recount(self, control: _Control, host: RolloutHost, now: dt.datetime) -> None:
        """``host``'s silence and contribution to the control, from its kept row and failure events."""
        if self.stale_after_seconds is not None and host.stage is None:
            state = control.states.get(host.host_id)
            if state is None or state.last_seen_at < now - dt.timedelta(seconds=self.stale_after_seconds):
                control.silent.add(host.host_id)
            else:
                control.silent.discard(host.host_id)
        if control.tally is not None:
            control.tally.put(host, control.states.get(host.host_id), control.failures.get(host.host_id, ()),
                              host.host_id in control.silent)

    def _control_refreshed(self, cur: Any, rollout: RolloutRow, hosts: Dict[str, RolloutHost], control: _Control,
                           since: dt.datetime, now: dt.datetime,
                           failures: Sequence[Tuple[str, str, dt.datetime]]) -> None:
        """The control of the last evaluation brought up to date, reading only what changed since ``since``: the
        rows of the hosts not admitted that the hub heard from since then (``hosts.last_seen_at`` is the receipt of
        the host's newest event, whatever it was), those whose last word crossed the silence bound since then, and
        the failure events received since then (``failures``, ``_failures_since``); only these hosts are counted
        again."""
        if rollout.spec.judge != "control" and self.stale_after_seconds is None:
            return
        sql = self.store.dialect.sql
        from_db_time = self.store.dialect.from_db_time
        cur.execute(sql(f"SELECT {schema.CONTROL_COLUMNS} FROM hosts WHERE last_seen_at >= ?"), (self._t(since),))
        touched = set()
        for row in cur.fetchall():
            if row[0] in hosts and hosts[row[0]].stage is None:
                control.states[row[0]] = schema.control_row_from(row, from_db_time)
                touched.add(row[0])
        if self.stale_after_seconds is not None:
            stale = dt.timedelta(seconds=self.stale_after_seconds)
            cur.execute(sql("SELECT host_id FROM hosts WHERE last_seen_at >= ? AND last_seen_at < ?"),
                        (self._t(since - stale), self._t(now - stale)))
            touched.update(r[0] for r in cur.fetchall() if r[0] in hosts and hosts[r[0]].stage is None)
        if control.tally is not None and control.window_start is not None:
            for host_id, kind, at in failures:  # one seen by the last evaluation too (in the margin) is kept once
                if at < control.window_start:
                    continue  # before the control's window opened
                failure = (kind, at)
                host = hosts.get(host_id)
                if host is None or (host.admitted_at is not None and failure[1] >= host.admitted_at):
                    continue  # not in the rollout, or after its admission: its evidence, not the control
                if failure not in control.failures.get(host_id, ()):
                    control.failures[host_id] = control.failures.get(host_id, ()) + (failure,)
                    touched.add(host_id)
        for host_id in touched:
            self._recount(control, hosts[host_id], now)

    def evaluate(self, rollout_id: str) -> Optional[StageStep]:
        """Decide the next step of a running rollout and carry it out, in one transaction under its row lock;
        the decision (None when the rollout is not running; a paused one's evidence is brought up to date)."""
        now = self.clock()
        sql = self.store.dialect.sql
        judged: List[_Judged] = []

        def work(cur: Any) -> Optional[StageStep]:
            rollout = self._locked(cur, rollout_id)
            if rollout.state not in ("running", "paused"):
                return None
            cur.execute(sql("UPDATE rollouts SET evaluations = evaluations + 1 WHERE rollout_id = ?"), (rollout_id,))
            cur.execute(sql("SELECT evaluations FROM rollouts WHERE rollout_id = ?"), (rollout_id,))
            evaluations = int(cur.fetchone()[0])
            last = self._judged.get(rollout_id)
            if last is not None and last.stage == rollout.stage and last.evaluated_at <= now \
                    and last.since_full + 1 < self.full_every and last.evaluations + 1 == evaluations:
                since = last.evaluated_at - dt.timedelta(seconds=INCREMENTAL_MARGIN_SECONDS)
                by_id, tally, control = last.hosts, last.tally, last.control
                failures = self._failures_since(cur, since)  # read once, for the evidence and the control
                self._evidence(cur, rollout, by_id, now, self._changed(cur, rollout, by_id, since, now, failures),
                               tally)
                self._control_refreshed(cur, rollout, by_id, control, since, now, failures)
                since_full = last.since_full + 1
            else:  # the first here, a new stage, the clock went back, another process evaluated since, or due
                by_id = self._hosts(cur, rollout_id)
                self._evidence(cur, rollout, by_id, now)
                tally = Tally(by_id.values())
                control = self._control_read(cur, rollout, by_id, now)
                since_full = 0
            judged[:] = [_Judged(rollout.stage, now, since_full, evaluations, by_id, tally, control)]
            if rollout.state == "paused":  # evidence and the tally kept current (a pass seen now stands), no decision
                waiting = waiting_line(rollout.spec, rollout.stage, rollout.stage_started_at,
                                       tally.passed_in_stage(rollout.stage), tally.in_stage(rollout.stage))
                why = f"{_paused_line(rollout.paused_by)}; {waiting}"
                if rollout.stage >= 0 and why != rollout.reason:
                    cur.execute(sql("UPDATE rollouts SET reason = ? WHERE rollout_id = ?"), (why, rollout_id))
                return None
            counts = control.tally.counts() if control.tally is not None else None
            decision = decide(rollout.spec, rollout.stage, rollout.stage_started_at, by_id.values(), now,
                              control.silent, counts, tally)
            if decision.action == "admit":
                judged[:] = []  # a new stage: the next evaluation is a full one
                for host_id in decision.admit:
                    cur.execute(sql("UPDATE rollout_hosts SET stage = ?, admitted_at = ? "
                                    "WHERE rollout_id = ? AND host_id = ? AND stage IS NULL"),
                                (decision.stage, self._t(now), rollout_id, host_id))
                explained = decision.explained()
                reason = waiting_line(rollout.spec, decision.stage, now, 0, len(decision.admit)) \
                    + (f"; widened: {explained}" if explained else "")
                cur.execute(sql("UPDATE rollouts SET stage = ?, stage_started_at = ?, updated_at = ?, reason = ? "
                                "WHERE rollout_id = ?"), (decision.stage, self._t(now), self._t(now), reason,
                                                          rollout_id))
                self._audit(cur, HUB_ACTOR, "rollout_stage", rollout,
                            f"stage {decision.stage} opened, {len(decision.admit)} hosts admitted"
                            + (f": {', '.join(decision.admit[:20])}" if decision.admit else "")
                            + (f"; {explained}" if explained else ""))
            elif decision.action in ("halt", "done"):
                judged[:] = []  # never evaluated again: nothing to keep
                state = "halted" if decision.action == "halt" else "done"
                cur.execute(sql("UPDATE rollouts SET state = ?, updated_at = ?, reason = ? WHERE rollout_id = ?"),
                            (state, self._t(now), decision.reason, rollout_id))
                self._audit(cur, HUB_ACTOR, f"rollout_{state}", rollout, decision.reason)
                if state == "done":  # a staged target now goes to its whole scope; its revert is not needed
                    cur.execute(sql("UPDATE policy_bundles SET staged = 0 WHERE serial = ?"),
                                (rollout.target_serial,))
                    if rollout.spec.revert_serial is not None:
                        self.bundles.withdraw_in(cur, HUB_ACTOR, rollout.spec.revert_serial,
                                                 f"rollout {rollout_id} done: its revert bundle is not needed",
                                                 missing_ok=True)
                if state == "halted" and self.alerts is not None:
                    self.alerts.enqueue_hub_alert(cur, f"rollout-{rollout_id}-halt", {
                        "kind": "rollout_halted", "severity": "critical", "rollout_id": rollout_id,
                        "target_serial": rollout.target_serial, "stage": rollout.stage,
                        "summary": f"rollout {rollout_id} of bundle {rollout.target_serial} halted: "
                                   f"{decision.reason}",
                        "hosts": [{"host_id": h.host_id, "result": h.evidence.result, "detail": h.evidence.detail}
                                  for h in tally.failed_hosts() if h.evidence is not None],
                        "judgements": [j.model_dump(mode="json") for j in decision.judgements
                                       if j.p_value is not None]}, now)
            elif decision.reason != rollout.reason:
                cur.execute(sql("UPDATE rollouts SET reason = ? WHERE rollout_id = ?"), (decision.reason, rollout_id))
            return decision

        try:
            decision = self.store.write("rollout_evaluate", work)
        except BaseException:
            self._judged.pop(rollout_id, None)  # rolled back: the store holds what the last evaluation left
            raise
        if judged:
            self._judged[rollout_id] = judged[0]
        else:
            self._judged.pop(rollout_id, None)
        if decision is not None and decision.action != "wait":
            log.info("hub_rollout_decision", rollout_id=rollout_id, action=decision.action, stage=decision.stage,
                     admitted=len(decision.admit), reason=decision.reason)
        return decision

    def evaluate_running(self) -> int:
        """Evaluate every running rollout (and keep a paused one's evidence current); how many decisions other than
        wait were made."""
        made = 0
        running = [rollout_id for (rollout_id,) in self.store.query(
            "rollout_list", "SELECT rollout_id FROM rollouts WHERE state IN (?, ?)", ["running", "paused"])]
        for gone in set(self._judged) - set(running):  # aborted or ended by another process: what was kept goes
            del self._judged[gone]
        for rollout_id in running:
            decision = self.evaluate(rollout_id)
            made += decision is not None and decision.action != "wait"
        return made

    # --- operator actions ----------------------------------------------------------------------------------
    def _transition(self, principal: Principal, rollout_id: str, allowed: Sequence[str], state: str,
                    reason: str) -> RolloutRow:
        now = self.clock()
        sql = self.store.dialect.sql

        def work(cur: Any) -> RolloutRow:
            rollout = self._locked(cur, rollout_id)
            if rollout.state not in allowed:
                raise HubHTTPError(409, "wrong_state", f"rollout {rollout_id} is {rollout.state}; {state} needs "
                                                       f"{' or '.join(allowed)}")
            why = reason
            paused_by = principal.subject if state == "paused" else None
            if state == "paused":
                why = _paused_line(paused_by)
                if rollout.stage >= 0:  # a held-back host still sees the stage, tally and soak
                    why = f"{why}; {rollout.reason}"
            if state == "aborted":
                revert = rollout.spec.revert_serial
                why += (f"; revert bundle {revert} released to return admitted hosts" if revert is not None
                        else "; push the previous policy under a new serial to return admitted hosts")
            cur.execute(sql("UPDATE rollouts SET state = ?, updated_at = ?, reason = ?, paused_by = ? "
                            "WHERE rollout_id = ?"), (state, self._t(now), why, paused_by, rollout_id))
            self._audit(cur, principal, f"rollout_{state}", rollout, why)
            if state == "aborted":
                self.bundles.withdraw_in(cur, principal, rollout.target_serial,
                                         f"rollout {rollout_id} aborted", missing_ok=True)
                revert = rollout.spec.revert_serial
                if revert is not None:
                    cur.execute(sql("UPDATE policy_bundles SET staged = 0 WHERE serial = ? AND withdrawn_at IS NULL"),
                                (revert,))
                    self.bundles.audit_in(cur, principal, "rollout_revert_released", revert,
                                          f"rollout {rollout_id} aborted: revert bundle {revert} offered to its "
                                          "whole scope")
            return rollout

        self.store.write(f"rollout_{state}", work)
        log.info("hub_rollout_changed", rollout_id=rollout_id, actor=principal.subject, state=state)
        return self.status(rollout_id).rollout

    def pause(self, principal: Principal, rollout_id: str) -> RolloutRow:
        """No more admissions until resumed; admitted hosts keep the target."""
        return self._transition(principal, rollout_id, ("running",), "paused", "")

    def resume(self, principal: Principal, rollout_id: str) -> RolloutRow:
        """A paused rollout runs again (a halted one is ended by abort)."""
        row = self._transition(principal, rollout_id, ("paused",), "running", f"resumed by {principal.subject}")
        self.evaluate(rollout_id)
        return row

    def abort(self, principal: Principal, rollout_id: str) -> RolloutRow:
        """End the rollout, withdraw its target and release its revert bundle (see the module docstring)."""
        return self._transition(principal, rollout_id, ACTIVE_STATES, "aborted",
                                f"aborted by {principal.subject}; target withdrawn")

    # --- reads ---------------------------------------------------------------------------------------------
    def rows(self) -> List[RolloutRow]:
        """Every rollout, newest first."""
        return [self._row(r) for r in self.store.query("rollout_list", f"SELECT {_ROLLOUT_COLUMNS} FROM rollouts "
                                                                       "ORDER BY created_at DESC, rollout_id")]

    def status(self, rollout_id: str) -> RolloutStatus:
        """One rollout with its hosts; 404 for an unknown id."""
        found = self.store.query("rollout_show", f"SELECT {_ROLLOUT_COLUMNS} FROM rollouts WHERE rollout_id = ?",
                                 [rollout_id])
        if not found:
            raise HubHTTPError(404, "not_found", f"no rollout {rollout_id}")
        rows = self.store.query("rollout_show", "SELECT host_id, cohort, stage, admitted_at, evidence, "
                                                "evidence_detail FROM rollout_hosts WHERE rollout_id = ? "
                                                "ORDER BY host_id", [rollout_id])
        hosts = [RolloutHost(host_id=r[0], cohort=r[1], stage=r[2], admitted_at=self._from(r[3]),
                             evidence=Evidence(result=r[4], detail=r[5] or "") if r[4] else None) for r in rows]
        return RolloutStatus(rollout=self._row(found[0]), hosts_by_stage=dict(counts_by_stage(hosts)), hosts=hosts)

    def active(self) -> Optional[RolloutRow]:
        """The active rollout (running, paused or halted), if any."""
        rows = self.store.query("rollout_active", f"SELECT {_ROLLOUT_COLUMNS} FROM rollouts WHERE state IN (?, ?, ?)",
                                list(ACTIVE_STATES))
        return self._row(rows[0]) if rows else None

    def current(self) -> Optional[RolloutStatus]:
        """The active rollout, else the newest one, with its hosts; None when there was none."""
        row = self.active()
        if row is None:
            newest = self.store.query("rollout_list", "SELECT rollout_id FROM rollouts ORDER BY created_at DESC, "
                                                      "rollout_id LIMIT 1")
            if not newest:
                return None
            return self.status(newest[0][0])
        return self.status(row.rollout_id)

    def offer(self, host_id: str) -> HostOffer:
        """The serial ``host_id`` is offered now, the active rollout's typed fields (its id, state, and the stage
        that admitted this host, None: held back) and its notice for people."""
        scopes = self.bundles.offered_scopes()
        host = self.store.host(host_id)
        rollout = self.active()
        if rollout is None:
            return HostOffer(serial=offered_serial(scopes, host_id, host) if scopes else None)
        admitted = self.store.query("rollout_offer", "SELECT stage FROM rollout_hosts WHERE rollout_id = ? AND "
                                                     "host_id = ?", [rollout.rollout_id, host_id])
        if admitted and admitted[0][0] is not None:
            return HostOffer(serial=offered_serial(self.bundles.offered_scopes(staged_serial=rollout.target_serial),
                                                   host_id, host),
                             notice=f"rollout {rollout.rollout_id}: admitted at stage {admitted[0][0]}",
                             rollout_id=rollout.rollout_id, state=rollout.state, admitted_stage=int(admitted[0][0]))
        below = [s for s in scopes if s[0] < rollout.target_serial]
        serial = offered_serial(below, host_id, host) if below else None
        why = {"running": rollout.reason, "paused": f"paused ({rollout.reason})",
               "halted": f"halted ({rollout.reason})"}[rollout.state]
        if not admitted:
            why = f"this host is not part of it ({rollout.state})"
        return HostOffer(serial=serial, notice=f"rollout {rollout.rollout_id}: {why}"[:MAX_NOTICE_CHARS],
                         rollout_id=rollout.rollout_id, state=rollout.state)


class RolloutWorker:
    """The rollout tick as a periodic job of the hub (agent/hub/periodic.py): the running rollouts evaluated every
    ``interval_seconds``, and soon after failing evidence arrives (``nudge``: a failure event, or a heartbeat with a
    failed health status or a failed gating workload, was stored), at most once per ``min_gap_seconds``: a halt is
    decided within about a second, widening waits for the tick (a soak is minutes, and a full evaluation of a
    50,000-host rollout costs about three CPU seconds, an incremental one what changed: bench/bench_rollout.py).
    Every hub process runs one; the row lock makes each decision once."""

    JOB = "rollouts"

    def __init__(self, rollouts: Rollouts, interval_seconds: float, min_gap_seconds: float = 1.0) -> None:
        self._rollouts = rollouts
        self._interval_seconds = interval_seconds
        self._min_gap_seconds = min_gap_seconds
        self._periodic: Optional[Periodic] = None

    def schedule(self, periodic: Periodic) -> None:
        """Add the tick to ``periodic``; its first run at once (a hub restarted mid-rollout resumes it)."""
        periodic.add(self.JOB, self._rollouts.evaluate_running, self._interval_seconds, first_after_seconds=0.0,
                     min_gap_seconds=self._min_gap_seconds)
        self._periodic = periodic

    def nudge(self, events: Sequence[Any]) -> None:
        """Evaluate soon when ``events`` (just stored) may halt a rollout; never blocks."""
        if self._periodic is not None and any(
                e.payload.kind in FAILURE_EVENT_KINDS
                or (e.payload.kind == "heartbeat" and (
                    e.payload.last_health_status in FAILED_HEALTH_STATUSES
                    or any(w.gates and w.status in FAILED_HEALTH_STATUSES for w in e.payload.workloads or ())))
                for e in events):
            self._periodic.run_soon(self.JOB)

