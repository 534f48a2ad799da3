"""The snapshot job: take a snapshot, report a changed content hash, evaluate the policy, keep the last one."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Sequence, Tuple, TypeVar

from agent.collectors import default_collectors
from agent.collectors.base import Collector
from agent.config import Settings
from agent.daemon_jobs.hooks import PolicyCheck
from agent.daemon_jobs.runtime import Runtime, load_last_snapshot
from agent.files import write_atomically
from agent.host import Host
from agent.log import get_logger
from agent.report.events import PolicyViolation, SnapshotChanged
from agent.snapshot.diff import SnapshotDiff, diff_snapshots
from agent.snapshot.model import Snapshot
from agent.snapshot.pairing import pairing_of
from agent.snapshot.take import take_snapshot

if TYPE_CHECKING:  # pragma: no cover
    from agent.policy.companions import ExporterTable
    from agent.policy.table_unknown import TheRockTable

log = get_logger("snapshot_job")

# A change in any of these sections moves the GPU stack: the health check should run again.
STACK_SECTIONS = frozenset({"kernel", "dkms", "dpkg", "rpm", "amdgpu", "rocm", "nvidia", "cuda"})


def stack_changed(diff: SnapshotDiff) -> bool:
    """True when the diff touches the kernel, drivers, ROCm/CUDA or watched packages."""
    return any(change.section in STACK_SECTIONS for change in diff.changes)


_Table = TypeVar("_Table")


def _table(read: Callable[[], _Table]) -> Optional[_Table]:
    """A knowledge table in use, or None (logged) when it cannot be read."""
    from agent.errors import GpuguardError

    try:
        return read()
    except GpuguardError as exc:
        log.warning("knowledge_unreadable", error=str(exc))
        return None


class SnapshotJob:
    """Takes snapshots; on a new content hash commits SnapshotChanged (with the diff) before storing the snapshot."""

    def __init__(self, runtime: Runtime, policy_check: Optional[PolicyCheck],
                 on_stack_changed: Callable[[str], None] = lambda reason: None,
                 take: Callable[[Host, Sequence[Collector], Optional[ExporterTable], Optional[TheRockTable],
                                 Optional[Dict[str, Any]]], Snapshot] = take_snapshot
                 ) -> None:
        self.runtime = runtime
        self.policy_check = policy_check
        self.on_stack_changed = on_stack_changed
        self._take = take
        state = runtime.state
        if state.last_snapshot is None:
            previous = load_last_snapshot(runtime)
            if previous is not None:
                state.keep_snapshot(previous, pairing_of(previous))

    def _tables(self, settings: Settings) -> Tuple[Optional[ExporterTable], Optional[TheRockTable]]:
        """The dcgm-exporter and TheRock release tables the guard judges with (each the package's, or the signed
        bundle's in force where dated later), so the snapshot's findings agree with the hook and ``policy explain``;
        None for one that cannot be told (the snapshot then reads the package's, or says it cannot)."""
        from agent.bundle.source import policy_source
        from agent.errors import GpuguardError

        try:
            source = policy_source(self.runtime.host, settings.guard, settings.agent.state_dir)
        except GpuguardError as exc:
            log.warning("knowledge_unreadable", error=str(exc))
            return None, None
        return _table(source.exporter_table), _table(source.therock_table)

    def _matrix(self, settings: Settings) -> Optional[Dict[str, Any]]:
        """AMD's matrix of the policy in force (the configured or the bundle's, else the shipped one), in its compiled
        form, for the findings of versions newer than it; None, logged, when it cannot be read (nothing is then
        reported as newer than it)."""
        from agent.bundle.source import policy_source
        from agent.errors import GpuguardError
        from agent.policy.matrix import load_matrix

        try:
            source = policy_source(self.runtime.host, settings.guard, settings.agent.state_dir)
            return load_matrix(source.matrix_path).to_compiled()
        except GpuguardError as exc:
            log.warning("snapshot_matrix_unreadable", error=str(exc))
            return None

    def run(self, reason: str = "interval") -> None:
        rt = self.runtime
        settings = rt.job_settings()
        exporter_table, therock_table = self._tables(settings)
        snap = self._take(rt.host, default_collectors(settings.snapshot.all_watched_packages), exporter_table,
                          therock_table, self._matrix(settings))
        previous = rt.state.last_snapshot
        pairing = pairing_of(snap)
        diff: Optional[SnapshotDiff] = None
        if previous is None or previous.content_hash != snap.content_hash:
            diff = diff_snapshots(previous, snap) if previous is not None else None
            pairing_moved = previous is not None and pairing_of(previous) != pairing
            # Committed before the snapshot file is replaced: a crash in between re-reports, never loses.
            rt.emitter.emit(SnapshotChanged(old_hash=previous.content_hash if previous else None,
                                            new_hash=snap.content_hash, changes=diff.changes if diff else [],
                                            pairing=pairing),
                            severity="warning" if pairing_moved else "info")
            log.info("snapshot_changed", reason=reason, old_hash=previous.content_hash if previous else None,
                     new_hash=snap.content_hash, changes=len(diff.changes) if diff else 0)
        self._evaluate_policy(snap)
        write_atomically(rt.paths.last_snapshot, snap.to_json(), mode=0o600)
        rt.state.keep_snapshot(snap, pairing)
        if rt.emitter.hostname != snap.hostname:
            rt.emitter.hostname = snap.hostname
        if diff is not None and stack_changed(diff):
            self.on_stack_changed(f"stack_changed:{','.join(s for s in diff.changed_sections if s in STACK_SECTIONS)}")

    def _evaluate_policy(self, snap: Snapshot) -> None:
        rt = self.runtime
        check = self.policy_check
        if check is None:
            return
        try:
            verdict = check(snap, rt.settings.state_dir, root=str(rt.host.root))
        except Exception as exc:  # noqa: BLE001 - the policy engine's failure must not stop snapshots
            log.error("policy_check_failed", error=f"{type(exc).__name__}: {exc}")
            rt.state.compliant = None
            return
        if verdict is None:  # no policy installed: compliance is unknown, not "compliant"
            with rt.state.lock:
                rt.state.compliant = None
                rt.state.violated_rules = frozenset()
            return
        violations: List[PolicyViolation] = list(verdict)
        rules = frozenset(v.rule for v in violations)
        for violation in violations:
            if violation.rule not in rt.state.violated_rules:
                rt.emitter.emit(violation, severity="critical" if violation.action != "warn" else "warning")
                log.warning("policy_violation", rule=violation.rule, action=violation.action)
        with rt.state.lock:
            rt.state.compliant = not violations
            rt.state.violated_rules = rules
