"""Gather what ``gpuguard status`` judges: the daemon's process, its state files, the outbox, the hub.

Each reader returns facts or a one-line ``problem`` (a damaged, unreadable or foreign file); nothing here
raises for bad state, so one broken file never hides the rest. The outbox is opened read-only (a status query
must not recover, rewrite or lock the daemon's file); large logs are read from their tail only.
"""

from __future__ import annotations

import datetime as dt
import errno
import json
import os
import sqlite3
import stat
import time
from typing import Any, Callable, Dict, List, Literal, Optional, Tuple

from agent.defaults import DEFAULT_POLICY_DIR
from agent.errors import GpuguardError
from agent.files import read_json_file
from agent.host import Host
from agent.integrations.reboot import booted_at_seconds
from agent.models import FrozenModel
from agent.statepaths import StatePaths
from agent.status.reboot import read_reboot_required

GUARD_TAIL_BYTES = 64 * 1024
METRICS_MAX_BYTES = 1024 * 1024
HUB_TIMEOUT_SECONDS = 3.0
SYSTEMD_UNIT = "gpuguard.service"


class DaemonFacts(FrozenModel):
    pids: List[int] = []
    systemd_state: Optional[str] = None  # None: no systemd on this host (or it could not be asked)


class LastSnapshot(FrozenModel):
    taken_at: Optional[dt.datetime] = None
    content_hash: Optional[str] = None
    critical_findings: int = 0
    warning_findings: int = 0
    # the messages of its "unknown_to_table" findings: versions newer than a compatibility table of gpuguard's knows
    unknown_to_table: List[str] = []
    problem: Optional[str] = None


class HealthFacts(FrozenModel):
    status: Optional[str] = None
    finished_at: Optional[dt.datetime] = None
    summary: Optional[str] = None
    problem: Optional[str] = None
    # The daemon is waiting for idle GPUs to run the full check (health-deferral.json): one line, else None.
    deferral: Optional[str] = None
    # Stored baseline figures beyond what the host's GPUs can do (agent/health/sku_limits.py): a captured baseline,
    # never compared with. One line each, the first few.
    suspicious_baseline: List[str] = []
    # The health gate's window (health-gate.json): the last pass, the changes since or the verdict that covered them.
    gate: Optional[str] = None
    gate_problem: Optional[str] = None  # a damaged health-gate.json (the gate falls back until it is deleted)


ChangeKind = Literal["health_rollback", "rollback", "transaction_blocked"]


class ChangeFacts(FrozenModel):
    """One change of the guarded packages gpuguard made or stopped: a rollback by the pairing policy (guard-events
    .jsonl), a health-gated rollback (health-rollback.json), a blocked transaction (guard-events.jsonl)."""

    kind: ChangeKind
    at: Optional[dt.datetime] = None
    # The rule (a pairing rollback, a block), or the health status that asked for a health rollback.
    reason: Optional[str] = None
    succeeded: Optional[bool] = None
    # Each package that moved, as ``name from -> to`` (a health rollback: the broken set -> the one kept before).
    moves: List[str] = []


class GuardFacts(FrozenModel):
    # The newest change of any kind (ChangeFacts), by its time; None: none recorded.
    last_change: Optional[ChangeFacts] = None
    last_kind: Optional[str] = None
    last_at: Optional[dt.datetime] = None
    last_message: Optional[str] = None
    last_succeeded: Optional[bool] = None
    problem: Optional[str] = None
    # A rollback moved kernel module packages (reboot-required.pkgs in the state directory): their names.
    reboot_required: Optional[List[str]] = None


class RollbackFacts(FrozenModel):
    """How many guarded packages a rollback can restore (rollback-coverage.json), None before any record."""

    guarded: Optional[int] = None
    restorable: Optional[int] = None
    by_source: Dict[str, int] = {}
    not_restorable: List[str] = []
    inexact: Dict[str, List[str]] = {}
    summary: Optional[str] = None  # "33/33 guarded packages restorable: 1 from the archive cache, 32 rebuilt ..."
    attention: List[str] = []  # the packages not restorable, or only inexactly, in words
    recorded_at: Optional[dt.datetime] = None


class MetricsFacts(FrozenModel):
    """What the daemon last published in its node_exporter textfile."""

    compliant: Optional[bool] = None
    written_at: Optional[dt.datetime] = None
    last_delivery_success_at: Optional[dt.datetime] = None
    problem: Optional[str] = None


class OutboxFacts(FrozenModel):
    depth: int = 0
    oldest_enqueued_at: Optional[dt.datetime] = None
    dropped_total: int = 0
    problem: Optional[str] = None


class HubFacts(FrozenModel):
    endpoint_url: Optional[str] = None
    checked: bool = False
    status_code: Optional[int] = None
    latency_ms: float = 0.0
    error: Optional[str] = None
    # This host's clock minus the hub's, from the answer's Date header (whole seconds; issue 43); None without one.
    clock_offset_seconds: Optional[float] = None


def clock_offset_seconds(date_header: Optional[str], local_at: dt.datetime) -> Optional[float]:
    """This host's clock at an answer (``local_at``) less the hub's ``Date`` in it: the HTTP date has whole seconds,
    so half a second is added to it. None for a missing or unreadable header (nothing is believed of it)."""
    import email.utils

    if not date_header or len(date_header) > 64:
        return None
    try:
        hub_at = email.utils.parsedate_to_datetime(date_header)
    except (TypeError, ValueError, IndexError):
        return None
    if hub_at.tzinfo is None:
        return None
    return round((local_at - hub_at).total_seconds() - 0.5, 1)


class PolicyFacts(FrozenModel):
    """Which policy is compiled ([guard] policy_source) and what the agent remembers of policy bundles."""

    source: str = "local"
    description: str = f"local {DEFAULT_POLICY_DIR}"
    bundle_serial: Optional[int] = None
    refused_serial: Optional[int] = None
    refused_reason: Optional[str] = None
    refused_kind: Optional[str] = None  # one of agent/wire.py's REFUSAL_KINDS
    refused_at: Optional[dt.datetime] = None
    refusal_pending: bool = False
    # The hub offers only serials below the one in force (offered: None when it offers none), since when.
    hub_below: bool = False
    hub_below_offered: Optional[int] = None
    hub_below_since: Optional[dt.datetime] = None
    rollout: Optional[str] = None  # the hub's staged-rollout notice (agent/bundle/rollout.py)
    bundle_expires: Optional[dt.datetime] = None  # when the bundle in force expires (None: never)
    stale: Optional[str] = None  # why the hub's freshness statement asks for attention (agent/bundle/state.py)
    # The compatibility tables the compiled policy judges with, each with its date and origin (package or bundle
    # serial N), as ``policy explain`` says them; None when no compiled policy can be read.
    tables: Optional[str] = None
    deny_serial: Optional[int] = None  # the deny list in force (agent/bundle/deny.py)
    # Installed here at a version the deny list names as known-bad, as the last policy fetch found them.
    denied_installed: Tuple[str, ...] = ()
    problem: Optional[str] = None


class MaintenanceFacts(FrozenModel):
    """The scheduler hand-off this host holds (maintenance.json, agent/integrations/maintenance.py); no phase: none."""

    phase: Optional[str] = None  # draining, held, rebooting (Slurm asked to reboot the node), kept (a check failed)
    scheduler: Optional[str] = None
    node: Optional[str] = None
    reason: Optional[str] = None
    detail: Optional[str] = None
    drained_by_us: bool = True
    began_at: Optional[dt.datetime] = None
    # Phase rebooting: when Slurm was asked, and when this machine last booted (/proc/stat; None: unknown).
    reboot_asked_at: Optional[dt.datetime] = None
    booted_at: Optional[dt.datetime] = None
    problem: Optional[str] = None


class StatusFacts(FrozenModel):
    gathered_at: dt.datetime
    config_path: str
    state_dir: str
    snapshot_interval_seconds: float
    health_enabled: bool
    health_interval_seconds: float
    delivery_interval_seconds: float
    daemon: DaemonFacts
    snapshot: LastSnapshot
    health: HealthFacts
    guard: GuardFacts
    rollback: RollbackFacts = RollbackFacts()
    metrics: MetricsFacts
    outbox: OutboxFacts
    hub: HubFacts
    policy: PolicyFacts = PolicyFacts()
    maintenance: MaintenanceFacts = MaintenanceFacts()


def _when(value: object) -> Optional[dt.datetime]:
    if not isinstance(value, str):
        return None
    try:
        parsed = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=dt.timezone.utc)


def _epoch(value: Optional[float]) -> Optional[dt.datetime]:
    return None if value is None else dt.datetime.fromtimestamp(value, dt.timezone.utc)


# --- pure parsers ------------------------------------------------------------------------------------------------

def is_daemon_cmdline(argv: List[str]) -> bool:
    """True for ``gpuguard run ...`` and ``python -m agent run ...`` (the daemon), whatever the interpreter."""
    for index, arg in enumerate(argv):
        program = os.path.basename(arg)
        after = argv[index + 1:]
        if program == "gpuguard" and after[:1] == ["run"]:
            return True
        if arg == "-m" and after[:2] == ["agent", "run"]:
            return True
    return False


def parse_textfile(text: str) -> Dict[str, float]:
    """Sample values of a Prometheus textfile by metric name (labels dropped, the last sample wins)."""
    values: Dict[str, float] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name_part, _, value = line.rpartition(" ")
        name = name_part.split("{", 1)[0]
        try:
            values[name] = float(value)
        except ValueError:
            continue
    return values


def last_json_line(tail: bytes, first_line_cut: bool = False) -> Optional[Dict[str, object]]:
    """The last complete JSON object line of a file's tail (None when there is none); ``first_line_cut`` when the
    tail starts inside the file, so its first line is a fragment."""
    lines = tail.split(b"\n")
    for raw in reversed(lines[1:] if first_line_cut else lines):
        raw = raw.strip()
        if not raw:
            continue
        try:
            record = json.loads(raw)
        except ValueError:
            continue
        if isinstance(record, dict):
            return record
    return None


def package_moves(from_versions: object, to_versions: object) -> List[str]:
    """``name from -> to`` for each package whose version differs between the two maps (absent: ``none``)."""
    before = from_versions if isinstance(from_versions, dict) else {}
    after = to_versions if isinstance(to_versions, dict) else {}
    return [f"{name} {before.get(name, 'none')} -> {after.get(name, 'none')}"
            for name in sorted(set(before) | set(after), key=str) if before.get(name) != after.get(name)]


def guard_change(record: Dict[str, object]) -> Optional[ChangeFacts]:
    """A guard-events line as a change (a rollback or a blocked transaction); None for any other kind."""
    kind = record.get("kind")
    if kind not in ("rollback", "transaction_blocked"):
        return None
    reason = record.get("rule") or record.get("reason")
    succeeded = record.get("succeeded")
    return ChangeFacts(kind="rollback" if kind == "rollback" else "transaction_blocked",
                       at=_when(record.get("occurred_at")), reason=str(reason)[:200] if reason else None,
                       succeeded=succeeded if isinstance(succeeded, bool) else None,
                       moves=package_moves(record.get("from_versions"), record.get("to_versions")))


def last_guard_change(tail: bytes, first_line_cut: bool = False) -> Optional[ChangeFacts]:
    """The last rollback or blocked transaction in a guard-events tail (the file is in the order things happened)."""
    lines = tail.split(b"\n")
    for raw in reversed(lines[1:] if first_line_cut else lines):
        try:
            record = json.loads(raw)
        except ValueError:
            continue
        change = guard_change(record) if isinstance(record, dict) else None
        if change is not None:
            return change
    return None


def health_rollback_change(data: object) -> Optional[ChangeFacts]:
    """health-rollback.json (agent/guard/rollback/health.py) as a change; None when it is no such record."""
    if not isinstance(data, dict) or _when(data.get("at")) is None:
        return None
    status = data.get("health_status")
    return ChangeFacts(kind="health_rollback", at=_when(data["at"]),
                       reason=f"the health check found {status}" if isinstance(status, str) else None,
                       succeeded=data.get("status") == "rolled_back",
                       moves=package_moves(data.get("from_versions"), data.get("to_versions")))


def newest_change(*changes: Optional[ChangeFacts]) -> Optional[ChangeFacts]:
    """The change with the latest time (one without a time counts as the oldest); None when there is none."""
    known = [c for c in changes if c is not None]
    floor = dt.datetime.min.replace(tzinfo=dt.timezone.utc)
    return max(known, key=lambda c: c.at or floor) if known else None


# --- readers -----------------------------------------------------------------------------------------------------

def read_daemon(host: Host) -> DaemonFacts:
    """Processes running the daemon (from /proc under the host root) and the systemd unit's state."""
    pids = []
    proc = host.path("/proc")
    try:
        entries = [name for name in os.listdir(proc) if name.isdigit()]
    except OSError:
        entries = []
    for name in entries:
        try:
            with open(proc / name / "cmdline", "rb") as handle:
                argv = [part.decode("utf-8", "replace") for part in handle.read(4096).split(b"\0") if part]
        except OSError:
            continue  # gone, or not ours to read
        if is_daemon_cmdline(argv) and int(name) != os.getpid():
            pids.append(int(name))
    systemd_state = None
    if host.path("/run/systemd/system").is_dir():
        try:
            result = host.run(["systemctl", "is-active", SYSTEMD_UNIT], timeout_seconds=5)
            systemd_state = result.stdout.strip() or None
        except GpuguardError:
            systemd_state = None
    return DaemonFacts(pids=sorted(pids), systemd_state=systemd_state)


def read_snapshot(path: str) -> LastSnapshot:
    try:
        data = read_json_file(path)
    except GpuguardError as exc:
        return LastSnapshot(problem=str(exc))
    if data is None:
        return LastSnapshot()
    if not isinstance(data, dict) or _when(data.get("taken_at")) is None:
        return LastSnapshot(problem=f"{path}: not a gpuguard snapshot (no taken_at)")
    findings = data.get("findings")
    severities = [f.get("severity") for f in findings if isinstance(f, dict)] if isinstance(findings, list) else []
    hash_value = data.get("content_hash")
    unknown = [str(f.get("message")) for f in findings if isinstance(f, dict) and f.get("kind") == "unknown_to_table"] \
        if isinstance(findings, list) else []
    return LastSnapshot(taken_at=_when(data["taken_at"]), content_hash=hash_value if isinstance(hash_value, str)
                         else None, critical_findings=severities.count("critical"),
                         warning_findings=severities.count("warning"), unknown_to_table=unknown[:5])


def read_health(path: str) -> HealthFacts:
    try:
        data = read_json_file(path)
    except GpuguardError as exc:
        return HealthFacts(problem=str(exc))
    if data is None:
        return HealthFacts()
    started = _when(data.get("started_at")) if isinstance(data, dict) else None
    if not isinstance(data, dict) or started is None or not isinstance(data.get("status"), str):
        return HealthFacts(problem=f"{path}: not a health result (no status or started_at)")
    wall = data.get("wall_seconds")
    finished = started + dt.timedelta(seconds=float(wall)) if isinstance(wall, (int, float)) else started
    summary = data.get("summary")
    return HealthFacts(status=data["status"], finished_at=finished,
                       summary=summary[:200] if isinstance(summary, str) else None)


def read_deferral(path: str) -> Optional[str]:
    """The daemon's deferral in progress (agent/daemon_jobs/health_schedule.py) as one line; None without one."""
    try:
        data = read_json_file(path)
    except GpuguardError:
        return None
    if not isinstance(data, dict) or _when(data.get("since")) is None:
        return None
    tenants = data.get("tenants") if isinstance(data.get("tenants"), list) else []
    line = (f"full check deferred since {data['since']} ({data.get('attempts')} attempt(s), next at "
            f"{data.get('next_attempt_at')})")
    return line + (f"; in use by {'; '.join(str(t) for t in tenants[:3])}" if tenants else "")


def read_suspicious_baseline(host: Host, paths: StatePaths) -> List[str]:
    """The stored baseline figures beyond the host's SKU limits (from the last snapshot's GPUs); [] without a
    baselines file, or when it cannot be read (the next health check says why)."""
    from pathlib import Path

    from agent.health.baseline import BaselineStore, last_snapshot_limits, suspicious_baselines

    try:
        data = BaselineStore(Path(paths.health_baselines)).load()
    except GpuguardError:
        return []
    if not data.records:
        return []
    limits = last_snapshot_limits(host, paths.last_snapshot)
    return [s.describe() for s in suspicious_baselines(data, limits)][:5]


def read_gate(path: str) -> Tuple[Optional[str], Optional[str]]:
    """The health gate's window (agent/guard/rollback/health_gate.py) as one line, and the problem of a damaged file."""
    from agent.guard.rollback.health_gate import GateStateDamaged, describe_changes, load_gate

    try:
        state = load_gate(path)
    except GateStateDamaged as exc:
        return None, str(exc)

    def at(seconds: float) -> str:
        return dt.datetime.fromtimestamp(seconds, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")

    passed = f"last pass {at(state.passed_at_seconds)}" if state.passed_at_seconds is not None else "no pass yet"
    if state.window_open:
        return f"gate: {passed}; since then {describe_changes(state.changes, state.dropped)}, not judged yet", None
    v = state.verdict
    if v is None:
        return (None if state.passed_at_seconds is None else f"gate: {passed}"), None
    covered = describe_changes(v.covers, v.dropped)
    if v.outcome == "passed":
        return f"gate: {passed}" + (f", covering {covered}" if v.covers or v.dropped else ""), None
    return f"gate: {passed}; {v.status} at {at(v.at_seconds)} ({v.outcome}) covering {covered}", None


def _read_tail(path: str, max_bytes: int) -> Tuple[bytes, int, float]:
    """The last ``max_bytes`` of a regular file, where they start, and its mtime. Opened non-blocking: a FIFO in
    place of a state file is refused at once (OSError), not waited on."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise OSError(errno.EINVAL, "not a regular file")
        start = max(0, info.st_size - max_bytes)
        os.lseek(fd, start, os.SEEK_SET)
        return os.read(fd, max_bytes), start, info.st_mtime
    finally:
        os.close(fd)


def read_guard(path: str) -> GuardFacts:
    try:
        tail, start, _ = _read_tail(path, GUARD_TAIL_BYTES)
    except FileNotFoundError:
        return GuardFacts()
    except OSError as exc:
        return GuardFacts(problem=f"{path}: {exc.strerror or exc}")
    record = last_json_line(tail, first_line_cut=start > 0)
    if record is None:
        return GuardFacts() if not tail.strip() else GuardFacts(problem=f"{path}: no readable event in its tail")
    kind = record.get("kind")
    message = record.get("message") or record.get("rule") or record.get("reason")
    succeeded = record.get("succeeded")
    return GuardFacts(last_kind=kind if isinstance(kind, str) else "unknown", last_at=_when(record.get("occurred_at")),
                      last_message=str(message)[:200] if message is not None else None,
                      last_succeeded=succeeded if isinstance(succeeded, bool) else None,
                      last_change=last_guard_change(tail, first_line_cut=start > 0))


def read_health_rollback(path: str) -> Optional[ChangeFacts]:
    """The last health-gated rollback (health-rollback.json) as a change; None without one or when unreadable."""
    try:
        return health_rollback_change(read_json_file(path))
    except GpuguardError:
        return None


def read_changes(guard_events_path: str, health_rollback_path: str) -> GuardFacts:
    """The guard's facts with the newest change of any kind: the log's last rollback or block, or the health
    rollback, whichever happened last (a health rollback is in its own file, not in the guard's log)."""
    guard = read_guard(guard_events_path)
    newest = newest_change(guard.last_change, read_health_rollback(health_rollback_path))
    return guard.model_copy(update={"last_change": newest})


def read_metrics(path: Optional[str]) -> MetricsFacts:
    if path is None:
        return MetricsFacts(problem="metrics are off (report.metrics_enabled = false): compliance unknown")
    try:
        raw, _, written = _read_tail(path, METRICS_MAX_BYTES)
    except FileNotFoundError:
        return MetricsFacts()
    except OSError as exc:
        return MetricsFacts(problem=f"{path}: {exc.strerror or exc}")
    values = parse_textfile(raw.decode("utf-8", "replace"))
    compliant = values.get("gpuguard_compliant")
    return MetricsFacts(compliant=None if compliant is None else compliant == 1.0, written_at=_epoch(written),
                        last_delivery_success_at=_epoch(values.get("gpuguard_last_delivery_success_timestamp_seconds")))


def read_outbox(path: str) -> OutboxFacts:
    if not os.path.exists(path):
        return OutboxFacts()
    if not os.path.isfile(path):
        return OutboxFacts(problem=f"{path}: not a regular file")
    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=2.0)
        try:
            depth, oldest = conn.execute("SELECT COUNT(*), MIN(enqueued_at) FROM events").fetchone()
            dropped = conn.execute("SELECT COALESCE(SUM(count), 0) FROM dropped").fetchone()[0]
        finally:
            conn.close()
    except sqlite3.Error as exc:
        return OutboxFacts(problem=f"{path}: unreadable outbox ({exc}); the daemon salvages it on its next check")
    return OutboxFacts(depth=int(depth), oldest_enqueued_at=_epoch(oldest), dropped_total=int(dropped))


def read_rollback_coverage(host: Host, paths: StatePaths) -> RollbackFacts:
    """The rollback coverage the last recording wrote, each kept file checked to be there still."""
    from agent.rollback_coverage import read_coverage

    coverage = read_coverage(str(host.path(paths.rollback_coverage)), str(host.root))
    if coverage is None:
        return RollbackFacts()
    return RollbackFacts(guarded=coverage.guarded, restorable=coverage.restorable, by_source=coverage.by_source,
                         not_restorable=list(coverage.not_restorable),
                         inexact={k: list(v) for k, v in coverage.inexact.items()}, summary=coverage.summary(),
                         attention=coverage.attention(),
                         recorded_at=_when(coverage.recorded_at))


def read_maintenance(host: Host, paths: StatePaths) -> MaintenanceFacts:
    """The hand-off hold as persisted; a damaged record is a one-line problem naming the file."""
    from agent.integrations.hold import read_state

    try:
        state = read_state(host, paths)
    except GpuguardError as exc:
        return MaintenanceFacts(problem=str(exc))
    if state is None:
        return MaintenanceFacts()
    return MaintenanceFacts(phase=state.phase, scheduler=state.scheduler, node=state.node, reason=state.reason,
                            detail=state.detail or None, drained_by_us=state.drained_by_us,
                            began_at=_epoch(state.began_at_seconds),
                            reboot_asked_at=_epoch(state.reboot_asked_at_seconds),
                            booted_at=_epoch(booted_at_seconds(host)) if state.phase == "rebooting" else None)


def probe_hub(endpoint_url: str, ca_bundle: Optional[str], timeout_seconds: float = HUB_TIMEOUT_SECONDS) -> HubFacts:
    """GET the hub's /healthz once, bounded by ``timeout_seconds``; any HTTP answer means reachable."""
    import requests

    started = time.monotonic()
    try:
        answer = requests.get(f"{endpoint_url}/healthz", timeout=(timeout_seconds, timeout_seconds),
                              verify=ca_bundle or True, allow_redirects=False)
    except requests.RequestException as exc:
        reason = type(exc).__name__
        return HubFacts(endpoint_url=endpoint_url, checked=True, error=reason,
                        latency_ms=(time.monotonic() - started) * 1000)
    return HubFacts(endpoint_url=endpoint_url, checked=True, status_code=answer.status_code,
                    latency_ms=(time.monotonic() - started) * 1000,
                    clock_offset_seconds=clock_offset_seconds(answer.headers.get("Date"),
                                                              dt.datetime.now(dt.timezone.utc)))


def _tables(compiled_path: str) -> Optional[str]:
    """The compatibility tables line of the compiled policy in force (agent/policy/explain.py); None when it cannot
    be read (the guard check says why) or the policy reads no table."""
    from agent.errors import GpuguardError
    from agent.policy.compiled import read_compiled
    from agent.policy.explain import tables_line

    try:
        compiled = read_compiled(compiled_path)
        return tables_line(compiled) if compiled.section("knowledge") or compiled.section("matrix") else None
    except (GpuguardError, ValueError):
        return None


def read_policy(host: Host, guard: Any, state_dir: str) -> PolicyFacts:
    """The policy source the settings choose and the bundle state (agent/bundle/state.py)."""
    from agent.bundle.source import describe_bundle
    from agent.bundle.state import read_bundle_state
    from agent.errors import GpuguardError

    described = f"local {guard.policy_path}"
    try:
        state = read_bundle_state(str(host.path(StatePaths(state_dir).policy_bundle_state)))
    except GpuguardError as exc:
        return PolicyFacts(source=guard.policy_source, description=described, problem=str(exc))
    if guard.policy_source == "bundle":
        described = describe_bundle(state)
    refused = state.refused
    return PolicyFacts(source=guard.policy_source, description=described, bundle_serial=state.serial,
                       tables=_tables(str(host.path(StatePaths(state_dir).compiled_policy))),
                       refused_serial=refused.serial if refused else None,
                       refused_reason=refused.reason if refused else None, refused_at=refused.at if refused else None,
                       refused_kind=refused.kind if refused else None, hub_below=state.hub_below is not None,
                       hub_below_offered=state.hub_below.offered_serial if state.hub_below else None,
                       hub_below_since=state.hub_below.since if state.hub_below else None,
                       refusal_pending=state.refusal_pending, rollout=state.rollout, bundle_expires=state.expires,
                       stale=state.stale(host.clock()), deny_serial=state.deny_serial,
                       denied_installed=state.denied_installed)


def gather(host: Host, config_path: str, offline: bool,
           hub_probe: Callable[[str, Optional[str]], HubFacts] = probe_hub) -> StatusFacts:
    """Every fact, read now. A broken agent.toml is the one error raised (ConfigError, exit 3)."""
    from agent.config import load_settings

    settings = load_settings(config_path)
    state_dir = settings.agent.state_dir
    paths = StatePaths(state_dir)
    report = settings.report

    if report.endpoint_url is None:
        hub = HubFacts()
    elif offline:
        hub = HubFacts(endpoint_url=report.endpoint_url)
    else:
        hub = hub_probe(report.endpoint_url, report.ca_bundle)
    gate, gate_problem = read_gate(str(host.path(paths.health_gate)))  # where the guard's job child writes it
    return StatusFacts(
        gathered_at=host.clock(), config_path=config_path, state_dir=state_dir,
        snapshot_interval_seconds=settings.snapshot.interval_seconds, health_enabled=settings.daemon.health_enabled,
        health_interval_seconds=settings.daemon.health_interval_seconds,
        delivery_interval_seconds=report.delivery_interval_seconds,
        daemon=read_daemon(host), snapshot=read_snapshot(paths.last_snapshot),
        health=read_health(paths.health_last_result).model_copy(
            update={"deferral": read_deferral(paths.health_deferral), "gate": gate, "gate_problem": gate_problem,
                    "suspicious_baseline": read_suspicious_baseline(host, paths)}),
        guard=read_changes(str(host.path(paths.guard_events)), str(host.path(paths.health_rollback))).model_copy(
            update={"reboot_required": read_reboot_required(
                str(host.path(paths.reboot_required_packages)), booted_at_seconds(host))}),
        rollback=read_rollback_coverage(host, paths),
        metrics=read_metrics(report.metrics_path(state_dir)), outbox=read_outbox(paths.outbox),
        hub=hub, policy=read_policy(host, settings.guard, state_dir), maintenance=read_maintenance(host, paths))
