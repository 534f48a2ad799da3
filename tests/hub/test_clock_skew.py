"""A host's clock skew (its newest heartbeat's time less the hub's receipt, issue 43), reported by a real hub process
over HTTP beyond agent/wire.py's bound: the host API, /metrics and the dashboard."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Dict

import pytest
import requests

from agent.hub.tokens import add_token
from agent.wire import CLOCK_SKEW_BOUND_SECONDS
from tests.hub.process import HubProcess, write_config
from tests.hub.signing import keys_dir
from tests.hub.test_rollout_clocks import Agent

SKEWS = {"ahead": dt.timedelta(days=1), "behind": -dt.timedelta(minutes=10), "close": dt.timedelta(seconds=2)}


@pytest.mark.timeout(180)
def test_hosts_beyond_the_skew_bound_are_reported_in_the_api_the_metric_and_the_dashboard(tmp_path: Path) -> None:
    """Hosts a day ahead and ten minutes behind are flagged with their skew in GET /v1/hosts, counted by
    gpuguard_hub_hosts_clock_skewed and shown on the dashboard; a host 2 s off is not."""
    tokens_file = str(tmp_path / "tokens.json")
    reader = {"Authorization": f"Bearer {add_token(tokens_file, 'reader', 'ops')}"}
    config = write_config(tmp_path / "hub.toml", listen_port=0, database_url=f"sqlite:///{tmp_path}/hub.db",
                          tokens_file=tokens_file, tokens_reload_seconds=0, policy_keys_dir=keys_dir())
    hub = HubProcess(config).start()
    try:
        for host_id, skew in SKEWS.items():
            agent = Agent(hub, add_token(tokens_file, "host", host_id), skew, host_id)
            agent.post([agent.heartbeat(1)])
        hosts: Dict[str, Dict[str, object]] = {
            h["host_id"]: h for h in requests.get(f"{hub.url}/v1/hosts", headers=reader, timeout=30).json()["hosts"]}
        assert {k: hosts[k]["clock_skewed"] for k in SKEWS} == {"ahead": True, "behind": True, "close": False}
        for host_id, skew in SKEWS.items():  # within a minute: the time the post took, on a loaded machine
            assert abs(float(hosts[host_id]["clock_skew_seconds"]) - skew.total_seconds()) < 60  # type: ignore[arg-type]
        metrics = requests.get(f"{hub.url}/metrics", headers=reader, timeout=30).text
        assert "gpuguard_hub_hosts_clock_skewed 2.0" in metrics
        overview = requests.get(f"{hub.url}/ui/", headers=reader, timeout=30).text
        assert '<span class="n" id="count-clock-skewed">2</span>' in overview
        page = requests.get(f"{hub.url}/ui/hosts/ahead", headers=reader, timeout=30).text
        assert f"clock off by more than {CLOCK_SKEW_BOUND_SECONDS} s from the hub" in page
        assert "from the hub" not in requests.get(f"{hub.url}/ui/hosts/close", headers=reader, timeout=30).text
    finally:
        hub.stop()
