"""`gpuguard hub rollout start|status|pause|resume|abort` against a real hub process on 127.0.0.1: the canaries
admitted at start, the status printed, each operator action answered, a reader's start refused in one line."""

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
    """Three hosts heard from, bundles 1 and 2 pushed: start admits one canary, status shows it, pause/resume/abort
    each answer with the new state, and a reader's start is exit 10 with the hub's 403 line."""
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
    code, out, err = run(["hub", "rollout", "start", "2", "--batches", "50,100", "--soak-seconds", "0", *common],
                         capsys)
    assert code == 0, err
    assert "state:          running" in out and "waiting for stage 1 (0/1 canaries passed" in out
    assert "gpu-1                     0" in out and "gpu-2                     -" in out
    rid = out.split("rollout:", 1)[1].split()[0]
    code, out, _ = run(["hub", "rollout", "status", *common], capsys)
    assert code == 0 and rid in out and "running" in out
    for action, state in (("pause", "paused"), ("resume", "running"), ("abort", "aborted")):
        code, out, err = run(["hub", "rollout", action, rid, *common], capsys)
        assert code == 0 and out.startswith(f"rollout {rid}: {state}"), err
    code, out, _ = run(["hub", "rollout", "status", rid, "--json", *common], capsys)
    assert code == 0 and json.loads(out)["rollout"]["state"] == "aborted"
    monkeypatch.setenv("GPUGUARD_HUB_URL", hub.url)
    monkeypatch.setenv("GPUGUARD_HUB_TOKEN", add_token(str(hub.tokens_file), "reader", "ops"))  # type: ignore[attr-defined]
    code, _, err = run(["hub", "rollout", "start", "2"], capsys)
    assert code == 10 and "HTTP 403 forbidden" in err and len(err.splitlines()) == 1
