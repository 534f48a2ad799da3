"""The daemon's job bodies in-process: snapshot, package watch, health, heartbeat, delivery, metrics."""

from __future__ import annotations

import datetime as dt
import os
import random
import types
from pathlib import Path
from typing import Any, Dict, List, Optional

import pytest

from agent.config import Settings
from agent.daemon_jobs.delivery import Backoff, DeliveryFailure, DeliveryJob, Drained
from agent.daemon_jobs.health import HealthJob
from agent.daemon_jobs.heartbeat import HeartbeatJob
from agent.daemon_jobs.hooks import Hooks
from agent.daemon_jobs.metrics import MetricsJob
from agent.daemon_jobs.resident_settings import SettingsInForce
from agent.daemon_jobs.runtime import EventEmitter, Runtime, host_identity
from agent.daemon_jobs.snapshot import SnapshotJob
from agent.daemon_jobs.watch import PackageWatcher
from agent.errors import DeliveryError
from agent.frozen import replace
from agent.host import Host
from agent.report.events import CpuFallback, PolicyViolation
from agent.report.outbox import Outbox
from agent.report.sender import Sender
from agent.report.settings import ReportSettings
from agent.snapshot.model import Snapshot, compute_content_hash
from agent.snapshot.take import take_snapshot
from tests.conftest import make_fixture_host
from tests.daemon.conftest import TOKEN
from tests.report.events import event
from tests.report.receiver import Receiver


def make_runtime(tmp_path: Path, host: Host, settings: Optional[Settings] = None,
                 endpoint: Optional[str] = None) -> Runtime:
    """A Runtime over a temp state dir, with a Sender when an endpoint is given."""
    settings = settings or Settings()
    if endpoint:
        report = settings.report.model_copy(update={"endpoint_url": endpoint, "batch_size": 5,
                                                    "backoff_base_seconds": 0.05, "backoff_cap_seconds": 0.4,
                                                    "read_timeout_seconds": 2.0})
        settings = settings.model_copy(update={"report": ReportSettings.model_validate(report.model_dump())})
    state_dir = str(tmp_path / "state")
    outbox = Outbox(f"{state_dir}/outbox.sqlite3")
    emitter = EventEmitter(outbox, host_identity(host, settings.agent.host_id), host.hostname(), host.clock)
    sender = Sender(settings.report, TOKEN) if endpoint else None
    return Runtime(host=host, in_force=SettingsInForce.of(settings), state_dir=state_dir, outbox=outbox,
                   emitter=emitter, sender=sender)


def hooks_from(modules: Dict[str, Any]) -> Hooks:
    """Hooks wired to fake ``agent.report.compliance`` / ``agent.health.*`` modules; the rest left unwired."""
    def find(module: str, attribute: str) -> Any:
        return getattr(modules[module], attribute) if module in modules else None

    return Hooks(policy_check=find("agent.report.compliance", "check_snapshot"),
                 health_run=find("agent.health.runner", "run_health_check"),
                 health_last=find("agent.health.last", "load_last_result"),
                 health_payloads=find("agent.health.events", "payloads_for"))


def no_hooks() -> Hooks:
    return Hooks()


# --- snapshot ---------------------------------------------------------------------------------------------------

def test_first_snapshot_is_reported_and_stored(tmp_path: Path) -> None:
    """No previous snapshot: one SnapshotChanged with no old hash; the snapshot is written to the state dir."""
    rt = make_runtime(tmp_path, make_fixture_host("gpuless-debian12"))
    SnapshotJob(rt, no_hooks().policy_check).run()
    [stored] = rt.outbox.pending(10)
    assert stored.kind == "snapshot_changed" and stored.payload.old_hash is None
    assert stored.payload.pairing.kernel_running == "6.1.0-26-amd64"
    assert (tmp_path / "state" / "last-snapshot.json").exists()


def test_unchanged_snapshot_is_not_reported_even_after_a_restart(tmp_path: Path) -> None:
    """Same content hash, nothing to say; the stored snapshot is read back by a new daemon."""
    host = make_fixture_host("gpuless-debian12")
    rt = make_runtime(tmp_path, host)
    job = SnapshotJob(rt, no_hooks().policy_check)
    job.run()
    job.run()
    assert rt.outbox.depth() == 1
    rt.outbox.close()
    restarted = make_runtime(tmp_path, host)
    SnapshotJob(restarted, no_hooks().policy_check).run()
    assert restarted.outbox.depth() == 1


def test_changed_package_is_reported_with_the_diff_and_asks_for_a_health_check(tmp_path: Path) -> None:
    """A moved watched package gives a SnapshotChanged with the change, and a health-check request."""
    host = make_fixture_host("gpuless-debian12")
    rt = make_runtime(tmp_path, host)
    asked: List[str] = []
    def moved_containerd(h: Host, collectors: Any, exporter_table: Any, therock_table: Any, matrix: Any) -> Snapshot:
        snap = take_snapshot(h, collectors, exporter_table, therock_table, matrix)
        dpkg = snap.dpkg.data
        packages = dict(dpkg.packages)
        packages["containerd.io"] = replace(packages["containerd.io"], version="1.7.23-1")
        changed = replace(snap, dpkg=replace(snap.dpkg, data=replace(dpkg, packages=packages)))
        return replace(changed, content_hash=compute_content_hash(changed))

    SnapshotJob(rt, no_hooks().policy_check, on_stack_changed=asked.append).run()
    SnapshotJob(rt, no_hooks().policy_check, on_stack_changed=asked.append, take=moved_containerd).run()
    first, second = rt.outbox.pending(10)
    assert second.payload.old_hash == first.payload.new_hash
    assert [(c.section, c.path, c.old, c.new) for c in second.payload.changes] == [
        ("dpkg", "packages.containerd.io.version", "1.7.22-1", "1.7.23-1")]
    assert asked == ["stack_changed:dpkg"]


def test_policy_violations_are_reported_when_they_appear(tmp_path: Path) -> None:
    """A rule violated across snapshots is reported once; compliance follows the latest evaluation."""
    verdicts = [[PolicyViolation(rule="rocm-pin", message="rocm moved", action="rollback")],
                [PolicyViolation(rule="rocm-pin", message="rocm moved", action="rollback")], []]
    module = types.SimpleNamespace(check_snapshot=lambda snap, state_dir, root: verdicts.pop(0))
    hook = hooks_from({"agent.report.compliance": module}).policy_check
    rt = make_runtime(tmp_path, make_fixture_host("gpuless-debian12"))
    job = SnapshotJob(rt, hook)
    job.run()
    assert rt.state.compliant is False
    job.run()
    job.run()
    assert rt.state.compliant is True
    kinds = [(e.kind, e.severity) for e in rt.outbox.pending(10)]
    assert kinds == [("snapshot_changed", "info"), ("policy_violation", "critical")]


def test_no_installed_policy_leaves_compliance_unknown(tmp_path: Path) -> None:
    """A policy engine that finds no compiled policy says nothing about compliance (not "compliant")."""
    module = types.SimpleNamespace(check_snapshot=lambda snap, state_dir, root: None)
    hook = hooks_from({"agent.report.compliance": module}).policy_check
    rt = make_runtime(tmp_path, make_fixture_host("gpuless-debian12"))
    SnapshotJob(rt, hook).run()
    assert rt.state.compliant is None


def test_missing_policy_engine_leaves_compliance_unknown(tmp_path: Path) -> None:
    """With no policy engine wired the snapshot job still works and says nothing about compliance."""
    rt = make_runtime(tmp_path, make_fixture_host("gpuless-debian12"))
    SnapshotJob(rt, no_hooks().policy_check).run()
    assert rt.state.compliant is None


# --- package watch ----------------------------------------------------------------------------------------------

def test_package_database_change_is_reported_once_it_settles(tmp_path: Path) -> None:
    """One callback per burst of writes, after the signature stayed the same for one poll."""
    root = tmp_path / "root"
    status = root / "var/lib/dpkg/status"
    status.parent.mkdir(parents=True)
    status.write_text("Package: a\n")
    changes: List[str] = []
    watcher = PackageWatcher(Host.for_root(str(root)), changes.append)
    watcher.run()
    assert changes == []
    status.write_text("Package: a\nVersion: 2\n")
    watcher.run()
    status.write_text("Package: a\nVersion: 3\n")
    watcher.run()
    assert changes == []
    watcher.run()
    watcher.run()
    assert changes == ["package_change"]


def test_rpm_database_directory_is_watched(tmp_path: Path) -> None:
    """rpmdb.sqlite and its WAL under /usr/lib/sysimage/rpm (with /var/lib/rpm a link to it) count."""
    root = tmp_path / "root"
    (root / "usr/lib/sysimage/rpm").mkdir(parents=True)
    (root / "var/lib").mkdir(parents=True)
    os.symlink("../../usr/lib/sysimage/rpm", root / "var/lib/rpm")
    (root / "usr/lib/sysimage/rpm/rpmdb.sqlite").write_bytes(b"x")
    changes: List[str] = []
    watcher = PackageWatcher(Host.for_root(str(root)), changes.append)
    (root / "usr/lib/sysimage/rpm/rpmdb.sqlite-wal").write_bytes(b"y")
    watcher.run()
    watcher.run()
    assert changes == ["package_change"]


# --- health -----------------------------------------------------------------------------------------------------

def fake_health_modules(status: str, payloads: List[Any], calls: List[Any]) -> Dict[str, Any]:
    result = types.SimpleNamespace(status=status)

    def run_health_check(host: Host, settings: Any, state_dir: str, snapshot: Any = None) -> Any:
        calls.append((settings, state_dir))
        return result

    return {"agent.health.runner": types.SimpleNamespace(run_health_check=run_health_check),
            "agent.health.last": types.SimpleNamespace(load_last_result=lambda state_dir: None),
            "agent.health.events": types.SimpleNamespace(payloads_for=lambda r: list(payloads))}


def test_health_result_is_recorded_and_its_events_reported(tmp_path: Path) -> None:
    """A CPU fallback is a critical event; the status feeds heartbeats and metrics."""
    calls: List[Any] = []
    fallback = CpuFallback(reason="no_gpu_visible", fingerprint="fp1")
    hooks = hooks_from(fake_health_modules("cpu_fallback", [fallback], calls))
    rt = make_runtime(tmp_path, Host(root=Path("/"), clock=lambda: dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)))
    HealthJob(rt, hooks).run("stack_changed:kernel")
    assert len(calls) == 1 and calls[0][1] == rt.state_dir
    assert rt.state.last_health_status == "cpu_fallback"
    assert [(e.kind, e.severity) for e in rt.outbox.pending(10)] == [("cpu_fallback", "critical")]


def test_health_check_is_skipped_for_a_foreign_root_or_when_disabled(tmp_path: Path) -> None:
    """The probe measures this machine, so a fixture root never runs it; health_enabled=false neither."""
    calls: List[Any] = []
    hooks = hooks_from(fake_health_modules("pass", [], calls))
    HealthJob(make_runtime(tmp_path / "a", make_fixture_host("gpuless-debian12")), hooks).run()
    disabled = Settings.model_validate({"daemon": {"health_enabled": False}})
    HealthJob(make_runtime(tmp_path / "b", Host(root=Path("/")), disabled), hooks).run()
    assert calls == []


def test_missing_health_runner_is_not_an_error(tmp_path: Path) -> None:
    """With no health runner wired the job does nothing."""
    rt = make_runtime(tmp_path, Host(root=Path("/")))
    HealthJob(rt, no_hooks()).run()
    assert rt.state.last_health_status is None and rt.outbox.depth() == 0


# --- heartbeat and metrics --------------------------------------------------------------------------------------

def test_heartbeat_carries_pairing_and_outbox_depth(tmp_path: Path) -> None:
    """After a snapshot the heartbeat names the content hash and pairing; depth counts queued events."""
    rt = make_runtime(tmp_path, make_fixture_host("gpuless-debian12"))
    SnapshotJob(rt, no_hooks().policy_check).run()
    HeartbeatJob(rt).run()
    beat = rt.outbox.pending(10)[-1].payload
    assert beat.kind == "heartbeat" and beat.outbox_depth == 1
    assert beat.content_hash == rt.state.last_snapshot.content_hash
    assert beat.pairing is not None and beat.pairing.os_id == "debian"


def test_heartbeat_carries_labels_and_the_policy_bundle_state(tmp_path: Path) -> None:
    """Labels, the policy source, the bundle serial in force and a refusal newer than it go in the heartbeat; a
    refusal of an older serial (a withdrawal's re-offer) does not."""
    import datetime as dt

    from agent.bundle.state import BundleRefusal, BundleState, write_bundle_state

    settings = Settings.model_validate({"agent": {"state_dir": str(tmp_path / "state"), "labels": {"rack": "a7"}},
                                        "guard": {"policy_source": "bundle"}})
    rt = make_runtime(tmp_path, Host(root=Path("/")), settings)
    HeartbeatJob(rt).run()
    beat = rt.outbox.pending(10)[-1].payload
    assert (beat.labels, beat.policy_source, beat.policy_serial, beat.policy_refused_serial) == (
        {"rack": "a7"}, "bundle", None, None)
    at = dt.datetime(2026, 12, 4, tzinfo=dt.timezone.utc)
    path = str(tmp_path / "state/policy-bundle/state.json")
    write_bundle_state(path, BundleState(serial=4, source="hub", refused=BundleRefusal(5, "out of scope: x", at)))
    HeartbeatJob(rt).run()
    beat = rt.outbox.pending(10)[-1].payload
    assert (beat.policy_serial, beat.policy_refused_serial, beat.policy_refused_reason) == (4, 5, "out of scope: x")
    write_bundle_state(path, BundleState(serial=6, source="hub", refused=BundleRefusal(5, "out of scope: x", at)))
    HeartbeatJob(rt).run()
    beat = rt.outbox.pending(10)[-1].payload
    assert (beat.policy_serial, beat.policy_refused_serial, beat.policy_refused_reason) == (6, None, None)


def test_heartbeat_carries_policy_attention_for_an_expired_bundle_and_a_freeze(tmp_path: Path) -> None:
    """The bundle in force past its expires, and a freshness statement naming a newer serial, go in the heartbeat as
    policy_attention; neither, nothing."""
    import datetime as dt

    from agent.bundle.state import BundleState, write_bundle_state

    settings = Settings.model_validate({"agent": {"state_dir": str(tmp_path / "state")},
                                        "guard": {"policy_source": "bundle"}})
    now = dt.datetime(2026, 12, 6, 12, tzinfo=dt.timezone.utc)
    rt = make_runtime(tmp_path, Host(root=Path("/"), clock=lambda: now), settings)
    path = str(tmp_path / "state/policy-bundle/state.json")
    day = dt.timedelta(days=1)
    write_bundle_state(path, BundleState(serial=4, source="hub", expires=now + day, freshness_expires=now + day,
                                         freshness_newest=4))
    HeartbeatJob(rt).run()
    assert rt.outbox.pending(10)[-1].payload.policy_attention is None
    write_bundle_state(path, BundleState(serial=4, source="hub", expires=now - day, freshness_expires=now + day,
                                         freshness_newest=5))
    HeartbeatJob(rt).run()
    assert rt.outbox.pending(10)[-1].payload.policy_attention == ("expired", "freshness")


def test_metrics_job_writes_the_textfile_under_the_state_dir(tmp_path: Path) -> None:
    """Pairing and outbox depth appear in <state_dir>/metrics/gpuguard.prom."""
    settings = Settings.model_validate({"agent": {"state_dir": str(tmp_path / "state")}})
    rt = make_runtime(tmp_path, make_fixture_host("gpuless-debian12"), settings)
    SnapshotJob(rt, no_hooks().policy_check).run()
    MetricsJob(rt).run()
    text = (tmp_path / "state" / "metrics" / "gpuguard.prom").read_text()
    assert 'os_id="debian"' in text and "gpuguard_outbox_depth 1" in text


# --- delivery ---------------------------------------------------------------------------------------------------

def queue(rt: Runtime, n: int) -> List[str]:
    return [rt.outbox.enqueue(event()).event_id for _ in range(n)]


def test_delivery_drains_the_outbox_in_batches_in_order(tmp_path: Path, receiver: Receiver) -> None:
    """Twelve events in batches of five arrive in sequence order and leave the outbox."""
    rt = make_runtime(tmp_path, Host(root=Path("/")), endpoint=receiver.url)
    ids = queue(rt, 12)
    assert DeliveryJob(rt).run() is None
    assert receiver.stored_order == ids and receiver.requests == 3
    assert rt.outbox.depth() == 0


def test_too_large_batches_are_split(tmp_path: Path, receiver: Receiver) -> None:
    """A 413 halves the batch until the receiver takes it; nothing is dropped."""
    receiver.mode = "too_large_over:2"
    rt = make_runtime(tmp_path, Host(root=Path("/")), endpoint=receiver.url)
    ids = queue(rt, 5)
    DeliveryJob(rt).run()
    assert receiver.stored_order == ids and rt.outbox.depth() == 0


def test_an_event_the_receiver_refuses_is_set_aside_and_the_rest_delivered(tmp_path: Path,
                                                                            receiver: Receiver) -> None:
    """A 422 is narrowed to the one refused event, which moves to the rejected table."""
    rt = make_runtime(tmp_path, Host(root=Path("/")), endpoint=receiver.url)
    ids = queue(rt, 4)
    receiver.mode = f"reject:{ids[2]}"
    DeliveryJob(rt).run()
    assert receiver.stored_order == [ids[0], ids[1], ids[3]]
    assert rt.outbox.depth() == 0 and rt.outbox.rejected_count() == 1


def test_failure_keeps_events_and_backs_off(tmp_path: Path, receiver: Receiver) -> None:
    """A 500 returns a jittered delay; until it passes, runs do not contact the endpoint; then it recovers."""
    receiver.mode = "error500"
    rt = make_runtime(tmp_path, Host(root=Path("/")), endpoint=receiver.url)
    ids = queue(rt, 3)
    now = [100.0]
    job = DeliveryJob(rt, clock=lambda: now[0], rng=random.Random(3))
    delay = job.run()
    assert delay is not None and 0.0 <= delay <= 0.05
    assert rt.outbox.depth() == 3 and rt.state.delivery_failures == {"server": 1}
    now[0] += delay / 2
    assert job.run() == pytest.approx(delay / 2) and receiver.requests == 1
    receiver.mode = "ok"
    now[0] += delay
    assert job.run() is None
    assert receiver.stored_order == ids and job.backoff.failures == 0


def test_without_an_endpoint_events_stay_queued(tmp_path: Path) -> None:
    """No endpoint: nothing is sent, nothing dropped, the job asks for no retry."""
    rt = make_runtime(tmp_path, Host(root=Path("/")))
    queue(rt, 2)
    job = DeliveryJob(rt)
    assert job.run() is None and job.run() is None
    assert rt.outbox.depth() == 2


def test_stopping_ends_the_drain_between_batches(tmp_path: Path, receiver: Receiver) -> None:
    """SIGTERM (stopping set) lets the batch in flight finish and sends no further batch."""
    rt = make_runtime(tmp_path, Host(root=Path("/")), endpoint=receiver.url)
    queue(rt, 10)
    rt.stopping.set()
    DeliveryJob(rt).run()
    assert receiver.requests == 0 and rt.outbox.depth() == 10


def test_backoff_is_exponential_with_full_jitter_and_a_cap() -> None:
    """Each delay lies in [0, min(cap, base * 2**n)], spreads over that range, and reset starts again."""
    backoff = Backoff(0.5, 8.0, random.Random(7))
    ceilings = [0.5, 1.0, 2.0, 4.0, 8.0, 8.0, 8.0]
    for ceiling in ceilings:
        assert 0.0 <= backoff.next_delay_seconds() <= ceiling
    samples = [Backoff(1.0, 64.0, random.Random(seed)) for seed in range(200)]
    for b in samples:
        for _ in range(4):
            b.next_delay_seconds()
    fifth = [b.next_delay_seconds() for b in samples]
    assert max(fifth) <= 16.0 and min(fifth) < 2.0 and max(fifth) > 14.0
    backoff.reset()
    assert backoff.failures == 0 and backoff.next_delay_seconds() <= 0.5


def test_a_drain_elsewhere_is_asked_only_with_events_queued_and_its_outcome_kept(tmp_path: Path) -> None:
    """The daemon's drain (a job child) is not started for an empty outbox; its failure backs off and is counted,
    its acknowledgement time is kept, and what it hands back survives the trip through the child's JSON."""
    rt = make_runtime(tmp_path, Host(root=Path("/")), endpoint="https://hub.example:8443")
    asked: List[str] = []
    outcomes = [Drained(acknowledged_at_seconds=1700000000.5,
                        failure=DeliveryFailure.of(DeliveryError("https://hub.example:8443/v1/events", "server",
                                                                 "HTTP 503", 503)),
                        failed_batch_events=5),
                Drained(acknowledged_at_seconds=1700000060.25)]

    def drain(reason: str) -> Drained:
        asked.append(reason)
        return Drained.from_json(outcomes.pop(0).to_json())

    now = [100.0]
    job = DeliveryJob(rt, clock=lambda: now[0], rng=random.Random(3), drain=drain)
    assert job.run("interval") is None and asked == []
    queue(rt, 2)
    delay = job.run("event_enqueued")
    assert asked == ["event_enqueued"] and delay is not None and 0.0 <= delay <= 0.05
    assert rt.state.delivery_failures == {"server": 1} and rt.state.last_delivery_success_seconds == 1700000000.5
    assert job.run("interval") == pytest.approx(delay) and asked == ["event_enqueued"]
    now[0] += delay
    assert job.run("interval") is None and asked == ["event_enqueued", "interval"]
    assert job.backoff.failures == 0 and rt.state.last_delivery_success_seconds == 1700000060.25


def test_events_queued_under_an_old_host_id_are_sent_under_the_current_one(tmp_path: Path,
                                                                            receiver: Receiver) -> None:
    """agent.host_id changed while events waited: they go out with the new id (the hub refused the old one with
    403 forever, and delivery never got past them), in order, each once."""
    rt = make_runtime(tmp_path, Host(root=Path("/")), endpoint=receiver.url)
    old = queue(rt, 3)  # host_id "h1"
    rt.emitter.host_id = "renamed-host-7"
    new = [rt.outbox.enqueue(event().model_copy(update={"host_id": "renamed-host-7"})).event_id]
    assert DeliveryJob(rt).run() is None
    assert receiver.stored_order == old + new and rt.outbox.depth() == 0
    assert {receiver.stored[i]["host_id"] for i in old + new} == {"renamed-host-7"}


def test_the_daemons_snapshot_judges_against_the_matrix_of_the_policy_in_force(tmp_path: Path) -> None:
    """The snapshot job hands its snapshot AMD's matrix in its compiled form (the shipped one here), so versions
    newer than the matrix are reported from the daemon's snapshots, which `gpuguard snapshot` leaves out."""
    from agent.policy.matrix import load_matrix

    host = make_fixture_host("gpuless-debian12")
    rt = make_runtime(tmp_path, host)
    seen: List[Any] = []

    def recorded(h: Host, collectors: Any, exporter_table: Any, therock_table: Any, matrix: Any) -> Snapshot:
        seen.append(matrix)
        return take_snapshot(h, collectors, exporter_table, therock_table, matrix)

    SnapshotJob(rt, no_hooks().policy_check, take=recorded).run()
    assert seen == [load_matrix().to_compiled()]
