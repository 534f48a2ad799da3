"""One lean child per heartbeat (issue #45): against the real hub on 127.0.0.1 and through real job children,
counted at the children seam, the policy probe asked right after a heartbeat carries the heartbeat's delivery in the
same child; an empty outbox adds no delivery part; a delivery job already running, or a fetch that probes nothing,
leaves the heartbeat to the delivery job."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import List, Sequence

import pytest

from agent.config import load_settings
from agent.daemon_jobs import children
from agent.daemon_jobs.children import (
    HEARTBEAT_REASON,
    ChildJobFailed,
    DeliveryInChild,
    LeanRound,
    PolicyFetchInChild,
    child_argv,
    lean_argv,
)
from agent.daemon_jobs.delivery import DeliveryJob
from agent.daemon_jobs.runtime import Runtime
from agent.host import Host
from agent.report.plain import PlainHeartbeat
from tests.bundle.test_fetch import hub_site
from tests.bundle.test_install import POLICY, run
from tests.daemon.conftest import AgentProcess
from tests.daemon.test_jobs import make_runtime
from tests.hub.process import HubProcess
from tests.hub.test_cli_hub_policy import hub  # noqa: F401 - the real hub fixture

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]  # a real hub process and real children


class Spawns:
    """Every child's command line, recorded as it starts: ``full:JOB``, or ``lean:`` and the parts asked; the jobs
    in ``failing`` exit 1 at once."""

    def __init__(self) -> None:
        self.started: List[str] = []
        self.failing: List[str] = []

    def full(self, job: str, config: str, root: str, request: str, result: str) -> Sequence[str]:
        self.started.append(f"full:{job}")
        if job in self.failing:
            return [sys.executable, "-c", "raise SystemExit(1)"]
        return child_argv(job, config, root, request, result)

    def lean(self, job: str, config: str, root: str, request: str, result: str) -> Sequence[str]:
        asked = json.loads(request)
        self.started.append("lean:" + "+".join(part for part in ("probe", "deliver") if asked.get(part) is not None))
        return lean_argv(job, config, root, request, result)

    def since(self, mark: int) -> List[str]:
        return self.started[mark:]


class Wiring:
    """The daemon's wiring of the fetch, the delivery job and the round, with the delivery job's wake-ups recorded."""

    def __init__(self, rt: Runtime, config: str, spawns: Spawns) -> None:
        self.woken: List[str] = []
        self.drain = DeliveryInChild(rt, config, argv=spawns.full, lean=spawns.lean)
        self.delivery = DeliveryJob(rt, drain=self.drain)
        lean_round = LeanRound(self.delivery, self.drain, self.woken.append, lambda seconds: None)
        self.fetch = PolicyFetchInChild(rt, config, lambda why: None, argv=spawns.full, probe=spawns.lean,
                                        lean_round=lean_round)


def heartbeat(rt: Runtime) -> None:
    """Commit a heartbeat as the daemon does with job children: without waking the delivery job."""
    rt.emitter.emit(PlainHeartbeat(agent_version="test", uptime_seconds=1.0), wake_delivery=False)


@pytest.fixture
def wired(hub: HubProcess, tmp_path: Path) -> tuple:  # noqa: F811
    """A site reporting to the real hub as node-1 (serial 3 pushed), its runtime, spawns and wiring, with the plans
    of both full children taken and the probe's answers recorded."""
    site, _host_token, admin = hub_site(hub, tmp_path)
    state = tmp_path / "state"  # the runtime's outbox is the one the children open
    site.config.write_text(re.sub(r'state_dir = "[^"]*"', f'state_dir = "{state}"', site.config.read_text()))
    assert run("hub", "policy", "push", str(site.bundle(3, POLICY)), "--hub", hub.url,
               "--token-file", str(admin))[0] == 0
    rt = make_runtime(tmp_path, Host.for_root(str(site.root)), load_settings(str(site.config)))
    spawns = Spawns()
    wiring = Wiring(rt, str(site.config), spawns)
    wiring.fetch.run()  # the full fetch installs serial 3 and hands back the probe's plan
    wiring.fetch.run()  # the first probe: its answers recorded by the full fetch after it
    heartbeat(rt)
    assert wiring.delivery.run("interval") is None  # the full delivery child hands back the lean plan
    assert spawns.started == ["full:policy_fetch", "lean:probe", "full:policy_fetch", "full:deliver"]
    assert rt.outbox.depth() == 0
    return rt, spawns, wiring, hub


def test_each_heartbeat_is_one_lean_child_that_probes_and_delivers(wired: tuple) -> None:
    """Three heartbeats: each is one lean child with both parts, the heartbeat reaches the hub, the outbox is empty,
    the delivery job is never woken, and its next interval run (nothing queued) starts no child."""
    rt, spawns, wiring, hub_process = wired
    mark = len(spawns.started)
    for _ in range(3):
        heartbeat(rt)
        wiring.fetch.run(HEARTBEAT_REASON)
        assert rt.outbox.depth() == 0
    assert spawns.since(mark) == ["lean:probe+deliver"] * 3 and wiring.woken == []
    assert wiring.delivery.run("interval") is None and spawns.since(mark + 3) == []
    with rt.state.lock:
        assert rt.state.last_delivery_success_seconds is not None


def test_an_empty_outbox_adds_no_delivery_part(wired: tuple) -> None:
    """A heartbeat-time fetch with nothing queued (the heartbeat could not be committed, say) is the probe alone."""
    rt, spawns, wiring, _ = wired
    mark = len(spawns.started)
    wiring.fetch.run(HEARTBEAT_REASON)
    assert spawns.since(mark) == ["lean:probe"] and wiring.woken == []


def test_a_running_delivery_or_a_full_fetch_leaves_the_heartbeat_to_the_delivery_job(
        wired: tuple, monkeypatch: pytest.MonkeyPatch) -> None:
    """While the delivery job is running the probe goes alone and the delivery job is woken for the heartbeat; on
    the hourly full fetch (no probe) the delivery job is woken too; nothing is sent twice or lost."""
    rt, spawns, wiring, _ = wired
    heartbeat(rt)
    mark = len(spawns.started)
    with wiring.delivery._running:  # a delivery run in progress (its drain may predate the heartbeat)
        wiring.fetch.run(HEARTBEAT_REASON)
    assert spawns.since(mark) == ["lean:probe"] and wiring.woken == ["event_enqueued"]
    wiring.delivery.run("event_enqueued")
    assert spawns.since(mark + 1) == ["lean:deliver"] and rt.outbox.depth() == 0

    monkeypatch.setattr(children, "FULL_FETCH_EVERY_SECONDS", 0.0)
    heartbeat(rt)
    mark = len(spawns.started)
    wiring.fetch.run(HEARTBEAT_REASON)
    assert spawns.since(mark) == ["full:policy_fetch"] and wiring.woken[1:] == ["event_enqueued"]
    wiring.delivery.run("event_enqueued")
    assert spawns.since(mark + 1) == ["lean:deliver"] and rt.outbox.depth() == 0


def test_a_failing_full_delivery_child_is_the_delivery_jobs_failure_not_the_fetchs(wired: tuple) -> None:
    """Without a lean plan the carried drain runs the full delivery child after the probe; when that child fails the
    fetch still takes the probe's answer (no full fetch), and the delivery job is woken to fail and back off on its
    own."""
    rt, spawns, wiring, _ = wired
    wiring.drain._plan = None  # as after a reload: the next drain is a full child
    spawns.failing.append("deliver")
    heartbeat(rt)
    mark = len(spawns.started)
    wiring.fetch.run(HEARTBEAT_REASON)
    assert spawns.since(mark) == ["lean:probe", "full:deliver"] and wiring.woken == ["event_enqueued"]
    with pytest.raises(ChildJobFailed):
        wiring.delivery.run("event_enqueued")
    assert rt.outbox.depth() == 1


def test_the_daemon_starts_one_lean_child_per_heartbeat(tmp_path: Path, hub: HubProcess) -> None:  # noqa: F811
    """A real ``gpuguard run`` against the real hub, heartbeat every 3 s: once both plans are taken, each heartbeat
    is one lean child with both parts that the hub acknowledged (no full child, no second lean child between
    them)."""
    site, _host_token, _admin = hub_site(hub, tmp_path)
    agent = AgentProcess(tmp_path / "agent", site.root)
    agent.workdir.mkdir()
    agent.write_config(re.sub(r'state_dir = "[^"]*"', f'state_dir = "{agent.state_dir}"', site.config.read_text())
                       .replace('[agent]\n', '[agent]\nlog_level = "debug"\n')
                       + "heartbeat_interval_seconds = 3\ndelivery_interval_seconds = 600\n"
                         "startup_jitter_seconds = 0.5\n[daemon]\nhealth_enabled = false\n"
                         "package_watch_interval_seconds = 60\n")
    agent.start()
    try:
        agent.wait_for_log("lean_child_answered", count=5, parts=["probe", "deliver"], deliver="delivered")
    finally:
        assert agent.terminate() == 0
    lines = agent.logs()
    both = [i for i, e in enumerate(lines) if e.get("event") == "lean_child_answered"
            and e.get("parts") == ["probe", "deliver"]]
    between = [e["job"] for e in lines[both[1] + 1:both[4] + 1] if e.get("event") == "job_child_exited"]
    assert between == ["lean"] * 3, between
