"""Take a snapshot: run every collector in isolation, derive findings, seal it with its content hash."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Dict, Optional, Sequence

from agent import __version__
from agent.collectors import default_collectors
from agent.collectors.base import Collector, run_collector
from agent.frozen import replace
from agent.host import Host
from agent.log import get_logger
from agent.snapshot.drift import analyze
from agent.snapshot.model import SECTION_NAMES, Snapshot, compute_content_hash
from agent.snapshot.rocm_release import settled

if TYPE_CHECKING:  # pragma: no cover
    from agent.policy.companions import ExporterTable
    from agent.policy.table_unknown import TheRockTable

log = get_logger("snapshot")


def take_snapshot(host: Host, collectors: Optional[Sequence[Collector]] = None,
                  exporter_table: Optional["ExporterTable"] = None,
                  therock_table: Optional["TheRockTable"] = None,
                  matrix: Optional[Dict[str, Any]] = None) -> Snapshot:
    """Collect every section from ``host``; never raises for a failing collector. ``exporter_table`` and
    ``therock_table``: gpuguard's dcgm-exporter and TheRock release tables in use for the findings (None: the
    package's); ``matrix``: AMD's matrix in its compiled form to report newer versions against (None: not judged
    against it; the daemon's snapshot passes the matrix of the policy in force, agent/daemon_jobs/snapshot.py, while
    ``gpuguard snapshot`` reads none: its start-up imports no pydantic, tests/test_cli_imports.py)."""
    started = time.monotonic()
    chosen = tuple(collectors) if collectors is not None else default_collectors()
    sections: Dict[str, Any] = {c.name: run_collector(c, host) for c in chosen}
    missing = [name for name in SECTION_NAMES if name not in sections]
    if missing:
        raise ValueError(f"collectors missing for snapshot sections: {missing}")
    draft = settled(Snapshot(agent_version=__version__, hostname=host.hostname(), taken_at=host.clock(), **sections))
    with_findings = replace(draft, findings=analyze(draft, matrix, exporter_table, therock_table))
    sealed = replace(with_findings, content_hash=compute_content_hash(with_findings))
    log.info("snapshot_taken", content_hash=sealed.content_hash, findings=len(sealed.findings),
             duration_seconds=round(time.monotonic() - started, 3))
    return sealed
