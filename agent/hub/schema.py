"""The store's tables, their version, and how rows go into them and come out of them.

    hub_meta  key -> value: the schema version, when the last retention pass began
    events    one row per (host_id, event_id), the idempotency key; the event as canonical JSON in ``body``
    hosts     one row per host: last seen, and the latest pairing and heartbeat (with the heartbeat's labels and
              policy fields since schema version 2, the refusal's kind since 6, the policy's attention words since
              8, the versions unknown to gpuguard's tables since 9); since version 10 each group's receipt time and
              sequence, which decide what is newest
    policy_bundles  one row per pushed policy bundle, by serial: its bytes, signature, scope, who made and pushed
                    it, and its withdrawal (agent/hub/bundles.py)
    audit     one row per push and withdrawal of a policy bundle, and per rollout decision: when, who, what
    rollouts  one row per staged rollout of a bundle (schema version 3): target and previous serial, its spec as
              JSON, state, the open stage and when it opened, why it halted (agent/hub/rollouts.py), who paused it
              (``paused_by``, schema version 5: a typed column, never read back from the reason), how many
              evaluations it had (``evaluations``, schema version 11: a hub process sees that another one evaluated
              it since its own last evaluation)
    rollout_hosts  one row per host of a rollout: cohort, stage and time of admission, its newest evidence
    workload_stacks  one row per (workload, stack, host) (schema version 7): the verified-stack matrix
                     (agent/hub/workload_stacks.py)

The statements are written once with ``?`` placeholders; the dialect (``dialects.py``) adapts them. The latest-state
columns of ``hosts`` move only forward on the hub's clock: by the time the hub received the events, then by the
agent's per-host ``sequence`` (``UPSERT_HOST``; issue 43). The agent's own times (``occurred_at``) are kept as data
and decide nothing, so a host whose clock once ran ahead is never frozen; resent events (already stored) change
nothing. Events are likewise listed, filtered "since" and pruned by ``received_at`` (schema version 12, with its
indexes). The dashboard and the alert queue keep their own tables (``create_tables`` in the store).

A database of an older schema version is migrated forward in ``create``, inside the same locked transaction
(``MIGRATIONS``: each step's statements, then the version stored), so hubs of the new version starting together
migrate it once; a hub never opens a database newer than it knows.
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from agent.hub import workload_stacks
from agent.hub.dialects import Dialect, text_time
from agent.hub.host_updates import HostUpdate
from agent.hub.rows import ControlRow, HostRow
from agent.report.events import Event
from agent.snapshot.pairing import Pairing

SCHEMA_VERSION = 12
# PostgreSQL advisory locks held while a hub creates tables: hubs starting together take turns. The store's own
# tables and the ones the dashboard and the alert queue add later each have their key.
SCHEMA_LOCK_KEY = 0x67707567_0001
EXTRA_TABLES_LOCK_KEY = 0x67707567_0016
RETENTION_KEY = "retention_pass_started_at"  # hub_meta: when the last retention pass began (dialects.text_time)
INSERT_META = "INSERT INTO hub_meta (key, value) VALUES (?, ?) ON CONFLICT (key) DO NOTHING"
ROWS_PER_INSERT = 200  # 9 parameters a row: well under SQLite's 32,766 bound variables

TimeToDb = Callable[[dt.datetime], Any]


# Columns of ``hosts`` added by schema version 2: the newest heartbeat's labels (JSON) and policy fields.
_HOST_POLICY_COLUMNS = (("labels", "TEXT"), ("policy_source", "TEXT"), ("policy_serial", "BIGINT"),
                        ("policy_refused_serial", "BIGINT"), ("policy_refused_reason", "TEXT"))
# Columns of ``hosts`` added by schema version 3: when the newest heartbeat's health check finished, and whether it
# followed a change (staged rollouts' evidence). The time is text in either database (``dialects.text_time``).
_HOST_HEALTH_COLUMNS = (("last_health_at", "TEXT"), ("last_health_after_change", "BOOLEAN"))
# Version 6's column of ``hosts``: why the newest heartbeat's refusal was made (agent/wire.py's REFUSAL_KINDS).
_HOST_REFUSAL_KIND_COLUMNS = (("policy_refused_kind", "TEXT"),)
# Version 8's column of ``hosts``: the newest heartbeat's policy attention words (agent/wire.py's POLICY_ATTENTION)
# as a JSON list; NULL from an agent that does not send them.
_HOST_ATTENTION_COLUMNS = (("policy_attention", "TEXT"),)
# Version 9's column of ``hosts``: the newest heartbeat's unknown_versions (versions newer than a compatibility table
# of gpuguard's knows, agent/wire.py's UNKNOWN_TABLES) as a JSON list; NULL from an agent that does not send them.
_HOST_UNKNOWN_VERSIONS_COLUMNS = (("unknown_versions", "TEXT"),)


def _host_receipt_columns(timestamp_type: str) -> List[Tuple[str, str]]:
    """Version 10's columns of ``hosts``: when the hub received the newest event, pairing and heartbeat, and the
    agent's sequence of the latter two (the newest is decided on these, never on the agent's clock); the newest
    heartbeat's time less its receipt (the host's clock skew). NULL in rows of older versions: the next event
    received replaces them."""
    return [("last_event_received_at", timestamp_type), ("pairing_received_at", timestamp_type),
            ("pairing_sequence", "BIGINT"), ("heartbeat_received_at", timestamp_type),
            ("heartbeat_sequence", "BIGINT"), ("clock_skew_seconds", "DOUBLE PRECISION")]


# Version 12 (issue 43): events are listed,
# filtered by "since" and pruned by when the hub received them (``received_at``), never by the agent's clock
# (``occurred_at``, kept as data), so the indexes that served the agent's order give way to these.
_RECEIPT_ORDER_INDEXES = (
    "CREATE INDEX IF NOT EXISTS events_host_received ON events (host_id, received_at)",
    "CREATE INDEX IF NOT EXISTS events_kind_received ON events (kind, received_at)",
    "CREATE INDEX IF NOT EXISTS events_received ON events (received_at)",
)
_OCCURRED_ORDER_INDEXES = ("events_host_occurred", "events_kind_occurred", "events_occurred")


# Version 4's column of ``policy_bundles``: a bundle pushed staged is offered only through a staged rollout (to its
# admitted hosts) until the rollout is done.
_STAGED_COLUMN = "staged INTEGER NOT NULL DEFAULT 0"


# Version 5's column of ``rollouts``: who paused it (NULL while not paused).
_PAUSED_BY_COLUMN = "paused_by TEXT"
# Version 11's column of ``rollouts``: how many evaluations it had, bumped by each in its locked transaction, so a hub
# process that kept the rollout's hosts from its own last evaluation sees whether another process evaluated it since
# (agent/hub/rollouts.py).
_EVALUATIONS_COLUMN = "evaluations BIGINT NOT NULL DEFAULT 0"
# Version 11's indexes: what an evaluation reads to find the hosts whose evidence or control state changed since the
# last one (received since then, admitted or past a deadline since then) without reading every host.
_CHANGE_INDEXES = (
    "CREATE INDEX IF NOT EXISTS hosts_last_seen ON hosts (last_seen_at)",
    "CREATE INDEX IF NOT EXISTS hosts_heartbeat_received ON hosts (heartbeat_received_at)",
    # events (kind, received_at) too: version 12's events_kind_received
    "CREATE INDEX IF NOT EXISTS rollout_hosts_admitted ON rollout_hosts (rollout_id, admitted_at)",
    "CREATE INDEX IF NOT EXISTS workload_stacks_host ON workload_stacks (host_id)",
)


def _rollouts_table(timestamp_type: str) -> str:
    """CREATE of ``rollouts`` as schema version 4 had it, without the closing parenthesis."""
    return f"""CREATE TABLE IF NOT EXISTS rollouts (
            rollout_id TEXT PRIMARY KEY,
            target_serial BIGINT NOT NULL,
            previous_serial BIGINT,
            spec TEXT NOT NULL,
            state TEXT NOT NULL,
            stage INTEGER NOT NULL,
            stage_started_at {timestamp_type},
            created_at {timestamp_type} NOT NULL,
            created_by TEXT NOT NULL,
            updated_at {timestamp_type} NOT NULL,
            reason TEXT NOT NULL"""


def _policy_bundles_table(timestamp_type: str, bytes_type: str) -> str:
    """CREATE TABLE IF NOT EXISTS policy_bundles as schema versions 2 and 3 had it, without its closing bracket."""
    return f"""CREATE TABLE IF NOT EXISTS policy_bundles (
            serial BIGINT PRIMARY KEY,
            bundle {bytes_type} NOT NULL,
            signature {bytes_type} NOT NULL,
            sha256 TEXT NOT NULL,
            scope TEXT NOT NULL,
            matrix_version TEXT,
            created_at TEXT NOT NULL,
            created_by TEXT NOT NULL,
            pushed_at {timestamp_type} NOT NULL,
            pushed_by TEXT NOT NULL,
            withdrawn_at {timestamp_type},
            withdrawn_by TEXT"""


def tables(timestamp_type: str, bytes_type: str = "BLOB", key_type: str = "INTEGER PRIMARY KEY") -> List[str]:
    """CREATE TABLE/INDEX IF NOT EXISTS for every table, times as ``timestamp_type``, bytes as ``bytes_type``, an
    audit row's generated key as ``key_type``."""
    policy_columns = "".join(f",\n            {name} {kind}"
                             for name, kind in _HOST_POLICY_COLUMNS + _HOST_HEALTH_COLUMNS
                             + _HOST_REFUSAL_KIND_COLUMNS + _HOST_ATTENTION_COLUMNS
                             + _HOST_UNKNOWN_VERSIONS_COLUMNS + tuple(_host_receipt_columns(timestamp_type)))
    return [
        "CREATE TABLE IF NOT EXISTS hub_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
        f"""CREATE TABLE IF NOT EXISTS events (
            host_id TEXT NOT NULL,
            event_id TEXT NOT NULL,
            sequence BIGINT NOT NULL,
            kind TEXT NOT NULL,
            severity TEXT NOT NULL,
            hostname TEXT NOT NULL,
            occurred_at {timestamp_type} NOT NULL,
            received_at {timestamp_type} NOT NULL,
            body TEXT NOT NULL,
            PRIMARY KEY (host_id, event_id))""",
        *_RECEIPT_ORDER_INDEXES,
        f"""CREATE TABLE IF NOT EXISTS hosts (
            host_id TEXT PRIMARY KEY,
            hostname TEXT NOT NULL,
            first_seen_at {timestamp_type} NOT NULL,
            last_seen_at {timestamp_type} NOT NULL,
            last_event_at {timestamp_type} NOT NULL,
            last_sequence BIGINT NOT NULL,
            pairing TEXT,
            content_hash TEXT,
            pairing_at {timestamp_type},
            compliant BOOLEAN,
            agent_version TEXT,
            last_health_status TEXT,
            heartbeat_at {timestamp_type}{policy_columns})""",
        _policy_bundles_table(timestamp_type, bytes_type) + f",\n            {_STAGED_COLUMN})",
        f"""CREATE TABLE IF NOT EXISTS audit (
            id {key_type},
            at {timestamp_type} NOT NULL,
            actor TEXT NOT NULL,
            role TEXT NOT NULL,
            action TEXT NOT NULL,
            serial BIGINT,
            detail TEXT NOT NULL)""",
        "CREATE INDEX IF NOT EXISTS audit_at ON audit (at)",
        _rollouts_table(timestamp_type) + f",\n            {_PAUSED_BY_COLUMN},\n            {_EVALUATIONS_COLUMN})",
        f"""CREATE TABLE IF NOT EXISTS rollout_hosts (
            rollout_id TEXT NOT NULL,
            host_id TEXT NOT NULL,
            cohort TEXT NOT NULL,
            stage INTEGER,
            admitted_at {timestamp_type},
            evidence TEXT,
            evidence_detail TEXT,
            PRIMARY KEY (rollout_id, host_id))""",
        workload_stacks.table(timestamp_type),
        *_CHANGE_INDEXES,
    ]


# Per older version, what brings a database of that version to the next; ``tables`` then adds the new tables.
MIGRATIONS: Dict[str, Callable[[Dialect], List[str]]] = {
    "1": lambda _dialect: [f"ALTER TABLE hosts ADD COLUMN {name} {kind}" for name, kind in _HOST_POLICY_COLUMNS],
    "2": lambda _dialect: [f"ALTER TABLE hosts ADD COLUMN {name} {kind}" for name, kind in _HOST_HEALTH_COLUMNS],
    # A version 1 database has no policy_bundles yet: made as version 3 had it, then given the new column.
    "3": lambda dialect: [_policy_bundles_table(dialect.timestamp_type, dialect.bytes_type) + ")",
                          f"ALTER TABLE policy_bundles ADD COLUMN {_STAGED_COLUMN}"],
    # A version 1 or 2 database has no rollouts yet: made as version 4 had it, then given the new column.
    "4": lambda dialect: [_rollouts_table(dialect.timestamp_type) + ")",
                          f"ALTER TABLE rollouts ADD COLUMN {_PAUSED_BY_COLUMN}"],
    "5": lambda _dialect: [f"ALTER TABLE hosts ADD COLUMN {name} {kind}" for name, kind in _HOST_REFUSAL_KIND_COLUMNS],
    # Version 7 adds only a table (workload_stacks), which ``tables`` makes.
    "6": lambda _dialect: [],
    "7": lambda _dialect: [f"ALTER TABLE hosts ADD COLUMN {name} {kind}" for name, kind in _HOST_ATTENTION_COLUMNS],
    "8": lambda _dialect: [f"ALTER TABLE hosts ADD COLUMN {name} {kind}"
                           for name, kind in _HOST_UNKNOWN_VERSIONS_COLUMNS],
    "9": lambda dialect: [f"ALTER TABLE hosts ADD COLUMN {name} {kind}"
                          for name, kind in _host_receipt_columns(dialect.timestamp_type)],
    # Version 11's indexes are made by ``tables``.
    "10": lambda _dialect: [f"ALTER TABLE rollouts ADD COLUMN {_EVALUATIONS_COLUMN}"],
    # Receipt order (``_RECEIPT_ORDER_INDEXES``, which ``tables`` then makes): the agent-clock indexes go.
    "11": lambda _dialect: [f"DROP INDEX IF EXISTS {name}" for name in _OCCURRED_ORDER_INDEXES],
}


def create(dialect: Dialect, cur: Any) -> str:
    """Create the tables that are missing, inside the caller's transaction; the schema version the database holds
    (this hub's ``SCHEMA_VERSION`` for a new database)."""
    dialect.lock(cur, SCHEMA_LOCK_KEY)
    cur.execute("CREATE TABLE IF NOT EXISTS hub_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
    cur.execute(dialect.sql("SELECT value FROM hub_meta WHERE key = ?"), ("schema_version",))
    row = cur.fetchone()
    found = str(row[0]) if row is not None else None
    while found in MIGRATIONS:
        for statement in MIGRATIONS[found](dialect):
            cur.execute(statement)
        found = str(int(found) + 1)
        cur.execute(dialect.sql("UPDATE hub_meta SET value = ? WHERE key = ?"), (found, "schema_version"))
    for statement in tables(dialect.timestamp_type, dialect.bytes_type, dialect.key_type):
        cur.execute(statement)
    cur.execute(dialect.sql(INSERT_META), ("schema_version", str(SCHEMA_VERSION)))
    cur.execute(dialect.sql("SELECT value FROM hub_meta WHERE key = ?"), ("schema_version",))
    return str(cur.fetchone()[0])


# --- events ------------------------------------------------------------------------------------------------------

def insert_events_sql(rows: int) -> str:
    """INSERT of ``rows`` events that skips stored ones and returns the keys it stored."""
    values = ", ".join(["(?, ?, ?, ?, ?, ?, ?, ?, ?)"] * rows)
    return ("INSERT INTO events (host_id, event_id, sequence, kind, severity, hostname, occurred_at, "
            f"received_at, body) VALUES {values} "
            "ON CONFLICT (host_id, event_id) DO NOTHING RETURNING host_id, event_id")


def event_params(events: Sequence[Event], received: Any, to_db_time: TimeToDb) -> List[Any]:
    """The parameters of ``insert_events_sql(len(events))``."""
    params: List[Any] = []
    for e in events:
        params += [e.host_id, e.event_id, e.sequence, e.payload.kind, e.severity, e.hostname,
                   to_db_time(e.occurred_at), received, e.model_dump_json()]
    return params


# --- hosts -------------------------------------------------------------------------------------------------------

def _newer(received: str, sequence: str) -> str:
    """The update is newer than the stored group: received later by the hub, or in the same commit with a higher
    (or equal) sequence; a group never received (NULL, rows from before version 10) is always replaced."""
    return (f"(hosts.{received} IS NULL OR excluded.{received} > hosts.{received} OR "
            f"(excluded.{received} = hosts.{received} AND excluded.{sequence} >= hosts.{sequence}))")


_NEWER_EVENT = "excluded.last_event_received_at IS NOT NULL AND " + _newer("last_event_received_at", "last_sequence")
_NEWER_PAIRING = "excluded.pairing_at IS NOT NULL AND " + _newer("pairing_received_at", "pairing_sequence")
_NEWER_HEARTBEAT = "excluded.heartbeat_at IS NOT NULL AND " + _newer("heartbeat_received_at", "heartbeat_sequence")


def _pick(column: str, condition: str) -> str:
    return f"{column} = CASE WHEN {condition} THEN excluded.{column} ELSE hosts.{column} END"


UPSERT_HOST = f"""
INSERT INTO hosts (host_id, hostname, first_seen_at, last_seen_at, last_event_at, last_sequence,
                   pairing, content_hash, pairing_at, compliant, agent_version, last_health_status, heartbeat_at,
                   labels, policy_source, policy_serial, policy_refused_serial, policy_refused_reason,
                   last_health_at, last_health_after_change, policy_refused_kind, policy_attention,
                   unknown_versions, last_event_received_at, pairing_received_at, pairing_sequence,
                   heartbeat_received_at, heartbeat_sequence, clock_skew_seconds)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
ON CONFLICT (host_id) DO UPDATE SET
    {_pick("hostname", _NEWER_EVENT)},
    {_pick("last_sequence", _NEWER_EVENT)},
    {_pick("last_event_at", _NEWER_EVENT)},
    {_pick("last_event_received_at", _NEWER_EVENT)},
    {_pick("last_seen_at", "excluded.last_seen_at >= hosts.last_seen_at")},
    {_pick("pairing", _NEWER_PAIRING)},
    {_pick("content_hash", _NEWER_PAIRING)},
    {_pick("pairing_at", _NEWER_PAIRING)},
    {_pick("pairing_sequence", _NEWER_PAIRING)},
    {_pick("pairing_received_at", _NEWER_PAIRING)},
    {_pick("compliant", _NEWER_HEARTBEAT)},
    {_pick("agent_version", _NEWER_HEARTBEAT)},
    {_pick("last_health_status", _NEWER_HEARTBEAT)},
    {_pick("labels", _NEWER_HEARTBEAT)},
    {_pick("policy_source", _NEWER_HEARTBEAT)},
    {_pick("policy_serial", _NEWER_HEARTBEAT)},
    {_pick("policy_refused_serial", _NEWER_HEARTBEAT)},
    {_pick("policy_refused_reason", _NEWER_HEARTBEAT)},
    {_pick("policy_refused_kind", _NEWER_HEARTBEAT)},
    {_pick("policy_attention", _NEWER_HEARTBEAT)},
    {_pick("unknown_versions", _NEWER_HEARTBEAT)},
    {_pick("last_health_at", _NEWER_HEARTBEAT)},
    {_pick("last_health_after_change", _NEWER_HEARTBEAT)},
    {_pick("heartbeat_at", _NEWER_HEARTBEAT)},
    {_pick("heartbeat_sequence", _NEWER_HEARTBEAT)},
    {_pick("heartbeat_received_at", _NEWER_HEARTBEAT)},
    {_pick("clock_skew_seconds", _NEWER_HEARTBEAT)}
"""


def host_params(u: HostUpdate, received_at: dt.datetime, to_db_time: TimeToDb) -> List[Any]:
    """The parameters of ``UPSERT_HOST`` for one update the hub received at ``received_at`` (its clock)."""
    def t(value: Optional[dt.datetime]) -> Any:
        return None if value is None else to_db_time(value)

    received = to_db_time(received_at)

    return [u.host_id, u.hostname, received, received, t(u.last_event_at), u.last_sequence, u.pairing_json,
            u.content_hash, t(u.pairing_at), u.compliant, u.agent_version, u.last_health_status,
            t(u.heartbeat_at), u.labels_json, u.policy_source, u.policy_serial, u.policy_refused_serial,
            u.policy_refused_reason, None if u.last_health_at is None else text_time(u.last_health_at),
            u.last_health_after_change, u.policy_refused_kind, u.policy_attention_json, u.unknown_versions_json,
            received if u.fresh else None,
            None if u.pairing_at is None else received, u.pairing_sequence,
            None if u.heartbeat_at is None else received, u.heartbeat_sequence,
            None if u.heartbeat_at is None else (u.heartbeat_at - received_at).total_seconds()]


# SELECT these from hosts, and host_from_row makes each row a HostRow.
HOST_COLUMNS = ("host_id, hostname, first_seen_at, last_seen_at, last_event_at, last_sequence, pairing, "
                "pairing_at, content_hash, compliant, agent_version, last_health_status, heartbeat_at, labels, "
                "policy_source, policy_serial, policy_refused_serial, policy_refused_reason, last_health_at, "
                "last_health_after_change, policy_refused_kind, policy_attention, unknown_versions, "
                "heartbeat_received_at, clock_skew_seconds")


def host_from_row(row: Sequence[Any], from_db_time: Callable[[Any], dt.datetime]) -> HostRow:
    """A row of ``HOST_COLUMNS`` as the host's state."""
    (host_id, hostname, first_seen, last_seen, last_event, last_sequence, pairing, pairing_at, content_hash,
     compliant, agent_version, last_health_status, heartbeat_at, labels, policy_source, policy_serial,
     policy_refused_serial, policy_refused_reason, last_health_at, last_health_after_change,
     policy_refused_kind, policy_attention, unknown_versions, heartbeat_received_at, clock_skew_seconds) = row

    def t(value: Any) -> Optional[dt.datetime]:
        return None if value is None else from_db_time(value)

    return HostRow(host_id=host_id, hostname=hostname, first_seen_at=from_db_time(first_seen),
                     last_seen_at=from_db_time(last_seen), last_event_at=from_db_time(last_event),
                     last_sequence=last_sequence,
                     pairing=Pairing.model_validate_json(pairing) if pairing is not None else None,
                     pairing_at=t(pairing_at), content_hash=content_hash,
                     compliant=None if compliant is None else bool(compliant), agent_version=agent_version,
                     last_health_status=last_health_status, heartbeat_at=t(heartbeat_at),
                     labels=json.loads(labels) if labels is not None else None, policy_source=policy_source,
                     policy_serial=policy_serial, policy_refused_serial=policy_refused_serial,
                     policy_refused_reason=policy_refused_reason, policy_refused_kind=policy_refused_kind,
                     policy_attention=None if policy_attention is None else tuple(json.loads(policy_attention)),
                     unknown_versions=None if unknown_versions is None else tuple(json.loads(unknown_versions)),
                     last_health_at=None if last_health_at is None else dt.datetime.fromisoformat(
                         last_health_at[:-1]).replace(tzinfo=dt.timezone.utc),
                     last_health_after_change=None if last_health_after_change is None
                     else bool(last_health_after_change), heartbeat_received_at=t(heartbeat_received_at),
                     clock_skew_seconds=None if clock_skew_seconds is None else float(clock_skew_seconds))


# What a rollout's control reads of a host not admitted (agent/hub/rollout_plan.py ``control_counts``): a few
# columns, not the whole row, as it reads every such host at each evaluation.
CONTROL_COLUMNS = "host_id, last_seen_at, last_health_status, last_health_at, heartbeat_at, heartbeat_received_at"


def control_row_from(row: Sequence[Any], from_db_time: Callable[[Any], dt.datetime]) -> ControlRow:
    """A row of ``CONTROL_COLUMNS``."""
    host_id, last_seen, status, health_at, heartbeat_at, heartbeat_received_at = row
    return ControlRow(host_id=host_id, last_seen_at=from_db_time(last_seen), last_health_status=status,
                      last_health_at=None if health_at is None else dt.datetime.fromisoformat(
                          health_at[:-1]).replace(tzinfo=dt.timezone.utc),
                      heartbeat_at=None if heartbeat_at is None else from_db_time(heartbeat_at),
                      heartbeat_received_at=None if heartbeat_received_at is None
                      else from_db_time(heartbeat_received_at))
