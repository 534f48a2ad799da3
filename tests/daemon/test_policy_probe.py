"""The policy fetch's stdlib-only probe (agent/daemon_jobs/hub_probe.py, issue #45): against a real hub on
127.0.0.1 and through real job children, counted at the children seam, no full fetch child starts for a 304 the
daemon already took, nor for a hub that is down; a push, a changed bundle state or the periodic full fetch does
start one."""

from __future__ import annotations

import json
import socket
import ssl
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Tuple

import pytest

from agent.config import load_settings
from agent.daemon_jobs import children
from agent.daemon_jobs.children import PolicyFetchInChild, lean_argv
from agent.daemon_jobs.hub_probe import answers_digest, probe
from agent.host import Host
from tests.bundle.test_fetch import hub_site
from tests.bundle.test_install import PERMISSIVE, POLICY, Site, run
from tests.daemon.spawns import Spawns
from tests.daemon.test_jobs import make_runtime
from tests.hub.process import HubProcess
from tests.hub.test_cli_hub_policy import hub  # noqa: F401 - the real hub fixture


def closed_port() -> int:
    """A port on 127.0.0.1 that nothing listens on (bound, then closed)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_answers_digest_covers_status_rollout_headers_and_body_but_not_the_date() -> None:
    """The digest moves with a rollout header or the body (a notice on a 304 must reach the full fetch), not with
    the Date header every answer carries."""
    base = [("/v1/policy/bundle", 304, [("ETag", '"bundle-3"'), ("Date", "Mon")], b"")]
    same = [("/v1/policy/bundle", 304, [("Date", "Tue"), ("ETag", '"bundle-3"')], b"")]
    notice = [("/v1/policy/bundle", 304, [("ETag", '"bundle-3"'), ("X-Gpuguard-Rollout-State", "admitting")], b"")]
    body = [("/v1/policy/bundle", 200, [("ETag", '"bundle-3"')], b"{}")]
    assert answers_digest(base) == answers_digest(same)
    assert len({answers_digest(base), answers_digest(notice), answers_digest(body)}) == 3


@pytest.mark.slow  # a real hub process and real children
def test_a_304_starts_no_full_child_and_a_push_does(hub: HubProcess, tmp_path: Path,  # noqa: F811
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """After the full fetch that installed serial 3 and one that recorded the hub's answers, further 304s are the
    probe alone; a push of serial 4 starts the full child at the next run; a changed bundle state and the periodic
    full fetch start it too."""
    site, _host_token, admin = hub_site(hub, tmp_path)
    assert run("hub", "policy", "push", str(site.bundle(3, POLICY)), "--hub", hub.url,
               "--token-file", str(admin))[0] == 0
    rt = make_runtime(tmp_path, Host.for_root(str(site.root)), load_settings(str(site.config)))
    spawns, asked = Spawns(), []  # type: Spawns, List[str]
    fetch = PolicyFetchInChild(rt, str(site.config), asked.append, argv=spawns.full, probe=spawns.probe)
    fetch.run()
    assert (spawns.started, asked) == (["full"], ["policy_bundle_installed"])
    fetch.run()  # the first probe: its answers are recorded by the full fetch after it
    assert spawns.since(1) == ["probe", "full"]
    for _ in range(3):
        fetch.run()
    assert spawns.since(3) == ["probe"] * 3 and asked == ["policy_bundle_installed"]

    assert run("hub", "policy", "push", str(site.bundle(4, PERMISSIVE)), "--hub", hub.url,
               "--token-file", str(admin))[0] == 0
    mark = len(spawns.started)
    fetch.run()
    assert spawns.since(mark) == ["probe", "full"] and asked[-1] == "policy_bundle_installed"
    state = json.loads((site.state / "policy-bundle/state.json").read_text())
    assert state["serial"] == 4

    (site.state / "policy-bundle/state.json").touch()  # what a local `policy install` does, say
    mark = len(spawns.started)
    fetch.run()
    assert spawns.since(mark) == ["full"]
    mark = len(spawns.started)
    fetch.run()
    fetch.run()
    assert spawns.since(mark) == ["probe", "full", "probe"]  # the new plan's answers recorded, then matched
    monkeypatch.setattr(children, "FULL_FETCH_EVERY_SECONDS", 0.0)
    mark = len(spawns.started)
    fetch.run()
    assert spawns.since(mark) == ["full"]


@pytest.mark.slow  # real children
def test_a_hub_that_is_down_starts_only_the_probe_after_the_first_fetch(tmp_path: Path) -> None:
    """Against a port nothing listens on: the first fetch (a full child) fails and hands back its plan; every later
    run is the probe alone, logged as a failed fetch with the policy in force kept."""
    site = Site(tmp_path)
    token = tmp_path / "host.token"
    token.write_text("host-token-0123456789\n")
    token.chmod(0o600)
    site.config.write_text(site.config.read_text() + f'[report]\nendpoint_url = "http://127.0.0.1:{closed_port()}"\n'
                                                     f'token_file = "{token}"\nconnect_timeout_seconds = 1\n')
    rt = make_runtime(tmp_path, Host.for_root(str(site.root)), load_settings(str(site.config)))
    spawns, asked = Spawns(), []  # type: Spawns, List[str]
    fetch = PolicyFetchInChild(rt, str(site.config), asked.append, argv=spawns.full, probe=spawns.probe)
    for _ in range(4):
        fetch.run()
    assert spawns.started == ["full", "probe", "probe", "probe"] and asked == []


class NoPolicyHere(BaseHTTPRequestHandler):
    """An endpoint that serves no policy (an ingest-only receiver): every GET is a 501 from http.server."""

    def log_message(self, fmt: str, *args: object) -> None:
        pass


@pytest.mark.slow  # real children
def test_answers_a_full_fetch_keeps_failing_on_are_retried_only_every_few_minutes(tmp_path: Path) -> None:
    """An endpoint answering 501 to every GET: three full fetches fail on the same answers after the first, then
    the probe alone logs the same failure (a changed answer would start the full fetch at once)."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), NoPolicyHere)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        site = Site(tmp_path)
        token = tmp_path / "host.token"
        token.write_text("host-token-0123456789\n")
        token.chmod(0o600)
        site.config.write_text(site.config.read_text() + f'[report]\nendpoint_url = "http://127.0.0.1:'
                                                         f'{server.server_port}"\ntoken_file = "{token}"\n')
        rt = make_runtime(tmp_path, Host.for_root(str(site.root)), load_settings(str(site.config)))
        spawns, asked = Spawns(), []  # type: Spawns, List[str]
        fetch = PolicyFetchInChild(rt, str(site.config), asked.append, argv=spawns.full, probe=spawns.probe)
        for _ in range(6):
            fetch.run()
        assert spawns.started == ["full"] + ["probe", "full"] * 3 + ["probe"] * 2 and asked == []
    finally:
        server.shutdown()
        server.server_close()


class Answers304(BaseHTTPRequestHandler):
    """A hub answering every GET with 304, the bundle's ETag and a rollout state."""

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self.send_response(304)
        self.send_header("ETag", '"bundle-3"')
        self.send_header("X-Gpuguard-Rollout-State", "admitting")
        self.end_headers()

    def log_message(self, fmt: str, *args: object) -> None:
        pass


@pytest.mark.parametrize("which", ["trusted", "name_mismatch", "system_store"])
def test_the_probe_over_tls_answers_with_the_ca_file_and_is_unsure_never_down_without_it(
        tmp_path: Path, certificates: Tuple[Tuple[str, str], Tuple[str, str]], which: str) -> None:
    """Over HTTPS with the CA file of the plan the probe answers (the same digest twice); a certificate for another
    name or one the system store does not hold is ``unsure`` (the full fetch decides), never ``down``."""
    (cert, key), (other_cert, other_key) = certificates
    server = ThreadingHTTPServer(("127.0.0.1", 0), Answers304)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(*((other_cert, other_key) if which == "name_mismatch" else (cert, key)))
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        plan = {"endpoint_url": f"https://127.0.0.1:{server.server_port}", "token_file": None,
                "ca_file": None if which == "system_store" else (other_cert if which == "name_mismatch" else cert),
                "connect_timeout_seconds": 5, "read_timeout_seconds": 5, "deadline_seconds": 30,
                "max_bytes": 1 << 20, "paths": [["/v1/policy/bundle", '"bundle-3"']]}
        first, second = probe(plan), probe(plan)
    finally:
        server.shutdown()
        server.server_close()
    if which == "trusted":
        assert first["outcome"] == "answered" and first["digest"] == second["digest"] != ""
    else:
        assert first["outcome"] == "unsure", first


def test_the_probe_loads_no_third_party_module_and_reads_nothing_of_the_host_python(tmp_path: Path) -> None:
    """The lean child runs isolated (``-I -S``) and, asked for the probe alone, imports only the standard library
    without sqlite3, agent/__init__, agent/daemon_jobs/__init__, lean_child.py, hub_probe.py, procstatus.py and
    agent/wire.py."""
    argv = lean_argv("lean", "", "/", "{}", str(tmp_path / "r.json"))
    assert argv[1:3] == ["-I", "-S"]
    plan = {"endpoint_url": f"http://127.0.0.1:{closed_port()}", "token_file": None, "ca_file": None,
            "connect_timeout_seconds": 5, "read_timeout_seconds": 5, "deadline_seconds": 30, "max_bytes": 1024,
            "paths": [["/v1/policy/bundle", None]]}
    boot = argv[4].replace("from agent.daemon_jobs.lean_child import main; sys.exit(main(sys.argv[1:]))",
                           "from agent.daemon_jobs.lean_child import run_parts; "
                           f"answer = run_parts({{'probe': {plan!r}}}); assert answer['probe']['outcome'] == 'down'; "
                           "print(sorted(m for m in sys.modules if m.startswith('agent') or '.' not in m))")
    out = subprocess.run([sys.executable, "-I", "-S", "-c", boot], capture_output=True, text=True, timeout=60,
                         check=True).stdout
    loaded = set(eval(out))  # noqa: S307 - our own print of a list of strings
    assert {m for m in loaded if m.startswith("agent")} == {"agent", "agent.daemon_jobs", "agent.daemon_jobs.hub_probe",
                                                           "agent.daemon_jobs.lean_child",
                                                           "agent.daemon_jobs.procstatus", "agent.wire"}
    assert "sqlite3" not in loaded and "_sqlite3" not in loaded
    assert not loaded & {"requests", "urllib3", "pydantic", "structlog", "certifi"}
