"""The node_exporter textfile: content, label escaping, atomic replacement."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from agent.report.metrics import MetricsView, escape_label_value, render_metrics, write_textfile
from agent.report.plain import PlainPairing

EXPECTED = """\
# HELP gpuguard_agent_info gpuguard agent version.
# TYPE gpuguard_agent_info gauge
gpuguard_agent_info{version="0.1.0"} 1
# HELP gpuguard_agent_start_time_seconds When the gpuguard daemon started (Unix time).
# TYPE gpuguard_agent_start_time_seconds gauge
gpuguard_agent_start_time_seconds 1700000000
# HELP gpuguard_pairing_info The host's current kernel/driver/ROCm/CUDA pairing.
# TYPE gpuguard_pairing_info gauge
gpuguard_pairing_info{os_id="ubuntu",os_version_id="22.04",kernel_running="6.8.0-45-generic",\
kernel_next_boot="",amdgpu_loaded="6.8.5",amdgpu_dkms_package="1:6.8.5.60202-2041575.22.04",rocm="6.2.2",\
rocm_core_package="6.2.2.60202-116~22.04",rocm_releases="6.2.2 (rocm-core)",nvidia_loaded="",cuda_driver_api="",\
gpu_models="MI300X"} 1
# HELP gpuguard_gpu_count GPUs seen in the last snapshot.
# TYPE gpuguard_gpu_count gauge
gpuguard_gpu_count 8
# HELP gpuguard_snapshot_timestamp_seconds When the last snapshot was taken (Unix time).
# TYPE gpuguard_snapshot_timestamp_seconds gauge
gpuguard_snapshot_timestamp_seconds 1700000100
# HELP gpuguard_snapshot_findings Findings in the last snapshot, per severity.
# TYPE gpuguard_snapshot_findings gauge
gpuguard_snapshot_findings{severity="info"} 0
gpuguard_snapshot_findings{severity="warning"} 1
gpuguard_snapshot_findings{severity="critical"} 0
# HELP gpuguard_compliant 1 if the installed stack satisfies the pairing policy, else 0.
# TYPE gpuguard_compliant gauge
gpuguard_compliant 0
# HELP gpuguard_last_health_status The status of the last health check (value 1).
# TYPE gpuguard_last_health_status gauge
gpuguard_last_health_status{status="regression"} 1
# HELP gpuguard_outbox_depth Report events waiting for delivery.
# TYPE gpuguard_outbox_depth gauge
gpuguard_outbox_depth 3
# HELP gpuguard_outbox_oldest_event_age_seconds Age of the oldest event waiting for delivery.
# TYPE gpuguard_outbox_oldest_event_age_seconds gauge
gpuguard_outbox_oldest_event_age_seconds 12.5
# HELP gpuguard_outbox_dropped_total Events dropped by the outbox size bound, per kind.
# TYPE gpuguard_outbox_dropped_total counter
gpuguard_outbox_dropped_total{kind="heartbeat"} 4
# HELP gpuguard_outbox_rejected_total Events the endpoint refused as invalid.
# TYPE gpuguard_outbox_rejected_total counter
gpuguard_outbox_rejected_total 0
# HELP gpuguard_delivery_failures_total Failed delivery attempts since start, per cause.
# TYPE gpuguard_delivery_failures_total counter
gpuguard_delivery_failures_total{category="unreachable"} 2
"""


def test_render_shows_pairing_compliance_health_and_outbox() -> None:
    """The whole textfile for a typical MI300X host that is out of policy, with a queued backlog."""
    pairing = PlainPairing(os_id="ubuntu", os_version_id="22.04", kernel_running="6.8.0-45-generic",
                      amdgpu_loaded="6.8.5", amdgpu_dkms_package="1:6.8.5.60202-2041575.22.04", rocm="6.2.2",
                      rocm_core_package="6.2.2.60202-116~22.04", rocm_releases="6.2.2 (rocm-core)", gpu_count=8,
                      gpu_models="MI300X")
    view = MetricsView(agent_version="0.1.0", start_time_seconds=1700000000.0, pairing=pairing,
                       snapshot_timestamp_seconds=1700000100.0, findings_by_severity={"warning": 1},
                       compliant=False, last_health_status="regression", outbox_depth=3,
                       outbox_oldest_age_seconds=12.5, outbox_dropped={"heartbeat": 4},
                       delivery_failures={"unreachable": 2})
    assert render_metrics(view) == EXPECTED


def test_unknown_values_are_left_out_rather_than_guessed() -> None:
    """Before the first snapshot and health check only agent and outbox metrics appear."""
    text = render_metrics(MetricsView(agent_version="0.1.0", start_time_seconds=1.0))
    assert "gpuguard_pairing_info" not in text and "gpuguard_compliant" not in text
    assert "gpuguard_last_health_status" not in text and "gpuguard_outbox_depth 0" in text


def test_label_values_are_escaped() -> None:
    """Backslashes, quotes and newlines cannot break the exposition format."""
    assert escape_label_value('a\\b"c\nd') == 'a\\\\b\\"c\\nd'


def test_textfile_is_replaced_atomically_and_world_readable(tmp_path: Path) -> None:
    """node_exporter (another user) can read it; no temp files are left behind."""
    path = tmp_path / "metrics" / "gpuguard.prom"
    write_textfile(str(path), "a 1\n")
    write_textfile(str(path), "a 2\n")
    assert path.read_text() == "a 2\n"
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o644
    assert os.listdir(path.parent) == ["gpuguard.prom"]
