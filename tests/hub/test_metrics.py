"""The hub's /metrics over a seeded fleet, and the example alerting rules in packaging/prometheus/ (promtool)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Dict, Iterator

import pytest
from fastapi.testclient import TestClient

from agent.hub.app import create_app
from agent.hub.settings import HubSettings
from agent.hub.store import make_store
from agent.report.events import Heartbeat, RollbackCoverage
from tests import needs
from tests.hub.conftest import READER, bearer
from tests.hub.factories import batch_json, event
from tests.hub.fleet_seed import NOW, seed

RULES_DIR = Path(__file__).resolve().parents[2] / "packaging" / "prometheus"


@pytest.fixture
def scraped(settings: HubSettings, tokens: Dict[str, str]) -> Iterator[TestClient]:
    seed(settings.database_url)
    with TestClient(create_app(settings, make_store(settings.database_url), clock=lambda: NOW)) as client:
        yield client


def metrics_text(client: TestClient, token: str) -> str:
    answer = client.get("/metrics", headers=bearer(token))
    assert answer.status_code == 200 and answer.headers["content-type"].startswith("text/plain")
    return answer.text


def sample(text: str, series: str) -> float:
    found = re.search(rf"^{re.escape(series)} (\S+)$", text, re.M)
    assert found, series
    return float(found.group(1))


def test_metrics_want_a_reader_token(scraped: TestClient, tokens: Dict[str, str]) -> None:
    """Like the fleet API: 401 without a token, 403 with a host token."""
    assert scraped.get("/metrics").status_code == 401
    assert scraped.get("/metrics", headers=bearer(tokens["host-a"])).status_code == 403


def test_metrics_count_hosts_and_events(scraped: TestClient, tokens: Dict[str, str]) -> None:
    """Compliance, health, staleness, pairings and the last hour's events as seeded."""
    text = metrics_text(scraped, tokens[READER])
    assert sample(text, "gpuguard_hub_store_up") == 1
    assert sample(text, 'gpuguard_hub_hosts{compliance="compliant"}') == 5
    assert sample(text, 'gpuguard_hub_hosts{compliance="violating"}') == 1
    assert sample(text, 'gpuguard_hub_hosts{compliance="unknown"}') == 2
    assert sample(text, 'gpuguard_hub_hosts_by_health{status="cpu_fallback"}') == 1
    assert sample(text, "gpuguard_hub_hosts_stale") == 1
    assert sample(text, "gpuguard_hub_hosts_without_pairing") == 1
    assert sample(text, 'gpuguard_hub_hosts_by_pairing{amdgpu="6.10.5",cuda="",kernel="5.15.0-119-generic",'
                        'nvidia="",os="ubuntu",os_version="22.04",rocm="6.3.1"}') == 1
    assert sample(text, 'gpuguard_hub_events_last_hour{kind="cpu_fallback",severity="critical"}') == 2
    assert 'kind="policy_violation"' not in text  # 90 minutes ago: outside the window


def test_rollback_coverage_of_each_hosts_newest_heartbeat(scraped: TestClient, tokens: Dict[str, str]) -> None:
    """Hosts by the rollback coverage their newest heartbeat carried, and the guarded packages no host can restore;
    hosts whose heartbeats carry none are unknown."""
    coverages = {"host-a": RollbackCoverage(guarded=33, restorable=33, by_source={"rebuilt": 32, "archive cache": 1}),
                 "host-b": RollbackCoverage(guarded=33, restorable=31, by_source={"rebuilt": 31},
                                            not_restorable=["cuda-cudart-13-0", "cuda-nvrtc-13-0"]),
                 "host-c": RollbackCoverage(guarded=12, restorable=12, by_source={"rebuilt": 12},
                                            inexact=["libnvidia-compute-580"])}
    for host_id, coverage in coverages.items():
        beat = event(host_id, at=NOW).model_copy(update={"payload": Heartbeat(
            agent_version="0.1.0", uptime_seconds=1.0, rollback_coverage=coverage)})
        assert scraped.post("/v1/events", content=batch_json([beat]),
                            headers=bearer(tokens[host_id])).status_code == 200
    text = metrics_text(scraped, tokens[READER])
    for state, hosts in (("complete", 1), ("incomplete", 1), ("inexact", 1)):
        assert sample(text, f'gpuguard_hub_hosts_by_rollback_coverage{{coverage="{state}"}}') == hosts
    assert sample(text, 'gpuguard_hub_hosts_by_rollback_coverage{coverage="unknown"}') >= 1  # the seeded fleet
    assert sample(text, "gpuguard_hub_guarded_packages_not_restorable") == 2


def test_ingest_latency_is_observed(scraped: TestClient, tokens: Dict[str, str]) -> None:
    """Each POST /v1/events lands in the histogram under its status class."""
    for _ in range(3):
        assert scraped.post("/v1/events", content=batch_json([event("host-a")]),
                            headers=bearer(tokens["host-a"])).status_code == 200
    assert scraped.post("/v1/events", content=b"{", headers=bearer(tokens["host-a"])).status_code == 400
    text = metrics_text(scraped, tokens[READER])
    assert sample(text, 'gpuguard_hub_ingest_seconds_count{code="2xx"}') == 3
    assert sample(text, 'gpuguard_hub_ingest_seconds_count{code="4xx"}') == 1
    assert sample(text, 'gpuguard_hub_ingest_seconds_bucket{code="2xx",le="+Inf"}') == 3


def test_every_metric_in_the_rules_is_exported(scraped: TestClient, tokens: Dict[str, str]) -> None:
    """The example rules name only families /metrics really has."""
    text = metrics_text(scraped, tokens[READER])
    exported = set(re.findall(r"^# TYPE (\S+) ", text, re.M))
    exported |= {f"{name}_bucket" for name in exported}
    used = set(re.findall(r"\bgpuguard_hub_[a-z_]+", (RULES_DIR / "gpuguard-rules.yml").read_text()))
    assert used and used <= exported, used - exported


def _promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        needs.unavailable("promtool checks", "promtool missing: apt-get install prometheus")
    return found


def test_promtool_accepts_and_unit_tests_the_rules() -> None:
    """`promtool check rules` finds every rule valid; `promtool test rules` sees them fire on hub series."""
    promtool = _promtool()
    checked = subprocess.run([promtool, "check", "rules", "gpuguard-rules.yml"], cwd=RULES_DIR,
                             capture_output=True, text=True, timeout=60)
    assert checked.returncode == 0 and "SUCCESS: 9 rules found" in checked.stdout, checked.stdout + checked.stderr
    tested = subprocess.run([promtool, "test", "rules", "gpuguard-rules.test.yml"], cwd=RULES_DIR,
                            capture_output=True, text=True, timeout=60)
    assert tested.returncode == 0, tested.stdout + tested.stderr


def test_promtool_finds_nothing_to_lint_in_the_exposition(scraped: TestClient, tokens: Dict[str, str]) -> None:
    """`promtool check metrics` on a real scrape: the text parses and follows the naming conventions."""
    promtool = _promtool()
    text = metrics_text(scraped, tokens[READER])
    linted = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=60)
    assert linted.returncode == 0, linted.stdout + linted.stderr
