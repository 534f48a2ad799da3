"""What the resident ``gpuguard run`` loads: scheduling, outbox, delivery; not what its job children use (#17).

The snapshot, the guard's check and the health check run in job children (agent/daemon_jobs/children.py); the
resident only shows what they hand back. Checked in a fresh interpreter, the way the installed command runs: the
daemon is started against a fixture root, runs its first snapshot child (and, started again, reads the stored
snapshot back through a child), heartbeats and delivery (through delivery children, to an endpoint that is down),
and is stopped.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from tests.conftest import ROOTS, run_fresh_python
from tests.daemon.conftest import agent_config

FIXTURE_ROOT = ROOTS / "gpuless-debian12"

# Modules (or packages: a name covers its submodules) the resident must not import: the snapshot's records, reader
# and taker, the health runner and (without a stored result) the health models, the policy engine, the guard's
# tooling, the status command's models, the collectors, and the sender with requests (delivery's drain).
NOT_FOR_THE_RESIDENT = (
    "agent.collectors",
    "agent.snapshot.io", "agent.snapshot.model", "agent.snapshot.take", "agent.snapshot.render",
    "agent.health.runner", "agent.health.model", "agent.health.probe", "agent.health.baseline",
    "agent.report.compliance", "agent.policy.load", "agent.policy.evaluate", "agent.policy.model",
    "agent.guard.rollback", "agent.guard.apt", "agent.guard.dnf", "agent.status.facts",
    "agent.report.sender", "requests", "urllib3", "charset_normalizer", "idna", "certifi",
)

_PROBE = """
import json, os, sys, time
sys.path.insert(0, sys.argv[1])
from agent.daemon_jobs.openssl import keep_openssl_out
keep_openssl_out()  # as gpuguard run does
from agent.config import load_settings
from agent.daemon import Daemon
from agent.host import Host
from agent.log import configure

config, root, snapshot_file = sys.argv[2], sys.argv[3], sys.argv[4]
configure(level="error")  # job_failed shows why a child did not run
started_ns = time.time_ns()
daemon = Daemon(config, load_settings(config), Host.for_root(root))
daemon.start()
deadline = time.monotonic() + 60
while time.monotonic() < deadline:
    state = daemon.runtime.state
    if os.path.exists(snapshot_file) and os.stat(snapshot_file).st_mtime_ns >= started_ns and \\
            state.snapshot_facts is not None and state.pairing is not None:
        break
    time.sleep(0.05)
else:
    daemon.stop()
    sys.exit("no snapshot run finished within 60 s")
while time.monotonic() < deadline and not state.delivery_failures:  # a delivery child found the endpoint down
    time.sleep(0.05)
time.sleep(0.5)  # heartbeats and delivery runs after the snapshot
shown = {"content_hash": state.snapshot_facts.content_hash, "kernel": state.pairing.kernel_running}
failures = dict(state.delivery_failures)
daemon.stop()
print(json.dumps({"shown": shown, "failures": failures, "modules": sorted(sys.modules)}))
"""


def _resident_modules(tmp_path: Path) -> dict:
    out = run_fresh_python(_PROBE, str(tmp_path / "agent.toml"), str(tmp_path / "root"),
                           str(tmp_path / "state" / "last-snapshot.json"), timeout_seconds=120)
    return json.loads(out.strip().splitlines()[-1])


def _offenders(modules: list) -> list:
    return sorted(m for m in modules if any(m == bad or m.startswith(bad + ".") for bad in NOT_FOR_THE_RESIDENT))


def test_the_resident_loads_no_snapshot_health_policy_or_status_code(tmp_path: Path) -> None:
    """Neither at the first start nor at a start with a stored snapshot, which a child reads back for it."""
    shutil.copytree(FIXTURE_ROOT, tmp_path / "root", symlinks=True)
    token = tmp_path / "token"
    token.write_text("resident-imports-token-0123\n")
    token.chmod(0o600)
    (tmp_path / "agent.toml").write_text(agent_config(tmp_path / "state", "http://127.0.0.1:9", token,
                                                      log_level="warning"))
    first = _resident_modules(tmp_path)
    assert first["shown"]["kernel"] == "6.1.0-26-amd64"
    assert "agent.daemon_jobs.children" in first["modules"] and "apscheduler" in first["modules"]
    assert _offenders(first["modules"]) == []
    assert set(first["failures"]) == {"unreachable"}  # the delivery child ran, found the endpoint down, said so
    again = _resident_modules(tmp_path)
    assert again["shown"] == first["shown"]
    assert _offenders(again["modules"]) == []
