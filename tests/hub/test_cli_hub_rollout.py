"""`gpuguard hub rollout start|status|pause|resume|abort` and the agent's own bundle fetch against a real hub process
on 127.0.0.1: the canaries admitted at start, the status printed, each operator action answered, a reader's start
refused in one line, and what the agent's fetch gets at each stage."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest
import requests

from agent.hub.tokens import add_token
from agent.report.events import Heartbeat
from tests.hub.factories import ROCM_62, batch_json, event
from tests.hub.process import HubProcess
from tests.hub.test_cli_hub_policy import admin_file, bundle_file, hub, run  # noqa: F401 - fixtures

pytestmark = pytest.mark.slow  # a real hub process per test: left out of `make test-fast`


def test_start_status_pause_resume_abort(hub: HubProcess, admin_file: Path, tmp_path: Path,  # noqa: F811
                                         capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    """Three hosts heard from, bundles 1 and 2 pushed and 3 staged: start (with a report deadline and 3 as the
    revert) admits one canary, status shows it and the plan, pause/resume/abort each answer with the new state (abort
    releasing the revert), and a reader's start is exit 10 with the hub's 403 line."""
    now = dt.datetime.now(dt.timezone.utc)
    for host in ("gpu-1", "gpu-2", "gpu-3"):
        token = add_token(str(hub.tokens_file), "host", host)  # type: ignore[attr-defined]
        beat = event(host, at=now).model_copy(update={"payload": Heartbeat(
            agent_version="1.0", uptime_seconds=1.0, pairing=ROCM_62, policy_serial=1, last_health_status="pass")})
        answer = requests.post(f"{hub.url}/v1/events", data=batch_json([beat]), timeout=10,
                               headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
        assert answer.status_code == 200, answer.text
    common = ["--hub", hub.url, "--token-file", str(admin_file)]
    for serial in (1, 2):
        assert run(["hub", "policy", "push", str(bundle_file(tmp_path, serial)), *common], capsys)[0] == 0
    assert run(["hub", "policy", "push", str(bundle_file(tmp_path, 3)), "--staged", *common], capsys)[0] == 0
    code, out, err = run(["hub", "rollout", "start", "2", "--batches", "50,100", "--soak-seconds", "0",
                          "--report-deadline-seconds", "3600", "--revert-serial", "3", *common], capsys)
    assert code == 0, err
    assert "state:          running" in out and "waiting for stage 1 (0/1 canaries passed" in out
    assert "report deadline 3600 s" in out and "serial 2 (previous 1, revert 3)" in out
    assert "gpu-1                     0" in out and "gpu-2                     -" in out
    rid = out.split("rollout:", 1)[1].split()[0]
    code, out, _ = run(["hub", "rollout", "status", *common], capsys)
    assert code == 0 and rid in out and "running" in out
    for action, state in (("pause", "paused"), ("resume", "running"), ("abort", "aborted")):
        code, out, err = run(["hub", "rollout", action, rid, *common], capsys)
        assert code == 0 and out.startswith(f"rollout {rid}: {state}"), err
    assert "revert bundle 3 released" in out
    code, out, _ = run(["hub", "rollout", "status", rid, "--json", *common], capsys)
    assert code == 0 and json.loads(out)["rollout"]["state"] == "aborted"
    monkeypatch.setenv("GPUGUARD_HUB_URL", hub.url)
    monkeypatch.setenv("GPUGUARD_HUB_TOKEN", add_token(str(hub.tokens_file), "reader", "ops"))  # type: ignore[attr-defined]
    code, _, err = run(["hub", "rollout", "start", "2"], capsys)
    assert code == 10 and "HTTP 403 forbidden" in err and len(err.splitlines()) == 1


def test_the_agents_fetch_sees_the_stages(hub: HubProcess, admin_file: Path, tmp_path: Path,  # noqa: F811
                                          capsys: pytest.CaptureFixture) -> None:
    """The agent's own fetch (agent.bundle.fetch) against the real hub: the canary is offered the target with the
    "admitted" notice, a held-back host on the previous serial gets 304 (nothing to install) with the "waiting"
    notice, and after abort no host is offered the target."""
    from agent.bundle.fetch import fetch_offer

    now = dt.datetime.now(dt.timezone.utc)
    tokens = {}
    for host in ("gpu-1", "gpu-2"):
        tokens[host] = add_token(str(hub.tokens_file), "host", host)  # type: ignore[attr-defined]
        beat = event(host, at=now).model_copy(update={"payload": Heartbeat(
            agent_version="1.0", uptime_seconds=1.0, pairing=ROCM_62, policy_serial=1, last_health_status="pass")})
        assert requests.post(f"{hub.url}/v1/events", data=batch_json([beat]), timeout=10, headers={
            "Authorization": f"Bearer {tokens[host]}", "Content-Type": "application/json"}).status_code == 200
    common = ["--hub", hub.url, "--token-file", str(admin_file)]
    for serial in (1, 2):
        assert run(["hub", "policy", "push", str(bundle_file(tmp_path, serial)), *common], capsys)[0] == 0
    code, out, err = run(["hub", "rollout", "start", "2", "--batches", "100", "--json", *common], capsys)
    assert code == 0, err
    rid = json.loads(out)["rollout"]["rollout_id"]
    canary = fetch_offer(hub.url, tokens["gpu-1"], None, 1, (5.0, 10.0))
    assert (canary.status, canary.serial, canary.notice) == ("offered", 2, f"rollout {rid}: admitted at stage 0")
    held = fetch_offer(hub.url, tokens["gpu-2"], None, 1, (5.0, 10.0))
    assert (held.status, held.serial) == ("unchanged", 1)
    assert held.notice is not None and held.notice.startswith(f"rollout {rid}: waiting for stage 1 (0/1 canaries")
    notice = requests.get(f"{hub.url}/v1/policy/bundle", timeout=10, headers={
        "Authorization": f"Bearer {tokens['gpu-2']}", "If-None-Match": '"bundle-1"'})
    assert notice.status_code == 304 and notice.headers["X-Gpuguard-Rollout"].startswith(f"rollout {rid}: waiting")
    assert run(["hub", "rollout", "abort", rid, *common], capsys)[0] == 0
    assert fetch_offer(hub.url, tokens["gpu-1"], None, None, (5.0, 10.0)).serial == 1
