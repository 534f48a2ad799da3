"""A fleet of real agents (``gpuguard run``, one fake host root each) against the real hub: a signed bundle pushed
with ``gpuguard hub policy push`` reaches every host in its scope within two polling intervals and no other; a hub
outage changes nothing on the hosts; once the hub is back they catch up with the next bundle."""

from __future__ import annotations

import json
import os
import shutil
import time
import urllib.request
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Optional

import pytest

from agent.hub.tokens import Role, add_token
from tests.bundle.keys import Signer
from tests.bundle.test_install import PERMISSIVE, POLICY, run
from tests.conftest import ROOTS
from tests.daemon.conftest import AgentProcess
from tests.hub.process import HubProcess, write_config

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]  # a hub and 20 daemons: ~2 min on the loaded 2 cores

# Each fetch and each delivery is a job child of ~0.4 CPU seconds: 20 agents at a 20 s interval ask ~1 core of the
# 2-core test machine, and under the shared machine's load a child takes up to ~15 s of wall time. Both can be set
# for a quieter or a busier machine. Each wait is its intervals plus LOAD_MARGIN_SECONDS: a margin that only ends a
# broken run, since how many intervals a loaded machine needs is not the agent's behaviour (issue 38); the seconds
# each step took are printed. When the interval fetch runs is tested on a virtual clock (test_scheduler).
AGENTS = int(os.environ.get("GPUGUARD_TEST_FLEET_AGENTS", "20"))
INTERVAL_SECONDS = float(os.environ.get("GPUGUARD_TEST_FLEET_INTERVAL_SECONDS", "20"))  # heartbeat = policy fetch
OUT_OF_SCOPE = frozenset(range(3, AGENTS, 4))  # every fourth host is in ring "main", the rest in ring "canary"
LOAD_MARGIN_SECONDS = 240.0
START_DEADLINE_SECONDS = 3 * INTERVAL_SECONDS + LOAD_MARGIN_SECONDS


def agent_config(state_dir: Path, host_id: str, ring: str, hub_url: str, token_file: Path) -> str:
    """A light agent: policy from bundles, no health probe, snapshots rarely, a short heartbeat and fetch."""
    return "\n".join([
        "[agent]", f'state_dir = "{state_dir}"', 'log_level = "info"', f'host_id = "{host_id}"',
        f'labels = {{ ring = "{ring}" }}',
        "[snapshot]", "interval_seconds = 600",
        "[daemon]", "package_watch_interval_seconds = 5", "health_enabled = false",
        *bundle_and_report_lines(hub_url, token_file, INTERVAL_SECONDS)]) + "\n"


def bundle_and_report_lines(hub_url: str, token_file: Path, delivery_interval_seconds: float) -> List[str]:
    """A fleet agent's [guard] (policy from bundles) and [report] sections: the short heartbeat (= policy fetch),
    a quick start and quick retries against the test hub."""
    return ["[guard]", 'policy_source = "bundle"',
            "[report]", f'endpoint_url = "{hub_url}"', f'token_file = "{token_file}"',
            f"heartbeat_interval_seconds = {INTERVAL_SECONDS}",
            f"delivery_interval_seconds = {delivery_interval_seconds}",
            "startup_jitter_seconds = 1", "backoff_base_seconds = 0.2", "backoff_cap_seconds = 1",
            "connect_timeout_seconds = 1", "read_timeout_seconds = 3"]


class FleetAgent(AgentProcess):
    """One agent of the fleet: its host id and host token file besides the process."""

    def __init__(self, workdir: Path, root: Path, host_id: str, token_file: Path) -> None:
        super().__init__(workdir, root)
        self.host_id = host_id
        self.token_file = token_file


class Fleet:
    """The hub, its tokens, and the agents with their roots."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp = tmp_path
        hub_dir = tmp_path / "hub"
        hub_dir.mkdir()
        self.tokens = hub_dir / "tokens.json"
        self.hub = HubProcess(write_config(hub_dir / "hub.toml", listen_host="127.0.0.1", listen_port=0,
                                           database_url=f"sqlite:///{hub_dir}/hub.db", tokens_file=self.tokens,
                                           tokens_reload_seconds=0, shutdown_timeout_seconds=5,
                                           policy_keys_dir=hub_dir / "keys"))
        self.admin = self.token("admin", "alice")
        self.reader = self.token("reader", "bob").read_text().strip()
        self.signer = Signer(tmp_path, "ops")
        self.signer.export(hub_dir / "keys/ops.gpg")  # the hub verifies each push against it
        self.agents: List[FleetAgent] = []

    def token(self, role: Role, subject: str) -> Path:
        path = self.tmp / f"{role}-{subject}.token"
        path.write_text(add_token(str(self.tokens), role, subject) + "\n")
        os.chmod(path, 0o600)
        return path

    def add_agents(self) -> None:
        for n in range(AGENTS):
            workdir = self.tmp / f"host-{n:02d}"
            workdir.mkdir()
            root = workdir / "root"
            shutil.copytree(ROOTS / "gpuless-debian12", root, symlinks=True)
            self.signer.export(root / "etc/gpuguard/keys/ops.gpg")
            host_id = f"fleet-{n:02d}"
            self.agents.append(FleetAgent(workdir, root, host_id, self.token("host", host_id)))

    def configure(self) -> None:
        for n, agent in enumerate(self.agents):
            ring = "main" if n in OUT_OF_SCOPE else "canary"
            agent.write_config(agent_config(agent.state_dir, agent.host_id, ring, self.hub.url, agent.token_file))

    def in_scope(self) -> List[FleetAgent]:
        return [a for n, a in enumerate(self.agents) if n not in OUT_OF_SCOPE]

    def out_of_scope(self) -> List[FleetAgent]:
        return [a for n, a in enumerate(self.agents) if n in OUT_OF_SCOPE]

    def bundle(self, serial: int, policy: str) -> Path:
        """``policy bundle`` for ring canary, signed with the operator's real key."""
        policy_dir = self.tmp / f"policy-{serial}.d"
        policy_dir.mkdir()
        (policy_dir / "10-site.toml").write_text(policy)
        target = self.tmp / f"bundle-{serial}.json"
        code, out, err = run("policy", "bundle", str(policy_dir), "--serial", str(serial), "-o", str(target),
                             "--no-host", "--created-by", "ops@example.com", "--label", "ring=canary")
        assert code == 0, out + err
        self.signer.sign(target)
        return target

    def push(self, bundle: Path) -> tuple:
        return run("hub", "policy", "push", str(bundle), "--hub", self.hub.url, "--token-file", str(self.admin))

    def policy_hosts(self) -> Dict[str, dict]:
        """The hub's ``GET /v1/policy/hosts``, by host id."""
        request = urllib.request.Request(self.hub.url + "/v1/policy/hosts",
                                         headers={"Authorization": f"Bearer {self.reader}"})
        with urllib.request.urlopen(request, timeout=5) as reply:
            return {row["host_id"]: row for row in json.loads(reply.read())["hosts"]}

    def stop(self) -> None:
        for agent in self.agents:
            agent.cleanup()  # SIGKILL by PID, only if still running
        self.hub.stop()
        self.signer.close()


def rooted_state(agent: AgentProcess) -> Path:
    """The state directory's files that live under the host root (the bundle, the compiled policy)."""
    return agent.root / str(agent.state_dir).lstrip("/")


def bundle_state(agent: AgentProcess) -> Optional[dict]:
    path = rooted_state(agent) / "policy-bundle/state.json"
    return json.loads(path.read_text()) if path.exists() else None


def serial_in_force(agent: AgentProcess) -> Optional[int]:
    state = bundle_state(agent)
    return None if state is None else state.get("serial")


def host_files(agent: AgentProcess) -> Dict[str, bytes]:
    """What a bundle install would change: the bundle state, the bundle in force, the compiled policy."""
    state = rooted_state(agent)
    found = {}
    for path in [state / "policy.compiled.json", *sorted((state / "policy-bundle").rglob("*"))]:
        if path.is_file() and path.name != ".lock":
            found[str(path.relative_to(state))] = path.read_bytes()
    return found


def wait_for(what: str, predicate: Callable[[], bool], deadline: float, detail: Callable[[], object]) -> float:
    """Poll until ``predicate`` holds; the monotonic time it did; fails at ``deadline`` (monotonic). Twice a second:
    the polling reads 20 logs or asks the hub, and the machine has little to spare."""
    while not predicate():
        assert time.monotonic() < deadline, f"{what}: {detail()}"
        time.sleep(0.5)
    return time.monotonic()


def failed_fetches(agent: AgentProcess) -> int:
    return len(agent.events_named("policy_fetch_failed"))


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Fleet]:
    built = Fleet(tmp_path)
    yield built
    built.stop()


def test_a_pushed_bundle_reaches_its_scope_survives_a_hub_outage_and_catches_up(fleet: Fleet) -> None:
    """20 agents (by default): a push reaches the 15 in scope (state and the hub's view), the 5 outside never take
    it; with the hub down nothing changes on any host; back up, the next bundle reaches the 15."""
    fleet.add_agents()
    fleet.hub.start()
    port = fleet.hub.port
    fleet.configure()
    started = time.monotonic()
    for agent in fleet.agents:
        agent.start()
    hosts = wait_for("every host heard from with its labels", lambda: len(fleet.policy_hosts()) == AGENTS,
                     started + START_DEADLINE_SECONDS, lambda: sorted(fleet.policy_hosts()))
    print(f"fleet of {AGENTS} up and heard from in {hosts - started:.1f} s")

    code, out, err = fleet.push(fleet.bundle(1, POLICY))
    assert code == 0, out + err
    pushed = time.monotonic()
    reached = wait_for("serial 1 on every host in scope", lambda: all(serial_in_force(a) == 1
                                                                      for a in fleet.in_scope()),
                       pushed + 2 * INTERVAL_SECONDS + LOAD_MARGIN_SECONDS,
                       lambda: [serial_in_force(a) for a in fleet.agents])
    print(f"serial 1 on {len(fleet.in_scope())} hosts {reached - pushed:.1f} s after the push")
    for agent in fleet.in_scope():
        state = bundle_state(agent)
        assert state is not None and state["fingerprint"] == fleet.signer.fingerprint
        compiled = json.loads((rooted_state(agent) / "policy.compiled.json").read_text())
        assert compiled["sources"][0]["path"].endswith("policy-bundle/policy.d/10-site.toml")
    wait_for("the hub shows serial 1 for every host in scope", lambda: all(
        fleet.policy_hosts()[a.host_id]["policy_serial"] == 1 for a in fleet.in_scope()),
        time.monotonic() + 2 * INTERVAL_SECONDS + LOAD_MARGIN_SECONDS, fleet.policy_hosts)
    view = fleet.policy_hosts()
    for agent in fleet.out_of_scope():
        row = view[agent.host_id]
        assert (row["policy_serial"], row["offered_serial"], row["behind"]) == (None, None, False), row
        assert bundle_state(agent) is None  # never offered, so never taken nor refused
    assert not any(a.events_named("policy_bundle_refused") for a in fleet.agents)

    fleet.hub.stop()
    before = {a.host_id: host_files(a) for a in fleet.agents}
    failed_before = {a.host_id: failed_fetches(a) for a in fleet.agents}
    second = fleet.bundle(2, PERMISSIVE)
    code, out, err = fleet.push(second)
    assert code != 0 and len(err.strip().splitlines()) == 1, (code, out, err)
    down = time.monotonic()
    wait_for("every host tried the hub that is down", lambda: all(
        failed_fetches(a) > failed_before[a.host_id] for a in fleet.agents),
        down + 3 * INTERVAL_SECONDS + LOAD_MARGIN_SECONDS, lambda: [failed_fetches(a) for a in fleet.agents])
    for agent in fleet.agents:
        assert agent.proc is not None and agent.proc.poll() is None, agent.log_path.read_text()[-2000:]
        assert host_files(agent) == before[agent.host_id]
    assert all(serial_in_force(a) == 1 for a in fleet.in_scope())

    fleet.hub.config_path.write_text(fleet.hub.config_path.read_text().replace("listen_port = 0",
                                                                               f"listen_port = {port}"))
    fleet.hub.start()
    code, out, err = fleet.push(second)
    assert code == 0, out + err
    pushed = time.monotonic()
    reached = wait_for("serial 2 on every host in scope after the outage", lambda: all(
        serial_in_force(a) == 2 for a in fleet.in_scope()),
        pushed + 2 * INTERVAL_SECONDS + LOAD_MARGIN_SECONDS, lambda: [serial_in_force(a) for a in fleet.agents])
    print(f"serial 2 on {len(fleet.in_scope())} hosts {reached - pushed:.1f} s after the hub came back")
    wait_for("the hub shows serial 2 for every host in scope", lambda: all(
        fleet.policy_hosts()[a.host_id]["policy_serial"] == 2 for a in fleet.in_scope()),
        time.monotonic() + 2 * INTERVAL_SECONDS + LOAD_MARGIN_SECONDS, fleet.policy_hosts)
    assert all(bundle_state(a) is None for a in fleet.out_of_scope())
    for agent in fleet.agents:
        assert agent.terminate() == 0, agent.log_path.read_text()[-2000:]
    print(f"whole fleet test {time.monotonic() - started:.1f} s")
