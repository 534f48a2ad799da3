"""Rollout evidence on the hub's clock (issue 43), against a real hub process over HTTP on SQLite and PostgreSQL:
hosts whose clocks run a day ahead (once), an hour ahead or ten minutes behind. A check from before admission never
counts, a truthful pass after admission counts (so it is never read as overdue), and a failure after admission
halts within one report interval."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any, Dict, List, Optional

import pytest
import requests

from agent.hub.bundles import PolicyBundles
from agent.hub.rows import utc_now
from agent.hub.store import make_store
from agent.hub.tokens import Principal, add_token
from agent.report.events import Event, HealthFailed, Heartbeat
from tests.hub.factories import ROCM_62, batch_json, event
from tests.hub.process import HubProcess, wait_until, write_config
from tests.hub.signing import check, keys_dir, signature_of
from tests.hub.test_policy_bundles import bundle_bytes

HOST = "host-a"
REPORT_INTERVAL_SECONDS = 60.0  # the agent's default heartbeat interval: a halt must be stored within it
DAY, HOUR, MINUTE = dt.timedelta(days=1), dt.timedelta(hours=1), dt.timedelta(minutes=1)


class Agent:
    """One host posting to the hub with its own clock: ``skew`` off the true time (the hub's)."""

    def __init__(self, hub: HubProcess, token: str, skew: dt.timedelta, host_id: str = HOST) -> None:
        self.hub, self.token, self.skew, self.host_id = hub, token, skew, host_id

    def now(self) -> dt.datetime:
        return utc_now() + self.skew

    def post(self, events: List[Event]) -> None:
        answer = requests.post(f"{self.hub.url}/v1/events", data=batch_json(events), timeout=30,
                               headers={"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"})
        assert answer.status_code == 200, answer.text

    def heartbeat(self, serial: int, health: str = "pass", checked_at: Optional[dt.datetime] = None) -> Event:
        """A heartbeat on ``serial`` stamped by this agent's clock; ``checked_at`` (the agent's clock too) says when
        the post-change check finished."""
        return event(self.host_id, at=self.now()).model_copy(update={"payload": Heartbeat(
            agent_version="1.0", uptime_seconds=1.0, pairing=ROCM_62, policy_source="bundle", policy_serial=serial,
            last_health_status=health, last_health_at=checked_at,
            last_health_after_change=None if checked_at is None else True)})


def start_hub(tmp_path: Path, database_url: str) -> HubProcess:
    config = write_config(tmp_path / "hub.toml", listen_port=0, database_url=database_url,
                          tokens_file=tmp_path / "tokens.json", tokens_reload_seconds=0, policy_keys_dir=keys_dir(),
                          rollout_tick_seconds=0.5)
    return HubProcess(config).start()


def rollout(hub: HubProcess, reader: str, rid: str) -> Dict[str, Any]:
    answer = requests.get(f"{hub.url}/v1/rollouts/{rid}", headers={"Authorization": f"Bearer {reader}"}, timeout=30)
    assert answer.status_code == 200, answer.text
    return dict(answer.json())


def evidence(hub: HubProcess, reader: str, rid: str) -> Optional[Dict[str, Any]]:
    [host] = rollout(hub, reader, rid)["hosts"]
    return host["evidence"]


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """SQLite in tmp_path, or a fresh PostgreSQL database."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/hub.db"
    return str(request.getfixturevalue("postgres_url"))


# (the host's clock before the rollout, its skew from then on, the failure it reports after admission, why the
# check from before admission does not count)
CLOCKS = {
    "a day ahead once": (DAY, dt.timedelta(0), "failed heartbeat", "the host's clock moved back"),
    "an hour ahead": (HOUR, HOUR, "health_failed event", "finished before admission"),
    "ten minutes behind": (-10 * MINUTE, -10 * MINUTE, "cpu_fallback event", "finished before admission"),
}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("clock", list(CLOCKS))
def test_evidence_is_judged_on_the_hubs_clock_whatever_the_hosts_clock(tmp_path: Path, database_url: str,
                                                                       clock: str) -> None:
    """Per skewed clock: a pre-admission check sent after admission keeps the canary waiting, a truthful post-change
    pass counts, and a failure reported after admission halts the rollout within one report interval."""
    before, skew, failure, not_counted = CLOCKS[clock]
    tokens = str(tmp_path / "tokens.json")
    host_token = add_token(tokens, "host", HOST)
    reader = add_token(tokens, "reader", "ops")
    admin = add_token(tokens, "admin", "alice")
    store = make_store(database_url)
    store.open()
    try:
        bundles = PolicyBundles(store, check(), utc_now)
        for serial in (1, 2):
            bundles.push(Principal(role="admin", subject="alice"), bundle_bytes(serial),
                         signature_of(bundle_bytes(serial)))
    finally:
        store.close()
    hub = start_hub(tmp_path, database_url)
    try:
        early = Agent(hub, host_token, before)
        checked_early = early.now()  # a check that finished before admission, on the clock the host had then
        early.post([early.heartbeat(1, checked_at=checked_early)])
        spec = {"target_serial": 2, "canaries": 1, "batches": [100], "soak_seconds": 3600}
        started = requests.post(f"{hub.url}/v1/rollouts", json=spec, timeout=30,
                                headers={"Authorization": f"Bearer {admin}"})
        assert started.status_code == 201, started.text
        rid = started.json()["rollout"]["rollout_id"]
        assert [h["stage"] for h in started.json()["hosts"]] == [0]
        agent = Agent(hub, host_token, skew)

        agent.post([agent.heartbeat(2, checked_at=checked_early)])  # the old check, read back on the target
        assert wait_until(lambda: not_counted in (evidence(hub, reader, rid) or {}).get("detail", "")), (
            clock, evidence(hub, reader, rid))
        assert evidence(hub, reader, rid)["result"] == "wait"  # type: ignore[index]

        agent.post([agent.heartbeat(2, checked_at=agent.now())])  # a truthful post-change pass
        assert wait_until(lambda: (evidence(hub, reader, rid) or {}).get("result") == "pass"), (
            clock, evidence(hub, reader, rid))
        assert rollout(hub, reader, rid)["rollout"]["state"] == "running"  # soaking: not overdue, not halted

        if failure == "failed heartbeat":
            agent.post([agent.heartbeat(2, health="failed", checked_at=agent.now())])
        elif failure == "health_failed event":
            agent.post([event(HOST, at=agent.now()).model_copy(update={
                "severity": "critical",
                "payload": HealthFailed(status="failed", summary="failed: gemm gave NaN", fingerprint="f2")})])
        else:
            agent.post([event(HOST, kind="cpu_fallback", at=agent.now())])
        assert wait_until(lambda: rollout(hub, reader, rid)["rollout"]["state"] == "halted",
                          REPORT_INTERVAL_SECONDS), (clock, rollout(hub, reader, rid))
    finally:
        hub.stop()
