"""``gpuguard status`` over fixture state directories: real files (good, damaged, missing), a /proc tree, a real
local HTTP server for the hub; damage is a one-line reason, never a traceback; exit 0 / 30 / 31."""

from __future__ import annotations

import datetime as dt
import http.server
import io
import json
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any, Dict, Iterator, Optional

import pytest

from agent import cli
from agent.host import Host
from agent.status.facts import clock_offset_seconds, is_daemon_cmdline, last_json_line, parse_textfile

NOW = dt.datetime(2026, 6, 1, 12, 0, tzinfo=dt.timezone.utc)


class StateDir:
    """A host root with a state directory the way the daemon leaves it, and an agent.toml pointing at it."""

    def __init__(self, tmp: Path) -> None:
        self.root = tmp / "root"
        self.state = self.root / "var/lib/gpuguard"
        (self.state / "health").mkdir(parents=True)
        (self.state / "metrics").mkdir()
        (self.root / "proc").mkdir()
        self.config = tmp / "agent.toml"
        self.write_config()

    def write_config(self, endpoint: Optional[str] = None) -> None:
        lines = ["[agent]", f'state_dir = "{self.state}"', "[report]"]
        if endpoint:
            lines.append(f'endpoint_url = "{endpoint}"')
        self.config.write_text("\n".join(lines) + "\n")

    def guard_events(self) -> Path:
        path = self.root / str(self.state).lstrip("/") / "guard-events.jsonl"  # under the Host root, as the daemon
        path.parent.mkdir(parents=True, exist_ok=True)
        return path

    def healthy(self) -> "StateDir":
        (self.root / "proc/4242").mkdir()
        (self.root / "proc/4242/cmdline").write_bytes(b"/usr/bin/python3\0/usr/bin/gpuguard\0run\0")
        (self.root / "proc/77").mkdir()
        (self.root / "proc/77/cmdline").write_bytes(b"sshd\0")
        (self.state / "last-snapshot.json").write_text(json.dumps({
            "taken_at": (NOW - dt.timedelta(minutes=3)).isoformat(), "content_hash": "c" * 64,
            "findings": [{"severity": "warning"}]}))
        (self.state / "health/last.json").write_text(json.dumps({
            "status": "pass", "summary": "8 GPUs ok", "started_at": (NOW - dt.timedelta(hours=1)).isoformat(),
            "wall_seconds": 42.0}))
        (self.state / "metrics/gpuguard.prom").write_text(
            "# HELP gpuguard_compliant x\n# TYPE gpuguard_compliant gauge\ngpuguard_compliant 1\n"
            'gpuguard_outbox_dropped_total{kind="heartbeat"} 0\n')
        self.guard_events().write_text(json.dumps({"occurred_at": (NOW - dt.timedelta(days=1)).isoformat(),
                                                   "kind": "transaction_blocked", "rule": "rocm-pin"}) + "\n")
        with sqlite3.connect(self.state / "outbox.sqlite3") as conn:
            conn.execute("CREATE TABLE events (sequence INTEGER PRIMARY KEY, event_id TEXT, kind TEXT, "
                         "drop_class INTEGER, enqueued_at REAL, body TEXT)")
            conn.execute("CREATE TABLE dropped (kind TEXT PRIMARY KEY, count INTEGER NOT NULL)")
            conn.execute("INSERT INTO events VALUES (1, 'e1', 'heartbeat', 0, ?, '{}')",
                         ((NOW - dt.timedelta(seconds=20)).timestamp(),))
        return self


@pytest.fixture
def state(tmp_path: Path) -> StateDir:
    return StateDir(tmp_path)


def run_status(state: StateDir, *args: str) -> "tuple[int, str]":
    out = io.StringIO()
    host_of = lambda root: Host(root=Path(root), clock=lambda: NOW)  # noqa: E731 - a fixed clock over the root
    code = cli.main(["status", "--config", str(state.config), "--root", str(state.root), *args], host_of, out)
    return code, out.getvalue()


def test_status_shows_versions_newer_than_gpuguards_table_as_info(state: StateDir) -> None:
    """A snapshot whose drift analysis found dcgm-exporter 4.11.0 (newer than the table) shows it in the snapshot
    line, naming the table's date, and status stays ok."""
    from agent.frozen import replace
    from agent.snapshot.drift import analyze
    from agent.snapshot.model import PackageInfo, PackageSet, Section, Status
    from agent.snapshot.take import take_snapshot
    from tests.conftest import make_fixture_host

    packages = PackageSet(manager="dpkg", installed_count=2, packages={
        "datacenter-gpu-manager-4-core": PackageInfo(version="1:4.8.0-1", arch="amd64"),
        "dcgm-exporter": PackageInfo(version="4.11.0-1", arch="amd64")})
    snap = replace(take_snapshot(make_fixture_host("gpuless-debian12")), dpkg=Section(status=Status.OK,
                                                                                       data=packages))
    findings = [{"kind": f.kind, "severity": f.severity, "message": f.message} for f in analyze(snap)]
    state.healthy()
    (state.state / "last-snapshot.json").write_text(json.dumps({
        "taken_at": (NOW - dt.timedelta(minutes=3)).isoformat(), "content_hash": "c" * 64, "findings": findings}))
    code, text = run_status(state, "--offline")
    assert code == 0, text
    assert "dcgm-exporter 4.11.0-1 is unknown to gpuguard's dcgm-exporter table dated 2026-12-06" in text


def test_status_shows_a_therock_release_newer_than_gpuguards_tables_as_info(state: StateDir) -> None:
    """A snapshot with a TheRock 10.2 tree (/opt/rocm/core-10.2) shows it unknown to the TheRock release table and to
    AMD's matrix, each with its date, in the snapshot line; status stays ok."""
    from agent.collectors.rocm import RocmInfo, RocmInstall
    from agent.frozen import replace
    from agent.policy.knowledge_files import therock_table_in_use
    from agent.policy.matrix import load_matrix
    from agent.snapshot.drift import analyze
    from agent.snapshot.model import Section, Status
    from agent.snapshot.take import take_snapshot
    from tests.conftest import make_fixture_host

    matrix = load_matrix()
    rocm = RocmInfo(active_path="/opt/rocm/core-10.2", version="10.2.0",
                    installs=[RocmInstall(path="/opt/rocm/core-10.2", version="10.2.0")])
    snap = replace(take_snapshot(make_fixture_host("gpuless-debian12")), rocm=Section(status=Status.OK, data=rocm))
    findings = [{"kind": f.kind, "severity": f.severity, "message": f.message}
                for f in analyze(snap, matrix.to_compiled())]
    state.healthy()
    (state.state / "last-snapshot.json").write_text(json.dumps({
        "taken_at": (NOW - dt.timedelta(minutes=3)).isoformat(), "content_hash": "c" * 64, "findings": findings}))
    code, text = run_status(state, "--offline")
    assert code == 0, text
    flat = " ".join(text.split())
    assert (f"TheRock ROCm 10.2 (/opt/rocm/core-10.2) is unknown to gpuguard's TheRock release table dated "
            f"{therock_table_in_use().dated} (newest row: 10.1)") in flat
    assert f"unknown to gpuguard's AMD compatibility matrix dated {matrix.recorded} (newest row: ROCm 10.0)" in flat


def test_a_healthy_host_prints_a_table_and_exits_0(state: StateDir) -> None:
    """Daemon found in /proc, fresh snapshot and health, compliant, outbox moving, no hub configured: exit 0."""
    code, text = run_status(state.healthy(), "--offline")
    assert code == 0, text
    assert "ok    daemon      running (pid 4242)" in text
    assert "taken 3 min ago, 0 critical / 1 warning findings" in text
    assert "pass 59 min ago: 8 GPUs ok" in text
    assert "1 event(s) waiting, oldest enqueued 20 s ago" in text
    assert text.rstrip().endswith(f"status: ok (exit 0); state {state.state}, config {state.config}")


def test_json_carries_checks_and_facts(state: StateDir) -> None:
    """--json: verdict, exit code, checks and the facts behind them."""
    code, text = run_status(state.healthy(), "--json", "--offline")
    document = json.loads(text)
    assert code == 0 and document["verdict"] == "ok" and document["exit_code"] == 0
    assert document["facts"]["daemon"]["pids"] == [4242]
    assert document["facts"]["outbox"]["depth"] == 1
    assert document["facts"]["metrics"]["compliant"] is True
    assert [c["name"] for c in document["checks"]] == ["daemon", "snapshot", "compliance", "health", "guard",
                                                       "rollback", "policy", "outbox", "hub"]


def test_no_daemon_and_nothing_yet_is_failing_31(state: StateDir) -> None:
    """An empty state directory and no daemon process: exit 31, and every area still says something."""
    code, text = run_status(state, "--offline")
    assert code == 31
    assert "FAIL  daemon" in text and "no snapshot yet" in text and "no health check yet" in text


@pytest.mark.parametrize("name, content, check, reason", [
    ("last-snapshot.json", b'{"taken_at": ', "snapshot", "not valid JSON"),
    ("last-snapshot.json", b"\xff\xfe garbage", "snapshot", "UTF-8"),
    ("last-snapshot.json", b'["a list"]', "snapshot", "not a gpuguard snapshot"),
    ("health/last.json", b'{"status": "pass"}', "health", "not a health result"),
    ("outbox.sqlite3", b"this is not a database" * 100, "outbox", "unreadable outbox"),
])
def test_a_damaged_file_is_a_one_line_reason(state: StateDir, capsys: pytest.CaptureFixture, name: str,
                                             content: bytes, check: str, reason: str) -> None:
    """Each damaged state file fails its own check with the file and the reason; the others are still judged."""
    state.healthy()
    (state.state / name).write_bytes(content)
    code, text = run_status(state, "--offline")
    [line] = [line for line in text.splitlines() if line.split()[1:2] == [check]]
    assert code == 31 and line.startswith("FAIL") and reason in line and name.split("/")[-1] in line
    assert "ok    daemon" in text
    assert "Traceback" not in text + capsys.readouterr().err


def test_a_broken_guard_log_and_a_stale_outbox_need_attention(state: StateDir) -> None:
    """A guard log whose tail holds no JSON, and an event undelivered for an hour: exit 30."""
    state.healthy()
    state.guard_events().write_bytes(b"\x00" * 100 + b"\nnot json\n")
    with sqlite3.connect(state.state / "outbox.sqlite3") as conn:
        conn.execute("UPDATE events SET enqueued_at = ?", ((NOW - dt.timedelta(hours=1)).timestamp(),))
    code, text = run_status(state, "--offline")
    assert code == 30, text
    assert "WARN  guard" in text and "no readable event in its tail" in text
    assert "WARN  outbox      1 event(s) waiting, oldest enqueued 60 min ago" in text


def test_a_fifo_in_place_of_a_state_file_is_refused_at_once(state: StateDir) -> None:
    """FIFOs as the guard log, the metrics textfile and the outbox: reasons, not a hang."""
    import os

    state.healthy()
    for path in (state.guard_events(), state.state / "metrics/gpuguard.prom", state.state / "outbox.sqlite3"):
        path.unlink()
        os.mkfifo(path)
    code, text = run_status(state, "--offline")
    assert code == 31 and text.count("not a regular file") == 3, text


def test_a_broken_config_is_exit_3_with_one_line(state: StateDir, capsys: pytest.CaptureFixture) -> None:
    """agent.toml that does not parse: the usual ConfigError line and exit 3."""
    state.config.write_text("[report\n")
    code, _ = run_status(state, "--offline")
    err = capsys.readouterr().err
    assert code == 3 and str(state.config) in err and "Traceback" not in err


class _Handler(http.server.BaseHTTPRequestHandler):
    status = 200

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        self.send_response(self.status if self.path == "/healthz" else 404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


class _AheadHandler(_Handler):
    """A hub whose clock runs an hour ahead of this host's: its answers' Date header says so."""

    def date_time_string(self, timestamp: Optional[float] = None) -> str:
        return super().date_time_string(time.time() + 3600)


@pytest.fixture
def hub_url() -> Iterator[str]:
    yield from _serve(_Handler)


@pytest.fixture
def hub_ahead_url() -> Iterator[str]:
    yield from _serve(_AheadHandler)


def _serve(handler: type) -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_the_hub_is_asked_unless_offline(state: StateDir, hub_url: str) -> None:
    """A reachable hub is ok; --offline skips it; a closed port is attention (30) within the timeout."""
    state.healthy().write_config(hub_url)
    code, text = run_status(state)
    assert code == 0 and f"ok    hub         {hub_url}: HTTP 200 in" in text
    code, text = run_status(state, "--offline")
    assert code == 0 and "not checked (--offline)" in text
    state.write_config("http://127.0.0.1:9")  # discard: nothing listens
    code, text = run_status(state)
    assert code == 30 and "unreachable: ConnectionError" in text


def test_a_clock_off_from_the_hubs_date_is_attention(state: StateDir, hub_url: str, hub_ahead_url: str) -> None:
    """A hub whose Date header is an hour ahead makes the hub row say "clock off by -3600 s from the hub" (exit 30);
    a hub on the same clock does not."""
    state.healthy().write_config(hub_ahead_url)
    code, text = run_status(state)
    assert code == 30 and "clock off by -3600 s from the hub (more than 300 s): check NTP" in text, text
    state.write_config(hub_url)
    code, text = run_status(state)
    assert code == 0 and "clock off" not in text


@pytest.mark.parametrize("header, offset", [
    ("Sun, 06 Dec 2026 10:00:00 GMT", -0.5), ("Sun, 06 Dec 2026 09:00:00 GMT", 3599.5), (None, None), ("", None),
    ("yesterday", None), ("Sun, 06 Dec 2026 10:00:00", None), ("x" * 65, None)])
def test_the_clock_offset_from_a_date_header(header: Optional[str], offset: Optional[float]) -> None:
    """This host's clock less the hub's Date (whole seconds, so half a second is taken off); nothing from a missing,
    unreadable or zone-less header."""
    local = dt.datetime(2026, 12, 6, 10, 0, 0, tzinfo=dt.timezone.utc)
    assert clock_offset_seconds(header, local) == offset


@pytest.mark.parametrize("argv, expected", [
    (["/usr/bin/python3", "/usr/bin/gpuguard", "run"], True),
    (["/opt/gpuguard/venv/bin/python", "-m", "agent", "run", "--config", "x"], True),
    (["gpuguard", "run"], True),
    (["gpuguard", "status"], False),
    (["python3", "-m", "agent", "status"], False),
    (["vim", "run"], False),
    ([], False),
])
def test_daemon_command_lines(argv: list, expected: bool) -> None:
    """Only `gpuguard run` and `python -m agent run` count as the daemon."""
    assert is_daemon_cmdline(argv) is expected


def test_pure_parsers() -> None:
    """The textfile parser drops labels and comments; the tail reader skips a cut first line and junk."""
    values: Dict[str, float] = parse_textfile('# HELP a b\na 1\nb{x="y z"} 2.5\nbroken\n')
    assert values == {"a": 1.0, "b": 2.5}
    assert last_json_line(b'{"cut": \n{"kind": "a"}\n{"kind": "b"}\njunk\n', first_line_cut=True) == {"kind": "b"}
    assert last_json_line(b'"kind": "x"}\n', first_line_cut=True) is None
    assert last_json_line(b'{"only": "one"}') == {"only": "one"}
    assert last_json_line(b"") is None


def test_rollback_coverage_row_in_the_table_and_the_json(state: StateDir) -> None:
    """The coverage the last recording wrote is one row and one fact: a kept file since removed counts as not
    restorable, and the row names it and asks for attention (exit 30)."""
    state.healthy()
    coverage = state.root / str(state.state).lstrip("/") / "rollback-coverage.json"
    debs = state.root / "var/lib/gpuguard/debs"
    debs.mkdir(parents=True)
    packages: Dict[str, Any] = {}
    for i in range(33):
        name = f"cuda-lib-{i:02d}"
        (debs / f"{name}_13.0.96-1_amd64.deb").write_bytes(b"!<arch>\n")
        packages[name] = {"version": "13.0.96-1", "arch": "amd64", "source": "rebuilt" if i else "archive cache",
                          "path": f"/var/lib/gpuguard/debs/{name}_13.0.96-1_amd64.deb"}
    coverage.parent.mkdir(parents=True, exist_ok=True)
    coverage.write_text(json.dumps({"format": 1, "recorded_at": NOW.isoformat(), "packages": packages}))
    code, text = run_status(state, "--offline")
    assert code == 0, text
    assert ("ok    rollback    33/33 guarded packages restorable: 1 from the archive cache, 32 rebuilt from the "
            "installed files") in text
    (debs / "cuda-lib-07_13.0.96-1_amd64.deb").unlink()
    code, text = run_status(state, "--json", "--offline")
    document = json.loads(text)
    assert code == 30 and document["facts"]["rollback"]["restorable"] == 32
    assert document["facts"]["rollback"]["not_restorable"] == ["cuda-lib-07"]
    row = [c for c in document["checks"] if c["name"] == "rollback"][0]
    assert row["state"] == "warn" and "not restorable (no package file kept): cuda-lib-07 (its kept file is gone)" \
        in row["summary"]


def _hold(state: StateDir, phase: str, drained_by_us: bool = True, detail: str = "") -> None:
    path = state.root / str(state.state).lstrip("/") / "maintenance.json"  # under the Host root, as the hand-off
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"scheduler": "slurm", "node": "gpu-a17", "reason": "rollout 7 stage 2",
                                "began_at_seconds": (NOW - dt.timedelta(minutes=12)).timestamp(),
                                "drained_by_us": drained_by_us, "phase": phase, "detail": detail,
                                "drained_at_seconds": None}))


def test_a_maintenance_hold_is_a_row_while_it_lasts(state: StateDir) -> None:
    """No hold: no row. Draining: attention (jobs still run there); held: information; kept after a failed
    post-change check: failing (31), the reason and the check named; a damaged record: one line naming the file."""
    state.healthy()
    code, text = run_status(state, "--offline")
    assert code == 0 and " maintenance " not in text, text
    _hold(state, "draining")
    code, text = run_status(state, "--offline")
    assert code == 30, text
    assert "WARN  maintenance  slurm node gpu-a17 draining (begun 12 min ago): rollout 7 stage 2" in text
    _hold(state, "held", drained_by_us=False)
    code, text = run_status(state, "--json", "--offline")
    document = json.loads(text)
    row = [c for c in document["checks"] if c["name"] == "maintenance"][0]
    assert code == 0 and row["state"] == "info", text
    assert "drained by someone else: gpuguard will not resume it" in row["summary"]
    assert document["facts"]["maintenance"]["node"] == "gpu-a17"
    _hold(state, "kept", detail="post-change check cpu_fallback: torch sees no GPU (rollout 7 stage 2)")
    code, text = run_status(state, "--offline")
    assert code == 31, text
    assert "FAIL  maintenance  slurm node gpu-a17 kept (begun 12 min ago): rollout 7 stage 2; post-change check " \
           "cpu_fallback: torch sees no GPU" in text
    (state.root / str(state.state).lstrip("/") / "maintenance.json").write_text("{\"phase\": 3")
    code, text = run_status(state, "--offline")
    assert code == 31 and "maintenance.json" in text and "Traceback" not in text, text
