"""The daemon's policy fetch caches the hub's verified stacks for the [workloads] rule (issue 44): from a real hub
process over HTTP into the state directory under the host root, only while the compiled policy has the section."""

from __future__ import annotations

from pathlib import Path

import pytest
import requests

from agent.config import Settings
from agent.daemon_jobs.policy_fetch import refresh_verified_stacks
from agent.host import Host
from agent.hostfacts.verified_stacks import read_verified_stacks
from agent.hub.tokens import add_token
from agent.policy.load import load_and_compile, write_compiled
from agent.report.events import WorkloadReport, WorkloadStackReport
from agent.statepaths import StatePaths
from tests.hub.conftest import bearer
from tests.hub.factories import batch_json
from tests.hub.process import HubProcess, write_config
from tests.hub.test_workload_stacks import beat

pytestmark = pytest.mark.slow


def _compile(root: Path, policy: str) -> None:
    root.mkdir(exist_ok=True)
    source = root / "policy.toml"
    source.write_text(policy)
    _, compiled = load_and_compile(str(source))
    write_compiled(str(root / StatePaths().compiled_policy.lstrip("/")), compiled)


def test_the_policy_fetch_caches_the_list_only_under_a_workloads_rule(tmp_path: Path) -> None:
    """Without [workloads] nothing is fetched; with it the hub's list lands in workloads-verified.json, as the
    hook's host fact reads it."""
    tokens_file = tmp_path / "tokens.json"
    config = write_config(tmp_path / "hub.toml", listen_host="127.0.0.1", listen_port=0,
                          database_url=f"sqlite:///{tmp_path}/hub.db", tokens_file=tokens_file,
                          tokens_reload_seconds=0, shutdown_timeout_seconds=5)
    token = add_token(str(tokens_file), "host", "host-a")
    root = tmp_path / "root"
    stack = WorkloadStackReport(driver="amdgpu 6.10.5", gpu_stack="ROCm 6.3.1")
    passed = WorkloadReport(name="resnet-train", status="pass", gates=True, stack_id="a" * 16, stack=stack)
    hub = HubProcess(config).start()
    try:
        sent = requests.post(f"{hub.url}/v1/events", data=batch_json([beat("host-a", 10, passed)]),
                             headers={**bearer(token), "Content-Type": "application/json"}, timeout=10)
        assert sent.status_code == 200, sent.text
        settings = Settings.model_validate({"report": {"endpoint_url": hub.url, "connect_timeout_seconds": 2,
                                                       "read_timeout_seconds": 5}})
        host = Host.for_root(str(root))
        cache = root / StatePaths().workloads_verified.lstrip("/")
        _compile(root, '[policy]\nname = "p"\n[containers]\n')
        refresh_verified_stacks(host, settings, token)
        assert not cache.exists()
        _compile(root, '[policy]\nname = "p"\n[workloads]\nverified = ["resnet-train"]\n')
        refresh_verified_stacks(host, settings, token)
    finally:
        hub.stop()
    cached = read_verified_stacks(str(root), StatePaths().workloads_verified)
    assert cached is not None and cached.problem is None
    [(name, [verified])] = [(n, list(s)) for n, s in cached.workloads]
    assert (name, verified.driver, verified.gpu_stack) == ("resnet-train", "amdgpu 6.10.5", "ROCm 6.3.1")
