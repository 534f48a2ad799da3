"""A staged rollout end to end (issue #33): a real hub on PostgreSQL and 20 real agents (``gpuguard run``, one fake
host root each) in two cohorts (Debian 12 and Debian 13 roots). Each host's change is simulated in its root: when it
enforces the target bundle, the test upgrades a watched package in its dpkg status, and the agent's own post-change
health check (a real job child running tests/health/probes/fake_probe.py) reports what the host's probe says.

Rollout A: the canaries are admitted first and only they take the target; after the soak the hub widens; a hub
restart mid-rollout loses nothing and the rollout carries on. Rollout B, started with a staged revert bundle
(rollout A's policy under serial 4, signed in advance): a canary whose post-change check reports ``cpu_fallback``
halts it; the halt alert reaches a webhook receiver on 127.0.0.1 and names that host; abort withdraws the target and
releases the revert, which returns the admitted hosts with no new push (docs/hub.md, "Abort");
no host outside the admitted stages ever takes either target."""

from __future__ import annotations

import datetime as dt
import json
import os
import pwd
import re
import shutil
import signal
import sys
import time
import urllib.request
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Optional, Set

import pytest

from tests.bundle.test_install import PERMISSIVE, POLICY, run
from tests.daemon.conftest import daemon_children
from tests.daemon.test_policy_fleet import (
    INTERVAL_SECONDS,
    LOAD_MARGIN_SECONDS,
    Fleet,
    FleetAgent,
    bundle_and_report_lines,
    serial_in_force,
    wait_for,
)
from tests.hub.conftest import postgres_server, postgres_url  # noqa: F401 - fixtures
from tests.hub.process import HubProcess, write_config
from tests.hub.webhook_receiver import Receiver

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]  # a hub, 20 daemons and their health children

AGENTS = int(os.environ.get("GPUGUARD_TEST_ROLLOUT_AGENTS", "20"))  # half Debian 12, half Debian 13
SOAK_SECONDS = 15
FAKE_PROBE = Path(__file__).resolve().parents[1] / "health/probes/fake_probe.py"
SEAM = Path(__file__).resolve().parent / "health_under_root"
REPO = Path(__file__).resolve().parents[2]
# Per stage: a fetch and a heartbeat (an interval each), the change, a check, and the margin that only ends a broken
# run: at load average 20-25 on 2 cores the canaries once took longer than 3 intervals + 30 s (issue 38).
STAGE_DEADLINE_SECONDS = 3 * INTERVAL_SECONDS + LOAD_MARGIN_SECONDS


def agent_config(agent: "RolloutAgent", hub_url: str) -> str:
    """A light agent with a real health check: policy from bundles, the fake probe, a short heartbeat and fetch."""
    return "\n".join([
        "[agent]", f'state_dir = "{agent.state_dir}"', 'log_level = "info"', f'host_id = "{agent.host_id}"',
        'labels = { ring = "canary" }',
        "[snapshot]", "interval_seconds = 600",
        "[daemon]", "package_watch_interval_seconds = 2", "health_interval_seconds = 3600",
        "health_first_run_seconds = 0",
        "[health]", f'python = "{agent.probe_python}"', "timeout_seconds = 60",
        f'run_as = "{pwd.getpwuid(os.geteuid()).pw_name}"', "require_accelerator = false", "expected_gpu_count = 1",
        *bundle_and_report_lines(hub_url, agent.token_file, INTERVAL_SECONDS / 4)]) + "\n"


class RolloutAgent(FleetAgent):
    """A fleet agent whose "ML interpreter" runs the fake probe in the mode its ``probe-mode`` file names."""

    def __init__(self, workdir: Path, root: Path, host_id: str, token_file: Path) -> None:
        super().__init__(workdir, root, host_id, token_file)
        self.env = {"PYTHONPATH": f"{SEAM}{os.pathsep}{REPO}", "GPUGUARD_TEST_HEALTH_UNDER_ROOT": "1"}
        self.mode_file = workdir / "probe-mode"
        self.mode_file.write_text("pass\n")
        self.probe_python = workdir / "ml-python"
        self.probe_python.write_text(f"#!{sys.executable}\nimport os, sys\n"
                                     f"mode = open({str(self.mode_file)!r}).read().strip()\n"
                                     f"os.execv(sys.executable, [sys.executable, {str(FAKE_PROBE)!r}, '--mode', "
                                     "mode])\n")
        self.probe_python.chmod(0o755)
        self.changed = False
        self.upgrades = 0

    def change(self) -> None:
        """The upgrade the target allows, in this host's root: a newer kernel metapackage (a watched package)."""
        status = self.root / "var/lib/dpkg/status"
        text = status.read_text()
        upgraded = re.sub(r"(Package: linux-image-amd64\n(?:[^\n]+\n)*?Version: )[^\n]+",
                          rf"\g<1>6.1.{999 + self.upgrades}-1", text, count=1)
        assert upgraded != text, "no linux-image-amd64 in the fake root's dpkg status"
        status.write_text(upgraded)
        self.changed = True
        self.upgrades += 1


class RolloutFleet(Fleet):
    """The #32 fleet on a PostgreSQL hub with a webhook receiver, its agents in two OS-release cohorts."""

    def __init__(self, tmp_path: Path, database_url: str, receiver: Receiver) -> None:
        super().__init__(tmp_path)
        hub_dir = tmp_path / "hub"
        self.hub = HubProcess(write_config(
            hub_dir / "hub.toml", listen_host="127.0.0.1", listen_port=0, database_url=database_url,
            tokens_file=self.tokens, tokens_reload_seconds=0, shutdown_timeout_seconds=5, rollout_tick_seconds=2,
            alert_retry_initial_seconds=0.2, alert_retry_max_seconds=1, alert_timeout_seconds=2,
            alert_poll_seconds=0.2, policy_keys_dir=hub_dir / "keys"))
        with self.hub.config_path.open("a") as config:
            config.write(f'\n[[alert_webhooks]]\nname = "ops"\nurl = "{receiver.url}"\n')
        self.agents: List[FleetAgent] = []
        self.seen: Dict[str, Set[int]] = {}  # every serial each host was seen enforcing

    def add_rollout_agents(self) -> List[RolloutAgent]:
        for n in range(AGENTS):
            workdir = self.tmp / f"host-{n:02d}"
            workdir.mkdir()
            root = workdir / "root"
            shutil.copytree(ROOT, root, symlinks=True)
            if n >= AGENTS // 2:  # the second cohort: Debian 13
                release = root / "etc/os-release"
                release.write_text(release.read_text().replace('VERSION_ID="12"', 'VERSION_ID="13"'))
            self.signer.export(root / "etc/gpuguard/keys/ops.gpg")
            host_id = f"fleet-{n:02d}"
            self.agents.append(RolloutAgent(workdir, root, host_id, self.token("host", host_id)))
        return self.rollout_agents()

    def rollout_agents(self) -> List[RolloutAgent]:
        return [a for a in self.agents if isinstance(a, RolloutAgent)]

    def observe(self, target: Optional[int] = None, failing: Set[str] = frozenset(),
                rollout_id: Optional[str] = None) -> None:
        """Record each host's serial; a host that enforces ``target`` gets its change (``failing``: cpu probe) and
        must be admitted to ``rollout_id`` already (read after the hosts, so an admission just made counts)."""
        on_target = []
        for agent in self.rollout_agents():
            serial = serial_in_force(agent)
            if serial is not None:
                self.seen.setdefault(agent.host_id, set()).add(serial)
            if target is not None and serial == target:
                on_target.append(agent.host_id)
                if not agent.changed:
                    if agent.host_id in failing:
                        agent.mode_file.write_text("cpu\n")
                    agent.change()
        if rollout_id is not None and on_target:
            outside = set(on_target) - admitted(self.rollout(rollout_id))
            assert not outside, f"hosts outside the admitted stages enforce serial {target}: {sorted(outside)}"

    def api(self, method: str, path: str, admin: bool = False) -> dict:
        token = self.admin.read_text().strip() if admin else self.reader
        request = urllib.request.Request(self.hub.url + path, method=method, data=b"{}" if method == "POST" else None,
                                         headers={"Authorization": f"Bearer {token}",
                                                  "Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=10) as reply:
            return dict(json.loads(reply.read()))

    def rollout(self, rollout_id: str) -> dict:
        return self.api("GET", f"/v1/rollouts/{rollout_id}")

    def start_rollout(self, serial: int, soak_seconds: int, revert: Optional[int] = None) -> str:
        """Push nothing: start a rollout of the pushed ``serial`` (one canary a cohort, then 50 %, then 100 %),
        with the staged ``revert`` bundle abort would release."""
        code, out, err = run("hub", "rollout", "start", str(serial), "--canaries", "1", "--batches", "50,100",
                             "--soak-seconds", str(soak_seconds), "--json", "--hub", self.hub.url,
                             "--token-file", str(self.admin),
                             *(["--revert-serial", str(revert)] if revert is not None else []))
        assert code == 0, out + err
        return str(json.loads(out)["rollout"]["rollout_id"])

    def frozen_push_and_start(self, serial: int, policy: str, soak_seconds: int,
                              revert_policy: Optional[str] = None) -> str:
        """Push the target (and, with ``revert_policy``, its revert bundle staged under the next serial) and start
        its rollout while every agent and its job children are stopped (SIGSTOP by PID): a pushed bundle is offered
        to its whole scope until a rollout of it starts (docs/hub.md, "End to end")."""
        bundle = self.bundle(serial, policy)
        stopped: List[int] = []
        for agent in self.agents:
            if agent.proc is not None and agent.proc.poll() is None:
                os.kill(agent.proc.pid, signal.SIGSTOP)  # first the daemon: it starts no child while stopped
                stopped.append(agent.proc.pid)
                for child in daemon_children(agent.proc.pid):
                    try:
                        os.kill(child, signal.SIGSTOP)
                        stopped.append(child)
                    except ProcessLookupError:
                        pass
        try:
            time.sleep(1)  # a fetch sent just before the stop is answered before the push
            code, out, err = self.push(bundle)
            assert code == 0, out + err
            if revert_policy is None:
                return self.start_rollout(serial, soak_seconds)
            # the way back, signed with the target: the next serial, staged (offered to nobody until an abort)
            code, out, err = run("hub", "policy", "push", str(self.bundle(serial + 1, revert_policy)), "--staged",
                                 "--hub", self.hub.url, "--token-file", str(self.admin))
            assert code == 0, out + err
            return self.start_rollout(serial, soak_seconds, serial + 1)
        finally:
            for pid in reversed(stopped):
                try:
                    os.kill(pid, signal.SIGCONT)
                except ProcessLookupError:
                    pass


ROOT = Path(__file__).resolve().parents[1] / "fixtures/roots/gpuless-debian12"


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    made = Receiver()
    made.up()
    yield made
    made.stop()


@pytest.fixture
def fleet(tmp_path: Path, postgres_url: str, receiver: Receiver) -> Iterator[RolloutFleet]:  # noqa: F811
    built = RolloutFleet(tmp_path, postgres_url, receiver)
    yield built
    built.stop()


def passed(host: dict) -> bool:
    return bool(host["evidence"]) and host["evidence"]["result"] == "pass"


def post_change_checks(agent: FleetAgent, status: str) -> int:
    """How many health checks the agent ran after a change of its stack (its root's dpkg status) with ``status``."""
    return sum(str(e.get("reason", "")).startswith("stack_changed") and e.get("status") == status
               for e in agent.events_named("health_job_done"))


def admitted(status: dict) -> Set[str]:
    return {h["host_id"] for h in status["hosts"] if h["stage"] is not None}


def wait_observing(fleet: RolloutFleet, what: str, predicate: Callable[[], object], seconds: float,
                   detail: Callable[[], object], target: Optional[int] = None, failing: Set[str] = frozenset(),
                   rollout_id: Optional[str] = None) -> float:
    """``wait_for`` that simulates each admitted host's change as it takes ``target`` and records every serial."""
    def check() -> bool:
        fleet.observe(target, failing, rollout_id)
        return bool(predicate())
    return wait_for(what, check, time.monotonic() + seconds, detail)


def test_canaries_widen_restart_abort_and_a_failing_canary_halts(fleet: RolloutFleet,
                                                                  receiver: Receiver) -> None:
    """Rollout A: canaries first, widening after the soak, a hub restart losing nothing; rollout B: a cpu_fallback
    canary halts it with an alert naming it, abort releases its staged revert bundle and the admitted hosts return;
    no host outside the admitted stages ever takes a target."""
    agents = fleet.add_rollout_agents()
    fleet.hub.start()
    port = fleet.hub.port
    for agent in agents:
        agent.write_config(agent_config(agent, fleet.hub.url))
    started = time.monotonic()
    for agent in agents:
        agent.start()

    def hosts_ready() -> bool:
        hosts = fleet.api("GET", "/v1/hosts")["hosts"]
        return len(hosts) == AGENTS and all(h["pairing"] and h["last_health_status"] == "pass" for h in hosts)
    wait_for("every host heard from with its pairing and a passing baseline check", hosts_ready,
             started + 3 * INTERVAL_SECONDS + LOAD_MARGIN_SECONDS, lambda: fleet.api("GET", "/v1/hosts")["hosts"])
    code, out, err = fleet.push(fleet.bundle(1, POLICY))
    assert code == 0, out + err
    wait_observing(fleet, "serial 1 on every host", lambda: all(serial_in_force(a) == 1 for a in agents),
                   STAGE_DEADLINE_SECONDS, lambda: [serial_in_force(a) for a in agents])
    print(f"fleet of {AGENTS} on serial 1 after {time.monotonic() - started:.1f} s")

    # --- rollout A: target 2, canaries, then 50 %, then 100 % of each cohort ---------------------------------
    rid = fleet.frozen_push_and_start(2, PERMISSIVE, SOAK_SECONDS)
    status = fleet.rollout(rid)
    cohorts = {h["cohort"] for h in status["hosts"]}
    assert len(cohorts) == 2 and any("debian-12" in c for c in cohorts) and any("debian-13" in c for c in cohorts)
    canaries = admitted(status)
    assert canaries == {"fleet-00", f"fleet-{AGENTS // 2:02d}"}, status
    by_id = {a.host_id: a for a in agents}
    a_start = time.monotonic()
    wait_observing(fleet, "the canaries on serial 2 and passing", lambda: all(
        passed(h) for h in fleet.rollout(rid)["hosts"] if h["stage"] == 0),
        STAGE_DEADLINE_SECONDS, lambda: fleet.rollout(rid)["hosts"], target=2, rollout_id=rid)
    assert all(by_id[h].changed for h in canaries)
    assert canaries <= {a.host_id for a in agents if 2 in fleet.seen.get(a.host_id, set())}

    widened = wait_observing(fleet, "stage 1 opened after the soak", lambda: fleet.rollout(rid)["rollout"][
        "stage"] >= 1, SOAK_SECONDS + LOAD_MARGIN_SECONDS, lambda: fleet.rollout(rid)["rollout"], target=2,
        rollout_id=rid)
    before = fleet.rollout(rid)
    stage_one = {h["host_id"] for h in before["hosts"] if h["stage"] == 1}
    assert len(stage_one | canaries) == 2 * -(-(AGENTS // 2) // 2), before  # 50 % of each cohort, rounded up
    opened = min(dt.datetime.fromisoformat(h["admitted_at"]) for h in before["hosts"] if h["stage"] == 1)
    canary_at = max(dt.datetime.fromisoformat(h["admitted_at"]) for h in before["hosts"] if h["stage"] == 0)
    assert opened - canary_at >= dt.timedelta(seconds=SOAK_SECONDS)  # the soak held stage 1 back
    print(f"rollout A: stage 1 ({len(stage_one)} more hosts) {widened - a_start:.1f} s after the start")

    # A hub restart mid-rollout (stage 1 just opened) loses nothing, and the rollout carries on from the rows.
    assert fleet.hub.stop() == 0, fleet.hub.log_text()
    fleet.hub.config_path.write_text(fleet.hub.config_path.read_text().replace("listen_port = 0",
                                                                               f"listen_port = {port}"))
    fleet.hub.start()
    after = fleet.rollout(rid)
    assert after["rollout"]["state"] in ("running", "done")
    assert after["rollout"]["created_at"] == before["rollout"]["created_at"]
    assert after["rollout"]["stage"] >= 1
    assert [(h["host_id"], h["cohort"]) for h in after["hosts"]] == [(h["host_id"], h["cohort"])
                                                                     for h in before["hosts"]]
    for mine, theirs in zip(after["hosts"], before["hosts"]):
        if theirs["stage"] is not None:
            assert (mine["stage"], mine["admitted_at"]) == (theirs["stage"], theirs["admitted_at"])
    wait_observing(fleet, "rollout A done, serial 2 on every host", lambda: fleet.rollout(rid)["rollout"][
        "state"] == "done" and all(serial_in_force(a) == 2 for a in agents), 2 * STAGE_DEADLINE_SECONDS + SOAK_SECONDS,
        lambda: (fleet.rollout(rid), [serial_in_force(a) for a in agents]), target=2, rollout_id=rid)
    final = fleet.rollout(rid)
    assert {h["stage"] for h in final["hosts"]} == {0, 1, 2} and all(passed(h) for h in final["hosts"])
    stages = [e["detail"] for e in fleet.api("GET", "/v1/audit?limit=1000")["entries"]
              if e["action"] == "rollout_stage" and e["serial"] == 2]
    opened_stages = sorted(int(re.search(r"stage (\d+) opened", d).group(1)) for d in stages)  # type: ignore[union-attr]
    assert opened_stages == [0, 1, 2], stages  # each stage opened once, restart or not
    assert all(a.changed for a in agents)
    wait_for("every host's own post-change check passed", lambda: all(
        post_change_checks(a, "pass") for a in agents), time.monotonic() + STAGE_DEADLINE_SECONDS,
        lambda: {a.host_id: post_change_checks(a, "pass") for a in agents})
    print(f"rollout A: done {time.monotonic() - a_start:.1f} s after its start")

    # --- rollout B: target 3; the Debian 13 canary's post-change check falls back to the CPU -----------------
    for agent in agents:
        agent.changed = False
    bad = f"fleet-{AGENTS // 2:02d}"
    # With its way back: serial 4 carries rollout A's policy, signed and pushed staged with the target.
    rid_b = fleet.frozen_push_and_start(3, PERMISSIVE.replace('name = "unit"', 'name = "unit-b"'), 600,
                                        revert_policy=PERMISSIVE)
    b_start = time.monotonic()
    assert admitted(fleet.rollout(rid_b)) == canaries
    wait_observing(fleet, "rollout B halted", lambda: fleet.rollout(rid_b)["rollout"]["state"] == "halted",
                   STAGE_DEADLINE_SECONDS, lambda: fleet.rollout(rid_b), target=3, failing={bad}, rollout_id=rid_b)
    halted = fleet.rollout(rid_b)
    assert post_change_checks(by_id[bad], "cpu_fallback") == 1  # the check after its change for serial 3
    assert bad in halted["rollout"]["reason"] and "cpu_fallback" in halted["rollout"]["reason"], halted
    print(f"rollout B: halted {time.monotonic() - b_start:.1f} s after its start: {halted['rollout']['reason']}")

    def halt_alerts() -> List[dict]:
        return [r["body"]["hub_alert"] for r in receiver.delivered()
                if r["body"].get("hub_alert", {}).get("kind") == "rollout_halted"]
    wait_for("the halt alert at the webhook", lambda: bool(halt_alerts()), time.monotonic() + 120,
             lambda: receiver.requests)
    alert = halt_alerts()[0]
    assert alert["rollout_id"] == rid_b and bad in alert["summary"], alert
    assert [(h["host_id"], h["result"]) for h in alert["hosts"]] == [(bad, "fail")], alert
    deadline = time.monotonic() + INTERVAL_SECONDS
    while time.monotonic() < deadline:
        fleet.observe(3, {bad}, rid_b)
        time.sleep(0.5)
    assert admitted(fleet.rollout(rid_b)) == canaries
    assert {a.host_id for a in agents if 3 in fleet.seen.get(a.host_id, set())} <= canaries
    assert len(halt_alerts()) == 1

    assert all(serial_in_force(a) != 4 for a in agents)  # the staged revert reached nobody

    # Abort: the target is withdrawn and the revert bundle released: the admitted hosts return with no new push.
    code, out, err = run("hub", "rollout", "abort", rid_b, "--hub", fleet.hub.url, "--token-file", str(fleet.admin))
    assert code == 0 and "aborted" in out and "revert bundle 4 released" in out, out + err
    wait_observing(fleet, "serial 4 (the previous policy) on every host", lambda: all(
        serial_in_force(a) == 4 for a in agents), STAGE_DEADLINE_SECONDS, lambda: [serial_in_force(a) for a in agents])
    took_b = {a.host_id for a in agents if 3 in fleet.seen.get(a.host_id, set())}
    assert took_b <= canaries and "fleet-00" in took_b, took_b
    for agent in agents:
        assert agent.terminate() == 0, agent.log_path.read_text()[-2000:]
    print(f"whole rollout test {time.monotonic() - started:.1f} s")
