"""What the resident ``gpuguard run`` loads: scheduling, outbox, delivery; not what its job children use (#17, #28).

The config's validation, the snapshot, the guard's check and forwarding, and the health check run in job children
(agent/daemon_jobs/children.py); the resident only shows what they hand back. Checked in a fresh interpreter, the way
the installed command runs (OpenSSL and asyncio kept out first, as ``gpuguard run`` does): the daemon's settings come
from a config child, it is started against a fixture root, runs its first snapshot child (and, started again, reads
the stored snapshot and health result back through a child), heartbeats, delivery (through delivery children, to an
endpoint that is down), forwards a guard-events line (through a child), reloads its config (SIGHUP's path, through a
config child that compiles the policy), logs at info, and is stopped.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

from tests.conftest import REPO, ROOTS
from tests.daemon.conftest import agent_config

FIXTURE_ROOT = ROOTS / "gpuless-debian12"

# Modules (or packages: a name covers its submodules) the resident must not import: pydantic and every model built
# on it (the settings, the report events, the pairing, the health and policy models), the snapshot's records, reader
# and taker, the health runner, the policy engine and its loader, the guard's tooling, the status command's models,
# the collectors, the sender with requests (delivery's drain), asyncio's event loop (agent/daemon_jobs/
# lazy_asyncio.py), and apscheduler with what only it brought in (agent/daemon_jobs/scheduler.py: multiprocessing
# for its process pool, importlib.metadata with email and zipfile for its plugin entry points, tzlocal and zoneinfo;
# 5.7 MiB, issue #28), and tempfile with shutil, bz2 and lzma (agent/files.py makes its files and directory itself:
# 0.7 MiB), and socket.py with selectors (sd_notify sends through _socket: 0.3 MiB), and pathlib with urllib.parse and
# ipaddress (the resident's paths are strings, Host.file: 0.5 MiB, issue #45).
NOT_FOR_THE_RESIDENT = (
    "pydantic", "pydantic_core", "annotated_types", "agent.models", "agent.config", "agent.configfile",
    "agent.report.events", "agent.report.settings", "agent.report.credentials", "agent.snapshot.pairing",
    "agent.collectors",
    "agent.snapshot.io", "agent.snapshot.model", "agent.snapshot.take", "agent.snapshot.render",
    "agent.health.runner", "agent.health.model", "agent.health.probe", "agent.health.baseline", "agent.health.last",
    "agent.report.compliance", "agent.policy.load", "agent.policy.evaluate", "agent.policy.model",
    "agent.guard.rollback", "agent.guard.apt", "agent.guard.dnf", "agent.status.facts",
    "agent.daemon_jobs.child_main", "agent.daemon_jobs.snapshot",
    "agent.report.sender", "requests", "urllib3", "charset_normalizer", "idna", "certifi",
    "asyncio.base_events", "asyncio.events",
    "apscheduler", "multiprocessing", "concurrent.futures.process", "importlib.metadata", "email", "zipfile", "tzlocal",
    "zoneinfo", "tempfile", "shutil", "bz2", "lzma", "socket", "selectors", "pathlib", "urllib", "ipaddress",
)

POLICY = '[policy]\nname = "resident"\n[kernel]\nallow = ["6.1.0-26-amd64"]\n'
BLOCKED = {"occurred_at": "2026-03-01T12:00:00+00:00", "kind": "transaction_blocked", "tool": "apt",
           "rule": "kernel.allow", "message": "linux-image-6.2 is not allowed", "packages": {"linux-image-6.2": "1"}}

_PROBE = """
import sys
sys.path[:0] = [sys.argv[1], sys.argv.pop(2)]  # as the launcher's -I -S with its own paths
preloaded = sorted(sys.modules)  # what the interpreter's start loaded, not gpuguard
import json, os, threading, time
sys.modules["rich"] = None  # a test dependency only: the .deb has none
from agent.daemon_jobs.openssl import keep_openssl_out
from agent.daemon_jobs.lazy_asyncio import defer_asyncio
keep_openssl_out()  # as gpuguard run does
defer_asyncio()
from agent.daemon import Daemon
from agent.daemon_jobs.children import load_config_in_child
from agent.daemon_jobs.protocol import ConfigRequest
from agent.host import Host
from agent.log import configure, get_logger

config, root, snapshot_file, events_file = sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5]
import sqlite3


def blocked():
    with sqlite3.connect(os.path.join(os.path.dirname(snapshot_file), "outbox.sqlite3")) as db:
        return db.execute("SELECT COUNT(*) FROM events WHERE kind = 'transaction_blocked'").fetchone()[0]


configure(level="info")
get_logger("probe").info("probe_started")  # structlog loaded, as in a daemon that logs
started_ns = time.time_ns()
settings = load_config_in_child(config, root, ConfigRequest(daemon_pid=os.getpid()), None, threading.Event())
daemon = Daemon(config, settings.in_force(), Host.for_root(root))
daemon.start()
state = daemon.runtime.state
deadline = time.monotonic() + 60
while time.monotonic() < deadline:
    if os.path.exists(snapshot_file) and os.stat(snapshot_file).st_mtime_ns >= started_ns and \\
            state.snapshot_facts is not None and state.pairing is not None:
        break
    time.sleep(0.05)
else:
    daemon.stop()
    sys.exit("no snapshot run finished within 60 s")
restored = {"health": state.last_health_status}
while time.monotonic() < deadline and not state.delivery_failures:  # a delivery child found the endpoint down
    time.sleep(0.05)
with open(events_file, "a") as handle:  # what the apt hook appends when it blocks a transaction
    handle.write(sys.argv[6] + "\\n")
daemon.runners["guard"].request("guard_events_written")
while time.monotonic() < deadline and not blocked():
    time.sleep(0.05)
reloaded = daemon.reload()
time.sleep(0.5)  # heartbeats and delivery runs after the snapshot
shown = {"content_hash": state.snapshot_facts.content_hash, "kernel": state.pairing.kernel_running}
result = {"shown": shown, "restored": restored, "failures": dict(state.delivery_failures), "reloaded": reloaded,
          "blocked": blocked()}
daemon.stop()
print(json.dumps({**result, "modules": sorted(sys.modules), "preloaded": preloaded}))
"""


def _resident_modules(tmp_path: Path) -> dict:
    out = run_as_installed(_PROBE, str(tmp_path / "agent.toml"), str(tmp_path / "root"),
                           str(tmp_path / "state" / "last-snapshot.json"), str(_guard_events(tmp_path)),
                           json.dumps(BLOCKED), timeout_seconds=120)
    return json.loads(out.strip().splitlines()[-1])


def run_as_installed(code: str, *args: str, timeout_seconds: float = 120) -> str:
    """Run ``code`` as the installed launcher runs the agent: ``python -I -S`` (no site, so no venv .pth file loads
    pathlib first), the checkout and this environment's packages put on ``sys.path`` by the code itself."""
    result = subprocess.run([sys.executable, "-I", "-S", "-c", code, str(REPO), sysconfig.get_paths()["purelib"],
                             *args], capture_output=True, text=True, timeout=timeout_seconds, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def _guard_events(tmp_path: Path) -> Path:
    return tmp_path / "root" / str(tmp_path / "state").lstrip("/") / "guard-events.jsonl"


def _offenders(seen: dict) -> list:
    """The modules the probe's process loaded (after the interpreter's own start) that the resident must not."""
    loaded = set(seen["modules"]) - set(seen["preloaded"])
    return sorted(m for m in loaded if any(m == bad or m.startswith(bad + ".") for bad in NOT_FOR_THE_RESIDENT))


def test_the_resident_loads_no_pydantic_snapshot_health_policy_or_status_code(tmp_path: Path) -> None:
    """Neither at the first start nor at a start with a stored snapshot and health result, which a child reads back
    for it; nor while it forwards a guard event and reloads its config."""
    shutil.copytree(FIXTURE_ROOT, tmp_path / "root", symlinks=True)
    (tmp_path / "root/etc/gpuguard/policy.d").mkdir(parents=True, exist_ok=True)
    (tmp_path / "root/etc/gpuguard/policy.d/10-site.toml").write_text(POLICY)
    _guard_events(tmp_path).parent.mkdir(parents=True)
    token = tmp_path / "token"
    token.write_text("resident-imports-token-0123\n")
    token.chmod(0o600)
    (tmp_path / "agent.toml").write_text(agent_config(tmp_path / "state", "http://127.0.0.1:9", token,
                                                      log_level="warning"))
    first = _resident_modules(tmp_path)
    assert first["shown"]["kernel"] == "6.1.0-26-amd64"
    assert "agent.daemon_jobs.children" in first["modules"] and "agent.daemon_jobs.scheduler" in first["modules"]
    assert "structlog" in first["modules"]
    assert _offenders(first) == []
    assert set(first["failures"]) == {"unreachable"}  # the delivery child ran, found the endpoint down, said so
    assert first["blocked"] == 1 and first["reloaded"] is True  # the forwarding and config children ran
    compiled = tmp_path / "root" / str(tmp_path / "state").lstrip("/") / "policy.compiled.json"
    assert json.loads(compiled.read_text())["name"] == "resident"  # compiled by the reload's config child
    health = tmp_path / "state" / "health" / "last.json"
    health.parent.mkdir(exist_ok=True)
    health.write_text(json.dumps({"status": "pass", "summary": "ok", "started_at": "2026-06-01T12:00:00+00:00",
                                  "wall_seconds": 42.0}))
    again = _resident_modules(tmp_path)
    assert again["shown"] == first["shown"] and again["restored"] == {"health": "pass"}
    assert _offenders(again) == []


_REAL_RUN = """
import sys
sys.path[:0] = [sys.argv[1], sys.argv.pop(2)]  # as the launcher's -I -S with its own paths
preloaded = sorted(sys.modules)  # what the interpreter's start loaded, not gpuguard
def rss_kib():
    with open("/proc/self/status") as status:
        return int(next(line for line in status if line.startswith("VmRSS:")).split()[1])
bare_rss_kib = rss_kib()  # the interpreter before anything of the probe's or gpuguard's is imported
import _socket, json, os, signal, threading, time
sys.modules["rich"] = None  # a test dependency only: the .deb has none
config, root, out = sys.argv[2], sys.argv[3], sys.argv[4]
systemd = _socket.socket(_socket.AF_UNIX, _socket.SOCK_DGRAM)  # as systemd's notify socket (Type=notify)
systemd.bind(sys.argv[5])
systemd.settimeout(0.0)
os.environ["NOTIFY_SOCKET"] = sys.argv[5]


def notified():
    got = []
    while True:
        try:
            got.append(systemd.recv(4096).decode())
        except OSError:
            return got


def look():
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        names = {thread.name for thread in threading.enumerate()}
        if {"job-heartbeat", "job-snapshot", "job-deliver"} <= names:
            break
        time.sleep(0.05)
    time.sleep(2.0)  # the first snapshot child, heartbeats, deliveries and package watches run
    with open(out, "w") as handle:
        json.dump({"modules": sorted(sys.modules), "preloaded": preloaded,
                   "threads": sorted(t.name for t in threading.enumerate()), "notified": notified(),
                   "bare_rss_kib": bare_rss_kib, "rss_kib": rss_kib()}, handle)
    os.kill(os.getpid(), signal.SIGTERM)


threading.Thread(target=look, daemon=True).start()
from agent.cli import main
sys.exit(main(["run", "--config", config, "--root", root]))
"""


# Without NFD on the host (no features directory, the usual case) the resident reads no compiled policy: its reader
# with the rule families' registry (agent/daemon_jobs/nfd.py: 0.45 MiB, issue #45).
NOT_WITHOUT_NFD = ("agent.policy", "agent.records", "agent.status.reboot")


def _real_run(tmp_path: Path) -> dict:
    shutil.copytree(FIXTURE_ROOT, tmp_path / "root", symlinks=True)
    (tmp_path / "agent.toml").write_text(agent_config(tmp_path / "state", log_level="info",
                                                      nfd_features_file=str(tmp_path / "no-nfd" / "gpuguard")))
    run_as_installed(_REAL_RUN, str(tmp_path / "agent.toml"), str(tmp_path / "root"), str(tmp_path / "seen.json"),
                     str(tmp_path / "notify"), timeout_seconds=120)
    return json.loads((tmp_path / "seen.json").read_text())


def test_a_real_gpuguard_run_loads_none_of_them_after_start(tmp_path: Path) -> None:
    """``gpuguard run`` as the command starts it (cli.main in a fresh isolated interpreter, under a notify socket),
    looked at from inside two seconds after its jobs started: none of the modules above, each job on its own
    thread, READY=1 sent, and it stops with exit 0 on SIGTERM."""
    seen = _real_run(tmp_path)
    assert "structlog" in seen["modules"] and "agent.daemon_jobs.scheduler" in seen["modules"]
    assert _offenders(seen) == []
    assert sorted(m for m in seen["modules"] if any(m == bad or m.startswith(bad + ".") for bad in NOT_WITHOUT_NFD)) \
        == []
    assert {"job-heartbeat", "job-snapshot", "job-deliver", "job-guard", "job-package_watch"} <= set(seen["threads"])
    assert seen["notified"][0].startswith("READY=1\nSTATUS=running")  # sd_notify through _socket


# What a real gpuguard run may hold over the bare interpreter it started in (VmRSS), its jobs running. Measured on the
# development container (Python 3.11, rich hidden): 14.7 MiB with apscheduler, tempfile and socket.py (1f18c29),
# 9.9 MiB without them (issue #28; docs/reporting.md, "A resident without apscheduler"), both over an interpreter
# started with site (-I: a venv's .pth files had loaded pathlib). Since issue #45 the probe starts as the launcher
# does (-I -S), so the bare interpreter is 8.4 MiB and holds none of it: 12.8 to 13.6 MiB over it before pathlib
# left the resident (f813b8b), 12.2 to 12.4 after.
RESIDENT_OVER_BARE_INTERPRETER_MIB = 13.0


def test_a_real_gpuguard_run_holds_at_most_13_mib_over_the_bare_interpreter(tmp_path: Path) -> None:
    """The resident's own memory, two seconds after its jobs started, stays within the budget issue #28 reached:
    apscheduler's imports alone (5.7 MiB) would break it."""
    seen = _real_run(tmp_path)
    over_mib = (seen["rss_kib"] - seen["bare_rss_kib"]) / 1024
    assert over_mib <= RESIDENT_OVER_BARE_INTERPRETER_MIB, f"{over_mib:.1f} MiB over the bare interpreter"
