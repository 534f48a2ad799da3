"""The daemon-child protocol (agent/daemon_jobs/protocol.py) and the config job: records round-trip, the settings the
resident holds come from the validated model, a bad file or request is one clear problem."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from agent.config import Settings, parse_settings
from agent.daemon_jobs.child_main import load_config
from agent.daemon_jobs.delivery import DeliveryFailure, Drained
from agent.daemon_jobs.protocol import (
    ChildContext,
    ChildReply,
    ConfigRequest,
    ConfigResult,
    DeliverResult,
    ForwardResult,
    GuardChecked,
    GuardCheckResult,
    HealthChildResult,
    HealthRequest,
    HealthSeen,
    HealthSummary,
    JobRequest,
    RestoreResult,
    SnapshotRequest,
    SnapshotResult,
)
from agent.daemon_jobs.resident_settings import ResidentSettings, SettingsInForce
from agent.daemon_jobs.runtime import SnapshotFacts
from agent.errors import ConfigError, DeliveryError
from agent.host import Host
from agent.jsonrecord import JsonRecord, RecordError
from agent.report.plain import PlainPairing

REPO = Path(__file__).resolve().parents[2]
CONTEXT = ChildContext(settings=Settings().model_dump(mode="json"), host_id="h-1", hostname="node-1", daemon_pid=42)
FACTS = SnapshotFacts(content_hash="sha256:ab", taken_at_seconds=1.5, findings_by_severity=(("warning", 2),),
                      finding_kinds=("reboot_pending",))
RECORDS = [
    JobRequest(context=CONTEXT, reason="interval"),
    SnapshotRequest(context=CONTEXT, reason="package_change", violated_rules=("amd.pairing",)),
    HealthRequest(context=CONTEXT, reason="stack_changed:dpkg", mode="functional", after_change=True),
    ConfigRequest(in_force=CONTEXT.settings, compile_policy=True, daemon_pid=42),
    ChildReply(peak_rss_kib=40960, result={"events": 1}),
    ConfigResult(view=ResidentSettings.of(Settings()), dump=CONTEXT.settings),
    RestoreResult(events=1, snapshot=FACTS, pairing=PlainPairing(kernel_running="6.8"), health=HealthSeen("pass", 2.0)),
    SnapshotResult(events=2, compliant=False, violated_rules=("a", "b"), stack_changed="stack_changed:kernel",
                   hostname="node-1", snapshot=FACTS, pairing=PlainPairing(gpu_count=8)),
    GuardCheckResult(checked=GuardChecked("rolled_back", "restored 1 package", True)),
    GuardCheckResult(error="CommandTimeout: apt-get", expected=True),
    ForwardResult(events=3, forwarded=2),
    HealthChildResult(events=1, summary=HealthSummary("busy", 3.0, "full", True, ("gpu 0: pid 1",), "failed", True,
                                                      "pass"), last=HealthSeen("busy", 3.0)),
    DeliverResult(events=0, drained=Drained(1.25, DeliveryFailure.of(DeliveryError("https://h/v1/events", "server",
                                                                                   "HTTP 503", 503)), 5)),
]


@pytest.mark.parametrize("record", RECORDS, ids=[type(r).__name__ for r in RECORDS])
def test_every_request_and_result_round_trips(record: JsonRecord) -> None:
    """What one side writes the other reads back equal."""
    assert type(record).from_json(record.to_json()) == record


def test_a_drain_failure_comes_back_as_the_error_it_was() -> None:
    """DeliveryJob backs off on the child's failure as on its own."""
    error = DeliverResult.from_json(RECORDS[-1].to_json()).drained.failure
    assert error is not None
    back = error.error()
    assert (back.url, back.category, back.reason, back.status_code) == (
        "https://h/v1/events", "server", "HTTP 503", 503)


def test_a_config_result_holds_settings_or_a_problem() -> None:
    """Neither or both is malformed; a problem becomes the ConfigError the daemon refuses to start with."""
    with pytest.raises(RecordError, match="either the settings"):
        ConfigResult.from_json({})
    with pytest.raises(ConfigError, match="agent.toml: report -> endpoint_url"):
        ConfigResult.from_json({"problem": {"path": "/etc/gpuguard/agent.toml",
                                            "problems": ["report -> endpoint_url: bad"]}}).in_force()


def test_the_resident_view_is_the_validated_models() -> None:
    """Every value the resident reads is the model's, derived ones by the model's own methods."""
    settings = parse_settings('[agent]\nstate_dir = "/srv/gg"\nhost_id = "h-9"\nlog_level = "warning"\n'
                              '[report]\nendpoint_url = "https://hub.example/v1/events"\nmax_events = 50\n'
                              'metrics_textfile = "/run/m.prom"\nnfd_features_file = ""\n'
                              '[snapshot]\ninterval_seconds = 120\n'
                              '[daemon]\nhealth_enabled = false\nhealth_first_run_seconds = 5\n'
                              '[health]\ndefer_window_seconds = 7200\n')
    view = ResidentSettings.of(settings)
    assert (view.state_dir, view.host_id, view.log_level) == ("/srv/gg", "h-9", "warning")
    assert view.endpoint_url == "https://hub.example" and view.max_events == 50
    assert view.metrics_path == "/run/m.prom" and view.nfd_path is None
    assert view.intervals()["snapshot"] == view.intervals()["guard"] == 120.0
    assert (view.health_enabled, view.health_first_run_seconds, view.defer_window_seconds) == (False, 5.0, 7200.0)
    assert ResidentSettings.of(Settings()).metrics_path == "/var/lib/gpuguard/metrics/gpuguard.prom"
    in_force = SettingsInForce(view, settings.model_dump(mode="json"))
    assert in_force.model() == settings  # what a child validates from the dump is what the config child had


def test_the_config_job_refuses_a_bad_file_or_token_with_every_problem(tmp_path: Path) -> None:
    """Bad fields and an unusable token file are the problems the daemon prints as one line and exits 3 on."""
    config = tmp_path / "agent.toml"
    config.write_text('[report]\nendpoint_url = "ftp://x"\nbatch_size = 0\n')
    result = load_config(str(config), Host(root=Path("/")), ConfigRequest())
    assert result.problem is not None and result.problem.path == str(config) and len(result.problem.problems) == 2
    config.write_text(f'[report]\nendpoint_url = "https://hub.example"\ntoken_file = "{tmp_path / "none"}"\n')
    problem = load_config(str(config), Host(root=Path("/")), ConfigRequest()).problem
    assert problem is not None and "token" in " ".join(problem.problems)


def test_a_reload_keeps_the_running_state_directory(tmp_path: Path) -> None:
    """agent.state_dir takes effect on restart: the reloaded view and the children's settings keep the old one."""
    config = tmp_path / "agent.toml"
    config.write_text('[agent]\nstate_dir = "/elsewhere"\n[snapshot]\ninterval_seconds = 30\n')
    in_force = Settings.model_validate({"agent": {"state_dir": str(tmp_path / "state")}})
    result = load_config(str(config), Host(root=tmp_path), ConfigRequest(in_force=in_force.model_dump(mode="json")))
    settings = result.in_force()
    assert settings.view.state_dir == str(tmp_path / "state") and settings.view.snapshot_interval_seconds == 30.0
    assert settings.model().agent.state_dir == str(tmp_path / "state")


def test_a_malformed_request_is_a_one_line_usage_error(tmp_path: Path) -> None:
    """``gpuguard _job`` with a request that is not its job's record: exit 2, the field named, no traceback."""
    done = subprocess.run([sys.executable, "-m", "agent", "_job", "snapshot", "--request",
                           '{"context": {"settings": {}, "host_id": "h", "hostname": "n"}, "reason": 5}',
                           "--result", str(tmp_path / "r.json")], capture_output=True, text=True, cwd=str(REPO),
                          timeout=60, check=False)
    assert done.returncode == 2
    assert done.stderr.strip() == "gpuguard: error: --request -> reason: expected a string, got int"
