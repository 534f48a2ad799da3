"""The daemon writes the NFD features file: after jobs change what it shows, every half lifetime, never at stop."""

from __future__ import annotations

import datetime as dt
import time
from pathlib import Path
from typing import List

from agent.config import Settings
from agent.daemon_jobs.metrics import MetricsJob
from agent.daemon_jobs.nfd import NfdJob
from agent.daemon_jobs.snapshot import SnapshotJob
from agent.frozen import replace
from agent.report.settings import ReportSettings
from tests.conftest import FIXED_TIME, make_fixture_host
from tests.daemon.conftest import AgentProcess, agent_config
from tests.daemon.test_jobs import make_runtime, no_hooks
from tests.integrations.features_format import parse_features


def nfd_settings(path: Path, lifetime_seconds: float = 3600.0) -> Settings:
    report = ReportSettings(nfd_features_file=str(path), nfd_lifetime_seconds=lifetime_seconds)
    return Settings().model_copy(update={"report": report})


def test_metrics_job_writes_the_features_file_from_the_daemon_state(tmp_path: Path) -> None:
    """After a snapshot the labels name the pairing; the expiry is the clock plus the lifetime."""
    features = tmp_path / "features.d"
    features.mkdir()
    rt = make_runtime(tmp_path, make_fixture_host("gpuless-debian12"), nfd_settings(features / "gpuguard"))
    SnapshotJob(rt, no_hooks().policy_check).run()
    MetricsJob(rt).run("after_snapshot")
    expiry, found = parse_features((features / "gpuguard").read_text())
    assert expiry == FIXED_TIME + dt.timedelta(hours=1)
    assert found["gpuguard.io/kernel"] == "6.1.0-26-amd64" and found["gpuguard.io/compliant"] == "unknown"
    assert found["gpuguard.io/os"] == "debian-12"


def test_rewritten_when_the_state_changes_or_half_the_lifetime_passed_and_not_at_shutdown(tmp_path: Path) -> None:
    """Same state within half a lifetime: no write; new health status or 30 min later: written; shutdown: kept."""
    target = tmp_path / "gpuguard"
    now: List[dt.datetime] = [FIXED_TIME]
    host = replace(make_fixture_host("gpuless-debian12"), clock=lambda: now[0])
    rt = make_runtime(tmp_path, host, nfd_settings(target))
    job = NfdJob(rt)
    job.run()
    first = target.read_text()
    now[0] += dt.timedelta(minutes=29)
    job.run()
    assert target.read_text() == first  # unchanged and fresh: the expiry is not pushed on every minute
    rt.state.last_health_status, rt.state.last_health_at_seconds = "busy", now[0].timestamp()
    job.run("after_health")
    expiry, found = parse_features(target.read_text())
    assert found["gpuguard.io/health"] == "busy" and expiry == now[0] + dt.timedelta(hours=1)
    now[0] += dt.timedelta(minutes=31)
    job.run()
    assert parse_features(target.read_text())[0] == now[0] + dt.timedelta(hours=1)
    before = target.read_text()
    now[0] += dt.timedelta(hours=2)
    rt.state.compliant = False
    job.run("shutdown")
    assert target.read_text() == before  # a stopping daemon's labels lapse at their expiry


def test_turned_off_or_without_the_directory_nothing_is_written(tmp_path: Path) -> None:
    """An empty nfd_features_file turns it off; a missing directory (no NFD here) is not created."""
    rt = make_runtime(tmp_path, make_fixture_host("gpuless-debian12"),
                      nfd_settings(tmp_path / "absent" / "gpuguard"))
    NfdJob(rt).run()
    assert not (tmp_path / "absent").exists()
    off = Settings().model_copy(update={"report": ReportSettings(nfd_features_file="")})
    assert off.report.nfd_path() is None


class CountingPolicyName:
    """A stand-in for the job's compiled-policy reader that counts its reads."""

    def __init__(self) -> None:
        self.reads = 0

    def __call__(self, path: str) -> str:
        self.reads += 1
        return "site"


def test_without_the_directory_nothing_is_read_and_a_directory_made_later_is_written(tmp_path: Path) -> None:
    """No NFD here: the job reads no compiled policy (its reader stays out of the resident, issue #45); once the
    directory exists, the next run writes the file with the policy's name."""
    features = tmp_path / "features.d"
    rt = make_runtime(tmp_path, make_fixture_host("gpuless-debian12"), nfd_settings(features / "gpuguard"))
    job = NfdJob(rt)
    reader = job._policy_name = CountingPolicyName()  # type: ignore[assignment]
    job.run()
    job.run("after_snapshot")
    assert reader.reads == 0 and not features.exists()
    features.mkdir()
    job.run()
    assert reader.reads == 1
    assert parse_features((features / "gpuguard").read_text())[1]["gpuguard.io/policy"] == "site"


def test_running_daemon_writes_the_features_file(agent: AgentProcess) -> None:
    """``gpuguard run`` writes a valid file with the pairing and an expiry in the future, without a dot-file."""
    features = agent.workdir / "features.d"
    features.mkdir()
    agent.write_config(agent_config(agent.state_dir, nfd_features_file=str(features / "gpuguard")))
    agent.start()
    deadline = time.monotonic() + 120  # only ends a broken run
    found: dict = {}
    while time.monotonic() < deadline:
        if (features / "gpuguard").exists():
            expiry, found = parse_features((features / "gpuguard").read_text())
            if "gpuguard.io/kernel" in found:
                break
        time.sleep(0.1)
    assert found.get("gpuguard.io/kernel") == "6.1.0-26-amd64", agent.log_path.read_text()[-3000:]
    assert expiry is not None and expiry > dt.datetime.now(dt.timezone.utc) + dt.timedelta(minutes=59)
    assert agent.terminate() == 0
    assert [p.name for p in features.iterdir()] == ["gpuguard"]


def test_a_rollback_reboot_marker_sets_reboot_needed(tmp_path: Path) -> None:
    """reboot-required.pkgs written by a rollback (after this boot) shows as reboot-needed=true."""
    from agent.statepaths import StatePaths

    target = tmp_path / "gpuguard"
    host = replace(make_fixture_host("gpuless-debian12"), root=tmp_path / "root")
    rt = make_runtime(tmp_path, host, nfd_settings(target))
    marker = host.path(StatePaths(rt.settings.state_dir).reboot_required_packages)
    assert str(marker).startswith(str(tmp_path))
    marker.parent.mkdir(parents=True)
    marker.write_text("amdgpu-dkms\n")
    NfdJob(rt).run()
    assert parse_features(target.read_text())[1]["gpuguard.io/reboot-needed"] == "true"


def test_the_compiled_policy_name_is_a_label_and_follows_a_recompile(tmp_path: Path) -> None:
    """policy= names the compiled policy under the host root; a new compile shows its new name."""
    from agent.policy.load import load_and_compile, write_compiled
    from agent.statepaths import StatePaths

    target = tmp_path / "gpuguard"
    host = replace(make_fixture_host("gpuless-debian12"), root=tmp_path / "root")
    rt = make_runtime(tmp_path, host, nfd_settings(target))
    compiled_path = host.path(StatePaths(rt.settings.state_dir).compiled_policy)
    compiled_path.parent.mkdir(parents=True)
    job = NfdJob(rt)
    for name in ("fleet-a", "fleet b"):
        source = tmp_path / "p.toml"
        source.write_text(f'[policy]\nname = "{name}"\n[[amd.pairing]]\nname = "r"\namdgpu = "6.3.*"\n'
                          'rocm = "6.3.*"\n')
        write_compiled(str(compiled_path), load_and_compile(str(source))[1])
        job.run("after_guard")
        assert parse_features(target.read_text())[1]["gpuguard.io/policy"] == name.replace(" ", "_")
