"""The metrics job: rewrite the node_exporter textfile from the daemon's state and the outbox when it changed, then
the NFD features file from the same state (daemon_jobs/nfd.py)."""

from __future__ import annotations

import threading
from typing import Optional

from agent import __version__
from agent.daemon_jobs.nfd import NfdJob
from agent.daemon_jobs.runtime import Runtime
from agent.report.metrics import MetricsView, render_metrics, write_textfile
from agent.rollback_coverage import read_coverage
from agent.statepaths import StatePaths


def metrics_view(runtime: Runtime) -> MetricsView:
    """Gather what the textfile shows."""
    state, outbox = runtime.state, runtime.outbox
    depth, oldest = outbox.depth(), outbox.oldest_age_seconds()
    coverage = read_coverage(runtime.host.file(StatePaths(runtime.settings.state_dir).rollback_coverage),
                             str(runtime.host.root))
    dropped, rejected = outbox.dropped_counts(), outbox.rejected_count()
    with state.lock:
        facts = state.snapshot_facts
        return MetricsView(agent_version=__version__, start_time_seconds=round(state.started_at_seconds, 3),
                           pairing=state.pairing, compliant=state.compliant,
                           snapshot_timestamp_seconds=facts.taken_at_seconds if facts else None,
                           findings_by_severity=dict(facts.findings_by_severity) if facts else {},
                           last_health_status=state.last_health_status,
                           last_health_timestamp_seconds=state.last_health_at_seconds,
                           outbox_depth=depth, outbox_oldest_age_seconds=oldest, outbox_dropped=dropped,
                           outbox_rejected=rejected, last_delivery_success_seconds=state.last_delivery_success_seconds,
                           delivery_failures=dict(state.delivery_failures),
                           rollback_guarded=coverage.guarded if coverage else None,
                           rollback_by_source=dict(coverage.by_source) if coverage else {},
                           rollback_inexact=len(coverage.inexact) if coverage else 0)


class MetricsJob:
    """Writes the textfile (atomically) whenever its content differs from what was last written; then the NFD
    features file, which runs after every job and every minute with it."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.nfd = NfdJob(runtime)
        self._written: Optional[str] = None
        self._lock = threading.Lock()

    def run(self, reason: str = "interval") -> None:
        try:
            self._write_textfile()
        finally:
            self.nfd.run(reason)

    def _write_textfile(self) -> None:
        path = self.runtime.settings.metrics_path
        if path is None:
            return
        with self._lock:
            text = render_metrics(metrics_view(self.runtime))
            if text != self._written:
                write_textfile(path, text)
                self._written = text
