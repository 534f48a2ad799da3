"""Heavy jobs in child processes: failures, kills and SIGTERM in a child, events from children delivered once."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterator, List, Sequence

import pytest

from agent.daemon_jobs.children import ChildJobFailed, child_argv, child_env, remove_leftover_results, run_child
from agent.daemon_jobs.job_runner import JobRunner
from agent.daemon_jobs.protocol import ChildContext, DeliverResult, GuardCheckResult, JobRequest
from agent.jsonrecord import JsonObject, JsonRecord
from agent.log import configure
from tests.conftest import REPO, run_fresh_python
from tests.daemon.conftest import (
    AgentProcess,
    agent_config,
    assert_delivered_once_in_order,
    daemon_children,
    wait_until_ended,
)
from tests.report.events import event
from tests.report.receiver import Receiver


def python_child(code: str):
    """An ``argv`` for run_child that runs ``code`` with the result path in ``sys.argv[1]``."""
    def argv(job: str, config_path: str, root: str, request_json: str, result_path: str) -> Sequence[str]:
        return [sys.executable, "-c", code, result_path, request_json]
    return argv


@dataclass(frozen=True)
class Echo(JsonRecord):
    """A test job's result: the request it was given."""

    echo: JsonObject


REQUEST = JobRequest(context=ChildContext(settings={}, host_id="h-1", hostname="node-1"), reason="interval")
WRITES_RESULT = ("import json, sys; open(sys.argv[1], 'w').write(json.dumps("
                 "{'peak_rss_kib': 0, 'result': {'echo': json.loads(sys.argv[2])}}))")


def test_the_logged_peak_rss_is_the_childs_own_not_the_daemons(tmp_path: Path) -> None:
    """A child that touches 64 MiB is logged with at least that; a small one well below the daemon's own peak."""
    stream = io.StringIO()
    configure(level="info", json_output=True, stream=stream)
    ballast = bytearray(b"x" * (200 * 1024 * 1024))  # this process's peak is now above 200 MiB
    reports = ("import json, sys\n{alloc}\n"
               "from agent.daemon_jobs.procstatus import peak_rss_kib\n"
               "reply = {{'peak_rss_kib': peak_rss_kib(), 'result': {{'echo': {{}}}}}}\n"
               "open(sys.argv[1], 'w').write(json.dumps(reply))\n")
    for alloc in ("b = bytearray(b'x' * (64 * 1024 * 1024))", "pass"):
        run_child("snapshot", "/nonexistent.toml", "/", REQUEST, Echo, str(tmp_path), threading.Event(),
                  argv=python_child(reports.format(alloc=alloc)))
    del ballast
    peaks = [json.loads(line)["max_rss_kib"] for line in stream.getvalue().splitlines()]
    assert peaks[0] >= 64 * 1024 and peaks[1] < 100 * 1024, peaks


def test_a_child_result_comes_back_and_its_file_is_removed(tmp_path: Path) -> None:
    """The child's JSON result is returned; the result file does not stay behind."""
    result = run_child("snapshot", "/nonexistent.toml", "/", REQUEST, Echo, str(tmp_path), threading.Event(),
                       argv=python_child(WRITES_RESULT))
    assert result == Echo(echo=REQUEST.to_json())
    assert list(tmp_path.iterdir()) == []


# Waits for the sibling's start (a file per child in sys.argv[3]'s directory), then writes its result as the lean
# child does (O_EXCL: a file already there is an error, exit 1).
WRITES_AFTER_THE_OTHER_STARTED = (
    "import json, os, sys, time\n"
    "here = os.path.dirname(sys.argv[1]); open(os.path.join(here, 'started-' + str(os.getpid())), 'w').close()\n"
    "deadline = time.monotonic() + 20\n"
    "while len([n for n in os.listdir(here) if n.startswith('started-')]) < 2 and time.monotonic() < deadline:\n"
    "    time.sleep(0.01)\n"
    "fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)\n"
    "os.write(fd, json.dumps({'peak_rss_kib': 0, 'result': {'echo': json.loads(sys.argv[2])}}).encode())\n")


def test_two_children_of_one_job_running_at_once_each_get_their_own_result(tmp_path: Path) -> None:
    """The heartbeat's and delivery's lean children overlap: each run gets back the result of its own request
    (with one file per job name, one failed with no result or exited 1 on the other's file)."""
    requests = [dataclasses.replace(REQUEST, reason=reason) for reason in ("heartbeat", "delivery")]
    results: Dict[str, object] = {}

    def one(request: JobRequest) -> None:
        try:
            results[request.reason] = run_child("lean", "/nonexistent.toml", "/", request, Echo, str(tmp_path),
                                                threading.Event(), argv=python_child(WRITES_AFTER_THE_OTHER_STARTED))
        except ChildJobFailed as exc:
            results[request.reason] = exc

    threads = [threading.Thread(target=one, args=(request,)) for request in requests]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert results == {request.reason: Echo(echo=request.to_json()) for request in requests}
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith("started-")) == []


def test_result_files_a_killed_daemon_left_are_removed_at_the_next_start(tmp_path: Path) -> None:
    """Leftover ``.job-*.result.json`` files go; every other file of the state directory stays."""
    for name in (".job-lean.4242.7.result.json", ".job-snapshot.4242.8.result.json", "outbox.sqlite3",
                 "last-snapshot.json", ".job-notes.txt"):
        (tmp_path / name).write_text("{}")
    assert remove_leftover_results(str(tmp_path)) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == [".job-notes.txt", "last-snapshot.json", "outbox.sqlite3"]
    assert remove_leftover_results(str(tmp_path / "absent")) == 0


@pytest.mark.parametrize("code, problem", [
    ("import os, signal; os.kill(os.getpid(), signal.SIGKILL)", "killed by SIGKILL"),
    ("raise SystemExit(3)", "exited 3"),
    ("pass", "no result"),
    ("import sys; open(sys.argv[1], 'w').write('[1]')", "result is not a child's reply"),
    ("import sys; open(sys.argv[1], 'w').write('{\"peak_rss_kib\": 1}')", "result: missing"),
])
def test_a_child_that_crashes_is_killed_or_says_nothing_raises(tmp_path: Path, code: str, problem: str) -> None:
    """Every way a child can fail becomes one ChildJobFailed naming the job."""
    with pytest.raises(ChildJobFailed, match=problem) as caught:
        run_child("guard_check", "/nonexistent.toml", "/", REQUEST, GuardCheckResult, str(tmp_path),
                  threading.Event(), argv=python_child(code))
    assert caught.value.job == "guard_check"


@pytest.mark.parametrize("result, problem", [
    ({"events": 0}, "result -> drained: missing"),
    ({"events": 0, "drained": {"failure": {"url": "https://hub", "category": 5, "reason": "x"}}},
     "result -> drained -> failure -> category: expected a string, got int"),
    ({"events": "3", "drained": {}}, "result -> events: expected an integer, got str"),
    ({"events": 0, "drained": {}, "sent": 4}, "result -> sent: unknown field"),
])
def test_a_malformed_result_is_a_failed_child_naming_the_field(tmp_path: Path, result: dict, problem: str) -> None:
    """A result that is not its job's record (a field missing, of another type, or unknown) fails the child with the
    field's path, never a KeyError or AttributeError in the daemon."""
    code = f"import json, sys; open(sys.argv[1], 'w').write(json.dumps({{'peak_rss_kib': 0, 'result': {result!r}}}))"
    with pytest.raises(ChildJobFailed) as caught:
        run_child("deliver", "/nonexistent.toml", "/", REQUEST, DeliverResult, str(tmp_path), threading.Event(),
                  argv=python_child(code))
    assert caught.value.problem == f"malformed result: {problem}"


def test_a_killed_child_is_logged_and_the_next_run_tries_again(tmp_path: Path) -> None:
    """The job runner logs the failed child once, the next interval runs a new child, which recovers."""
    stream = io.StringIO()
    configure(level="info", json_output=True, stream=stream)
    codes = ["import os, signal; os.kill(os.getpid(), signal.SIGKILL)", WRITES_RESULT]

    def body(reason: str) -> None:
        run_child("snapshot", "/nonexistent.toml", "/", REQUEST, Echo, str(tmp_path), threading.Event(),
                  argv=python_child(codes.pop(0)))

    runner = JobRunner("snapshot", body, threading.Event())
    runner()
    runner()
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    events = [e["event"] for e in lines]
    assert events == ["job_child_exited", "job_failed", "job_child_exited", "job_recovered"]
    assert lines[0]["exit_code"] == -signal.SIGKILL and "max_rss_kib" in lines[0]
    assert "killed by SIGKILL" in lines[1]["error"]


def test_stopping_sends_the_child_sigterm_and_waits_for_it(tmp_path: Path) -> None:
    """When the daemon stops, the child gets SIGTERM, finishes its step and is waited for (never left behind)."""
    marker, ready = tmp_path / "got-sigterm", tmp_path / "handler-set"
    code = ("import json, signal, sys, time\n"
            "def stop(signum, frame):\n"
            f"    open({str(marker)!r}, 'w').write('1'); time.sleep(0.3)\n"
            "    open(sys.argv[1], 'w').write(json.dumps({'peak_rss_kib': 0, 'result': {'echo': {}}})); sys.exit(0)\n"
            "signal.signal(signal.SIGTERM, stop)\n"
            f"open({str(ready)!r}, 'w').close()\n"
            "time.sleep(120)\n")
    stopping = threading.Event()
    # The stop comes once the child's handler is set (a loaded machine may take seconds to start it), not at a time.
    threading.Thread(target=_set_once_exists, args=(ready, stopping), daemon=True).start()
    started = time.monotonic()
    result = run_child("health", "/nonexistent.toml", "/", REQUEST, Echo, str(tmp_path), stopping,
                       argv=python_child(code))
    assert result == Echo(echo={})
    assert marker.exists()
    assert time.monotonic() - started < 60  # waited for its step, not for its 120 s sleep: load-proof


def _set_once_exists(path: Path, event: threading.Event) -> None:
    """Set ``event`` as soon as ``path`` exists (within a deadline that only ends a broken run)."""
    deadline = time.monotonic() + 120
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    event.set()


def test_a_child_stopped_before_it_handles_sigterm_is_an_interruption_not_a_failure(tmp_path: Path) -> None:
    """SIGTERM that ends a child still starting up (default handling) is the shutdown, logged as such."""
    from agent.errors import Interrupted

    stopping = threading.Event()
    threading.Timer(0.3, stopping.set).start()
    with pytest.raises(Interrupted, match="stopped by the daemon's shutdown"):
        run_child("snapshot", "/nonexistent.toml", "/", REQUEST, Echo, str(tmp_path), stopping,
                  argv=python_child("import time; time.sleep(120)"))


def test_a_child_still_running_at_its_timeout_is_killed_and_fails(tmp_path: Path) -> None:
    """A child past ``timeout_seconds`` gets SIGKILL (a SIGTERM handler cannot keep it) and is a failed child."""
    stream = io.StringIO()
    configure(level="info", json_output=True, stream=stream)
    code = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(120)"
    started = time.monotonic()
    with pytest.raises(ChildJobFailed, match=r"no result within 0.5 s: killed"):
        run_child("config", "/nonexistent.toml", "/", REQUEST, Echo, str(tmp_path), threading.Event(),
                  argv=python_child(code), timeout_seconds=0.5)
    assert time.monotonic() - started < 60  # killed at its 0.5 s, not after its 120 s sleep: load-proof
    events = [json.loads(line)["event"] for line in stream.getvalue().splitlines()]
    assert events == ["job_child_timed_out", "job_child_exited"]


def test_a_reload_whose_config_child_hangs_fails_at_the_timeout_and_keeps_the_settings(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A SIGHUP's config child that never ends (here stopped) is killed at the timeout: the reload fails, the old
    settings stay, and the signal loop is free again instead of waiting for ever."""
    import agent.daemon
    from agent.config import Settings
    from agent.daemon_jobs.resident_settings import SettingsInForce
    from agent.daemon_jobs.systemd_notify import SystemdNotifier
    from agent.host import Host

    monkeypatch.setattr(agent.daemon, "CONFIG_RELOAD_TIMEOUT_SECONDS", 2.0)
    stream = io.StringIO()
    configure(level="info", json_output=True, stream=stream)
    config = tmp_path / "agent.toml"
    config.write_text(agent_config(tmp_path / "state"))
    settings = SettingsInForce.of(Settings.model_validate({"agent": {"state_dir": str(tmp_path / "state")}}))
    daemon = agent.daemon.Daemon(str(config), settings, Host(root=Path("/")), SystemdNotifier({}),
                                 job_children=True)
    outcome: List[bool] = []
    reload = threading.Thread(target=lambda: outcome.append(daemon.reload()), daemon=True)
    reload.start()
    stopped: List[int] = []
    deadline = time.monotonic() + 120  # only ends a broken run
    while not stopped and time.monotonic() < deadline:
        for pid in daemon_children(os.getpid()):
            os.kill(pid, signal.SIGSTOP)  # hangs as a child stuck on a dead mount would
            stopped.append(pid)
        time.sleep(0.01)
    assert stopped, "no config child appeared"
    reload.join(30)
    try:
        assert not reload.is_alive(), "the reload still waits for its hung config child"
    finally:
        for pid in stopped:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        reload.join(10)
        daemon.runtime.outbox.close()
    assert outcome == [False]
    failed = [json.loads(line) for line in stream.getvalue().splitlines() if '"config_reload_failed"' in line]
    assert failed and failed[0]["problems"] == ["job child config: no result within 2 s: killed"]
    assert daemon.runtime.in_force is settings


def test_the_child_environment_drops_systemd_variables() -> None:
    """$NOTIFY_SOCKET and the watchdog belong to the daemon (NotifyAccess=main), not to its job children."""
    env = child_env({"NOTIFY_SOCKET": "/run/systemd/notify", "WATCHDOG_USEC": "60000000", "WATCHDOG_PID": "1",
                     "PATH": "/usr/bin"})
    assert env == {"PATH": "/usr/bin"}


def test_the_child_starts_with_the_daemons_import_path_and_flags(tmp_path: Path) -> None:
    """Under ``python3 -IS`` (the .deb's launcher) the child is ``-IS`` too and imports the same agent tree."""
    import subprocess

    probe = ("import sys, agent.daemon_jobs.children as c; "
             "print(' '.join(c.child_argv('snapshot', 'C', '/', '{}', 'R')[1:3]))")
    repo = str(Path(__file__).resolve().parents[2])
    paths = [repo, *(p for p in sys.path if p.endswith("site-packages"))]  # as the launcher's vendor directory
    isolated = subprocess.run([sys.executable, "-I", "-S", "-c", f"import sys; sys.path[:0] = {paths!r}; " + probe],
                              capture_output=True, text=True, check=True, cwd=str(tmp_path))
    assert isolated.stdout.split() == ["-I", "-S"]
    argv = child_argv("snapshot", "C", "/", "{}", "R")
    assert repo in argv[argv.index("-c") + 1]
    assert argv[argv.index("-c") + 2:argv.index("-c") + 4] == ["_job", "snapshot"]


def snapshot_children(pid: int) -> List[int]:
    """The daemon's snapshot children now (delivery children come and go beside them)."""
    found = []
    for child in daemon_children(pid):
        try:
            argv = Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"_job" in argv and argv[argv.index(b"_job") + 1:argv.index(b"_job") + 2] == [b"snapshot"]:
            found.append(child)
    return found


@contextlib.contextmanager
def snapshot_inputs_changing(root: Path) -> Iterator[None]:
    """Keep changing one input the snapshot's stamp covers and no collector reports (the container directory's
    mtime), so that every interval snapshot starts a child (agent/daemon_jobs/snapshot_stamp.py)."""
    directory = root / "var/lib/docker/containers"
    directory.mkdir(parents=True, exist_ok=True)
    stop = threading.Event()

    def churn() -> None:
        while not stop.wait(0.05):
            (directory / "churn").touch()
            (directory / "churn").unlink()

    thread = threading.Thread(target=churn, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(5)


@pytest.mark.slow
def test_a_snapshot_child_killed_mid_run_is_retried_and_events_arrive_once(agent: AgentProcess, receiver: Receiver,
                                                                         token_file: Path) -> None:
    """SIGKILL to a running snapshot child: the daemon logs it and lives; later children's events arrive once."""
    agent.write_config(agent_config(agent.state_dir, receiver.url, token_file, log_level="info").replace(
        "interval_seconds = 600", "interval_seconds = 0.5"))
    with snapshot_inputs_changing(agent.root):
        killed_and_recovered(agent, receiver)


def killed_and_recovered(agent: AgentProcess, receiver: Receiver) -> None:
    """The body of the test above, while the snapshot's inputs keep changing."""
    agent.start()
    agent.wait_for_log("job_child_exited", job="snapshot")
    assert agent.proc is not None
    deadline, killed = time.monotonic() + 120, None
    while killed is None and time.monotonic() < deadline:
        for child in snapshot_children(agent.proc.pid):
            try:
                os.kill(child, signal.SIGKILL)
                killed = child
            except ProcessLookupError:
                pass
        time.sleep(0.01)
    assert killed is not None, "no snapshot child seen"
    agent.wait_for_log("job_failed", job="snapshot")
    exits_before = len(agent.events_named("job_child_exited"))
    agent.wait_for_log("job_child_exited", count=exits_before + 2, job="snapshot")
    agent.wait_for_log("job_recovered", job="snapshot")
    agent.send(signal.SIGUSR1)  # guard check, snapshot and delivery now
    assert receiver.wait_for(lambda r: "snapshot_changed" in r.kinds_stored() and len(r.stored) >= 5)
    assert agent.terminate() == 0
    assert_delivered_once_in_order(receiver, agent.outbox())
    stored = list(receiver.stored.values())
    assert {e["host_id"] for e in stored} == {"test-host-1"}
    assert sum(e["payload"]["kind"] == "snapshot_changed" for e in stored) == 1, "the unchanged stack re-reported"
    assert not daemon_children(agent.proc.pid) if agent.proc.poll() is None else True


@pytest.mark.slow
def test_sigterm_while_a_snapshot_child_runs_stops_cleanly(agent: AgentProcess, token_file: Path) -> None:
    """SIGTERM while a child runs: the daemon passes it on, waits for the child, exits 0 and leaves no process."""
    agent.write_config(agent_config(agent.state_dir, None, token_file, log_level="info").replace(
        "interval_seconds = 600", "interval_seconds = 0.2"))
    with snapshot_inputs_changing(agent.root):
        agent.start()
        agent.wait_for_log("job_child_exited", job="snapshot")
        assert agent.proc is not None
        deadline, children = time.monotonic() + 120, []
        while not children and time.monotonic() < deadline:
            children = daemon_children(agent.proc.pid)
            time.sleep(0.005)
    assert children, "no child running to stop"
    assert agent.terminate() == 0
    for child in children:
        assert not Path(f"/proc/{child}").exists() or "zombie" in Path(f"/proc/{child}/status").read_text(), \
            "a job child outlived the daemon"
    names = [e["event"] for e in agent.logs()]
    assert names.index("daemon_stopping") < len(names) - 1 and names[-1] == "daemon_stopped"


@pytest.mark.slow
def test_children_use_the_settings_in_force_after_sighup(agent: AgentProcess, receiver: Receiver,
                                                        token_file: Path) -> None:
    """A snapshot child after a valid reload stamps the new host id; after an invalid one it runs on the old."""
    agent.write_config(agent_config(agent.state_dir, receiver.url, token_file, heartbeat_interval_seconds=600))
    agent.start()
    assert receiver.wait_for(lambda r: r.kinds_stored() == ["snapshot_changed"])
    agent.write_config(agent_config(agent.state_dir, receiver.url, token_file, heartbeat_interval_seconds=600)
                       .replace('host_id = "test-host-1"', 'host_id = "test-host-2"'))
    agent.send(signal.SIGHUP)
    agent.wait_for_log("config_reloaded")
    agent.config.write_text(agent.config.read_text() + 'endpoint_url = "ftp://nowhere"\n')  # invalid: kept old
    agent.send(signal.SIGHUP)
    agent.wait_for_log("config_reload_failed")
    status = agent.root / "var/lib/dpkg/status"
    new = agent.root / "var/lib/dpkg/status-new"
    new.write_text(status.read_text().replace("Version: 1.7.22-1", "Version: 1.7.23-1"))
    os.replace(new, status)
    assert receiver.wait_for(lambda r: r.kinds_stored() == ["snapshot_changed"] * 2, timeout_seconds=15)
    assert agent.terminate() == 0
    second = receiver.stored[receiver.stored_order[1]]
    assert second["host_id"] == "test-host-2"
    names = [e["event"] for e in agent.logs()]
    before_stop = agent.logs()[:names.index("daemon_stopping")]
    assert not [e for e in before_stop if e["event"] == "job_child_exited" and e["exit_code"] != 0]
    assert_delivered_once_in_order(receiver, agent.outbox())


def test_the_snapshot_child_hands_back_what_the_daemon_shows(tmp_path: Path, host_root: Path) -> None:
    """The daemon's facts and pairing come from the child's result, equal to the stored snapshot's; started again, a
    restore child reads the stored snapshot (and the last health result) back for it before any snapshot run."""
    from agent.config import Settings
    from agent.daemon_jobs.children import SnapshotInChild, restore_in_child
    from agent.daemon_jobs.resident_settings import SettingsInForce
    from agent.daemon_jobs.runtime import EventEmitter, Runtime, SnapshotFacts
    from agent.host import Host
    from agent.report.outbox import Outbox
    from agent.report.plain import PlainPairing
    from agent.snapshot.io import load_snapshot
    from agent.snapshot.pairing import pairing_of

    host = Host.for_root(str(host_root))
    settings = Settings.model_validate({"agent": {"state_dir": str(tmp_path / "state"), "host_id": "h-1"}})

    def runtime() -> Runtime:
        outbox = Outbox(str(tmp_path / "state" / "outbox.sqlite3"))
        return Runtime(host=host, in_force=SettingsInForce.of(settings), state_dir=str(tmp_path / "state"),
                       outbox=outbox, emitter=EventEmitter(outbox, "h-1", "node-1", host.clock))

    first = runtime()
    SnapshotInChild(first, "/nonexistent.toml", on_stack_changed=lambda reason: None).run()
    first.outbox.close()
    stored = load_snapshot(str(tmp_path / "state" / "last-snapshot.json"))
    assert first.state.snapshot_facts == SnapshotFacts.of(stored)
    assert first.state.pairing == PlainPairing.from_json(pairing_of(stored).model_dump(mode="json"))
    assert first.state.pairing is not None and first.state.pairing.kernel_running == "6.1.0-26-amd64"
    health = tmp_path / "state" / "health" / "last.json"
    health.parent.mkdir()
    health.write_text(json.dumps({"status": "regression", "summary": "gemm slower",
                                  "started_at": "2026-06-01T12:00:00+00:00", "wall_seconds": 42.0}))
    again = runtime()
    restore_in_child(again, "/nonexistent.toml")
    again.outbox.close()
    assert again.state.snapshot_facts == first.state.snapshot_facts
    assert again.state.pairing == first.state.pairing
    assert (again.state.last_health_status, again.state.last_health_at_seconds) == ("regression", 1780315200.0)


def test_a_child_started_after_the_daemon_died_stops_at_once() -> None:
    """A child whose parent is not the daemon that asked for it (orphaned before it could ask the kernel for
    SIGTERM on the daemon's death) stops before its job; one whose parent is the daemon carries on."""
    code = """
import os, sys, threading
from agent.daemon_jobs.child_main import _stop_with_the_daemon
seen = {}
for name, pid in (("daemon", os.getppid()), ("another", os.getppid() + 1), ("by_hand", None)):
    stopping = threading.Event()
    _stop_with_the_daemon(pid, stopping)
    seen[name] = stopping.is_set()
print(seen)
"""
    assert run_fresh_python(code).strip().splitlines()[-1] == "{'daemon': False, 'another': True, 'by_hand': False}"


_STOPS_ON_SIGTERM = """
import os, sys, threading
sys.path.insert(0, sys.argv[1])
from agent.daemon_jobs.child_main import _stop_on_sigterm
stopping = threading.Event()
_stop_on_sigterm(stopping)
print("ready", flush=True)
while not stopping.wait(0):  # holds the Event's lock again and again, as a job's waits do
    pass
print("stopped", flush=True)
os._exit(0)  # not the interpreter's exit, which gives SIGTERM its default back while the burst may still arrive
"""


_SIGTERM_WHILE_WAITING = """
import os, signal, sys, threading, time
sys.path.insert(0, sys.argv[1])
from agent.daemon_jobs.child_main import _stop_on_sigterm
stopping = threading.Event()
_stop_on_sigterm(stopping)
with stopping._cond:  # this thread inside stopping.wait() or set(), holding the Event's lock
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(0.2)  # the Python-level handler runs here
print(stopping.wait(120), flush=True)
"""


def test_sigterm_while_the_child_holds_the_stopping_lock_still_stops_it() -> None:
    """SIGTERM arriving while the child's own thread holds ``stopping``'s lock sets it once the lock is free; the
    handler that called ``stopping.set()`` itself waited for that lock in the same thread for ever."""
    assert run_fresh_python(_SIGTERM_WHILE_WAITING, timeout_seconds=180).splitlines() == ["True"]


def test_a_burst_of_sigterms_stops_a_child_instead_of_deadlocking_it() -> None:
    """Many SIGTERMs at once (the kernel sends one per daemon thread that dies) set ``stopping`` and the child ends;
    a handler calling ``stopping.set()`` itself deadlocked on the Event's lock when run again inside itself."""
    for _ in range(3):
        child = subprocess.Popen([sys.executable, "-I", "-c", _STOPS_ON_SIGTERM, str(REPO)], stdout=subprocess.PIPE,
                                 stdin=subprocess.DEVNULL, text=True)
        try:
            assert child.stdout is not None and child.stdout.readline() == "ready\n"
            for _ in range(500):
                try:
                    os.kill(child.pid, signal.SIGTERM)
                except ProcessLookupError:
                    break
            assert child.wait(120) == 0
            assert child.stdout.read() == "stopped\n"
        finally:
            if child.poll() is None:
                child.kill()
                child.wait(10)


@pytest.mark.slow
def test_a_delivery_child_stops_when_the_daemon_is_sigkilled(agent: AgentProcess, receiver: Receiver,
                                                             token_file: Path) -> None:
    """SIGKILL to the daemon mid-delivery (the OOM killer, outside systemd's cgroup kill): the kernel's SIGTERM stops
    its delivery child after the batch in flight. Orphaned, it would drain the whole outbox beside the next daemon."""
    agent.write_config(agent_config(agent.state_dir, receiver.url, token_file, log_level="info", batch_size=1,
                                    heartbeat_interval_seconds=600))
    box = agent.outbox()
    queued = [box.enqueue(event()).event_id for _ in range(20)]
    box.close()
    receiver.mode = "slow:0.2"
    agent.start()
    deadline = time.monotonic() + 120  # only ends a broken run
    while not receiver.stored_order:
        assert time.monotonic() < deadline, "no batch arrived"
        time.sleep(0.01)
    assert agent.proc is not None
    children = daemon_children(agent.proc.pid)
    assert children, "no delivery child running"
    stored_before_kill = len(receiver.stored_order)  # however many a slow machine let through before the kill
    os.kill(agent.proc.pid, signal.SIGKILL)
    agent.proc.wait(60)
    wait_until_ended(children, 60.0)  # the job child does not outlive the SIGKILLed daemon
    time.sleep(0.5)
    # The batch in flight at the kill (and one that raced the count above) may still arrive, never the rest.
    assert 1 <= len(receiver.stored_order) <= stored_before_kill + 2, "the orphaned child went on draining"
    assert receiver.stored_order == queued[:len(receiver.stored_order)]
