"""Prometheus metrics as a node_exporter textfile (``--collector.textfile.directory``), written atomically.

Metrics (all gauges unless said otherwise):
    gpuguard_agent_info{version}                   1
    gpuguard_agent_start_time_seconds              when the daemon started (Unix time)
    gpuguard_pairing_info{os_id, os_version_id, kernel_running, kernel_next_boot, amdgpu_loaded,
                          amdgpu_dkms_package, rocm, rocm_core_package, rocm_releases, nvidia_loaded,
                          cuda_driver_api, gpu_models}  1 (labels say the current pairing; "" when absent)
    gpuguard_gpu_count                             GPUs in the last snapshot
    gpuguard_snapshot_timestamp_seconds            when the last snapshot was taken
    gpuguard_snapshot_findings{severity}           findings in the last snapshot, per severity
    gpuguard_compliant                             1 compliant with the pairing policy, 0 not (absent: unknown)
    gpuguard_last_health_status{status}            1 for the last health result's status (absent: none yet)
    gpuguard_last_health_timestamp_seconds         when the last health check finished
    gpuguard_outbox_depth                          events waiting for delivery
    gpuguard_outbox_oldest_event_age_seconds       how long the oldest waiting event has waited (0 when empty)
    gpuguard_outbox_dropped_total{kind}            counter: events dropped by the outbox size bound
    gpuguard_outbox_rejected_total                 counter: events the endpoint refused as invalid
    gpuguard_last_delivery_success_timestamp_seconds   last time a batch was acknowledged
    gpuguard_delivery_failures_total{category}     counter since start: failed delivery attempts, per cause
    gpuguard_rollback_guarded_packages             guarded packages of the known-good set (absent: none recorded)
    gpuguard_rollback_restorable_packages{source}  of them, restorable from a kept file, per source (archive cache,
                                                   repository, rebuilt)
    gpuguard_rollback_inexact_packages             of them, restorable only from an inexact rebuild
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

from agent.files import write_atomically
from agent.report.plain import PlainPairing

_PAIRING_LABELS = ("os_id", "os_version_id", "kernel_running", "kernel_next_boot", "amdgpu_loaded",
                   "amdgpu_dkms_package", "rocm", "rocm_core_package", "rocm_releases", "nvidia_loaded",
                   "cuda_driver_api", "gpu_models")


@dataclass(frozen=True)
class MetricsView:
    """Everything the textfile shows, gathered by the daemon from its state and the outbox."""

    agent_version: str
    start_time_seconds: float
    pairing: Optional[PlainPairing] = None
    snapshot_timestamp_seconds: Optional[float] = None
    findings_by_severity: Dict[str, int] = field(default_factory=dict)
    compliant: Optional[bool] = None
    last_health_status: Optional[str] = None
    last_health_timestamp_seconds: Optional[float] = None
    outbox_depth: int = 0
    outbox_oldest_age_seconds: Optional[float] = None
    outbox_dropped: Dict[str, int] = field(default_factory=dict)
    outbox_rejected: int = 0
    last_delivery_success_seconds: Optional[float] = None
    delivery_failures: Dict[str, int] = field(default_factory=dict)
    rollback_guarded: Optional[int] = None  # rollback-coverage.json (agent.rollback_coverage); None: no record
    rollback_by_source: Dict[str, int] = field(default_factory=dict)
    rollback_inexact: int = 0


def escape_label_value(value: str) -> str:
    """Escape a label value for the Prometheus text format."""
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(pairs: Dict[str, str]) -> str:
    if not pairs:
        return ""
    return "{" + ",".join(f'{k}="{escape_label_value(v)}"' for k, v in pairs.items()) + "}"


def _number(value: float) -> str:
    return repr(float(value)) if not float(value).is_integer() else str(int(value))


class _Writer:
    def __init__(self) -> None:
        self.lines: List[str] = []

    def family(self, name: str, kind: str, help_text: str, samples: List[Tuple[Dict[str, str], float]]) -> None:
        if not samples:
            return
        self.lines.append(f"# HELP {name} {help_text}")
        self.lines.append(f"# TYPE {name} {kind}")
        for labels, value in samples:
            self.lines.append(f"{name}{_labels(labels)} {_number(value)}")


def render_metrics(view: MetricsView) -> str:
    """The textfile body for a view (pure)."""
    w = _Writer()
    w.family("gpuguard_agent_info", "gauge", "gpuguard agent version.", [({"version": view.agent_version}, 1)])
    w.family("gpuguard_agent_start_time_seconds", "gauge", "When the gpuguard daemon started (Unix time).",
             [({}, view.start_time_seconds)])
    if view.pairing is not None:
        dumped = view.pairing.to_json()
        labels = {name: "" if dumped.get(name) is None else str(dumped[name]) for name in _PAIRING_LABELS}
        w.family("gpuguard_pairing_info", "gauge", "The host's current kernel/driver/ROCm/CUDA pairing.",
                 [(labels, 1)])
        w.family("gpuguard_gpu_count", "gauge", "GPUs seen in the last snapshot.", [({}, view.pairing.gpu_count)])
    if view.snapshot_timestamp_seconds is not None:
        w.family("gpuguard_snapshot_timestamp_seconds", "gauge", "When the last snapshot was taken (Unix time).",
                 [({}, view.snapshot_timestamp_seconds)])
        w.family("gpuguard_snapshot_findings", "gauge", "Findings in the last snapshot, per severity.",
                 [({"severity": s}, view.findings_by_severity.get(s, 0)) for s in ("info", "warning", "critical")])
    if view.compliant is not None:
        w.family("gpuguard_compliant", "gauge", "1 if the installed stack satisfies the pairing policy, else 0.",
                 [({}, 1 if view.compliant else 0)])
    if view.last_health_status is not None:
        w.family("gpuguard_last_health_status", "gauge", "The status of the last health check (value 1).",
                 [({"status": view.last_health_status}, 1)])
    if view.last_health_timestamp_seconds is not None:
        w.family("gpuguard_last_health_timestamp_seconds", "gauge", "When the last health check finished.",
                 [({}, view.last_health_timestamp_seconds)])
    w.family("gpuguard_outbox_depth", "gauge", "Report events waiting for delivery.", [({}, view.outbox_depth)])
    w.family("gpuguard_outbox_oldest_event_age_seconds", "gauge", "Age of the oldest event waiting for delivery.",
             [({}, round(view.outbox_oldest_age_seconds or 0.0, 3))])
    w.family("gpuguard_outbox_dropped_total", "counter", "Events dropped by the outbox size bound, per kind.",
             [({"kind": k}, v) for k, v in sorted(view.outbox_dropped.items())])
    w.family("gpuguard_outbox_rejected_total", "counter", "Events the endpoint refused as invalid.",
             [({}, view.outbox_rejected)])
    if view.last_delivery_success_seconds is not None:
        w.family("gpuguard_last_delivery_success_timestamp_seconds", "gauge",
                 "When the endpoint last acknowledged a batch (Unix time).",
                 [({}, view.last_delivery_success_seconds)])
    w.family("gpuguard_delivery_failures_total", "counter", "Failed delivery attempts since start, per cause.",
             [({"category": k}, v) for k, v in sorted(view.delivery_failures.items())])
    if view.rollback_guarded is not None:
        w.family("gpuguard_rollback_guarded_packages", "gauge", "Guarded packages of the known-good set.",
                 [({}, view.rollback_guarded)])
        w.family("gpuguard_rollback_restorable_packages", "gauge", "Guarded packages a rollback can restore from a "
                 "kept package file, per source.",
                 [({"source": s}, view.rollback_by_source.get(s, 0)) for s in ("archive cache", "repository",
                                                                               "rebuilt")])
        w.family("gpuguard_rollback_inexact_packages", "gauge", "Guarded packages restorable only from a rebuild "
                 "that differs from what was installed.", [({}, view.rollback_inexact)])
    return "\n".join(w.lines) + "\n"


def write_textfile(path: str, text: str) -> None:
    """Replace the textfile atomically (temp file + rename in the same directory) so a scrape never sees half.

    No fsync: after a crash the file is rewritten within one job interval, and the collector only needs atomicity.
    The temp name does not end in ``.prom`` so node_exporter never reads it.
    """
    write_atomically(path, text, fsync=False)
