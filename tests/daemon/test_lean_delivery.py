"""Delivery without the full child (agent/daemon_jobs/lean_delivery.py, issue #45): the stdlib-only child sends the
outbox's batches to a real ingest over HTTP and HTTPS as the full child does, marks only what was acknowledged, is
``down`` for a receiver that is not serving and ``unsure`` for anything unusual; counted at the children seam, a
normal heartbeat batch starts no full delivery child."""

from __future__ import annotations

import json
import signal
import socket
import sqlite3
import ssl
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

import pytest

from agent.config import load_settings
from agent.daemon_jobs.child_main import lean_delivery_plan
from agent.daemon_jobs.children import DeliveryInChild, lean_argv
from agent.daemon_jobs.lean_delivery import Unsure, deliver, parse_acknowledgement
from agent.host import Host
from agent.hub.tokens import add_token
from agent.report.events import Event, EventBatch
from agent.report.outbox import Outbox
from agent.report.outbox_ack import HWM_SUFFIX
from agent.report.sender import Sender
from tests.daemon.conftest import agent_config
from tests.daemon.spawns import Spawns
from tests.daemon.test_jobs import make_runtime
from tests.hub.process import HubProcess, write_config
from tests.report.events import event
from tests.report.receiver import Receiver

HOST_ID = "test-host-1"
TOKEN = "test-token-0123456789"


def host_event(kind: str = "heartbeat") -> Event:
    """A test event of this test's host."""
    return event(kind).model_copy(update={"host_id": HOST_ID})


def settings_for(tmp_path: Path, url: str, token_file: Optional[Path], **report: object):  # type: ignore[no-untyped-def]
    """Settings with the test state directory, ``url`` and the token file (and any [report] keys given)."""
    config = tmp_path / "agent.toml"
    config.write_text(agent_config(tmp_path / "state", url, token_file, **report))
    return config, load_settings(str(config))


def filled_outbox(tmp_path: Path, kinds: Sequence[str]) -> Outbox:
    """The test state directory's outbox with one event of each kind, in order."""
    box = Outbox(str(tmp_path / "state" / "outbox.sqlite3"))
    for kind in kinds:
        box.enqueue(host_event(kind))
    return box


def request_for(tmp_path: Path, url: str, token_file: Optional[Path], **report: object) -> Dict[str, object]:
    """The lean child's request as the daemon makes it from the full child's plan."""
    _, settings = settings_for(tmp_path, url, token_file, **report)
    plan = lean_delivery_plan(settings.report, str(tmp_path / "state" / "outbox.sqlite3"), str(tmp_path / "state"))
    assert plan is not None
    return {"plan": plan.to_json(), "host_id": HOST_ID}


def closed_port() -> int:
    """A port on 127.0.0.1 that nothing listens on (bound, then closed)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Canned:
    """An endpoint that answers every POST with one status, headers and body (and records the bodies)."""

    def __init__(self, status: int, body: bytes, headers: Sequence[Tuple[str, str]] = ()) -> None:
        self.status, self.body, self.headers = status, body, headers
        self.posted: List[bytes] = []
        canned = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                canned.posted.append(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
                self.send_response(canned.status)
                for name, value in canned.headers:
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(canned.body)))
                self.end_headers()
                self.wfile.write(canned.body)

            def log_message(self, fmt: str, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_port}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def hub(tmp_path: Path) -> Iterator[HubProcess]:
    """The real reference hub over a SQLite database, with a host token for HOST_ID in hub.token."""
    hub_dir = tmp_path / "hub"
    hub_dir.mkdir()
    config = write_config(hub_dir / "hub.toml", listen_host="127.0.0.1", listen_port=0,
                          database_url=f"sqlite:///{hub_dir}/hub.db", tokens_file=hub_dir / "tokens.json",
                          tokens_reload_seconds=0, shutdown_timeout_seconds=5)
    token = hub_dir / "host.token"
    token.write_text(add_token(str(hub_dir / "tokens.json"), "host", HOST_ID) + "\n")
    token.chmod(0o600)
    process = HubProcess(config)
    process.hub_dir = hub_dir  # type: ignore[attr-defined]
    process.start()
    yield process
    process.stop()


@pytest.mark.slow  # a real hub process
def test_the_lean_child_delivers_every_batch_to_the_real_hub_over_http(hub: HubProcess, tmp_path: Path) -> None:
    """Twelve events in batches of five reach the real hub once each, in sequence order (three batches listed for
    the daemon's log); the outbox is empty, the delivered ids remembered, the high-water mark says none is queued."""
    hub_dir: Path = hub.hub_dir  # type: ignore[attr-defined]
    box = filled_outbox(tmp_path, ["heartbeat", "snapshot_changed", "policy_violation"] * 4)
    answer = deliver(request_for(tmp_path, hub.url, hub_dir / "host.token"))
    assert answer["outcome"] == "delivered", answer
    assert [(b["events"], b["accepted"], b["first_sequence"]) for b in answer["batches"]] == [  # type: ignore[attr-defined]
        (5, 5, 1), (5, 5, 6), (2, 2, 11)]
    assert box.depth() == 0
    with sqlite3.connect(hub_dir / "hub.db") as conn:
        stored = [row[0] for row in conn.execute("SELECT sequence FROM events WHERE host_id = ? ORDER BY sequence",
                                                 (HOST_ID,))]
    assert stored == list(range(1, 13))
    mark = json.loads(Path(box.path + HWM_SUFFIX).read_text())
    assert (mark["last_sequence"], mark["queued"]) == (12, 0)
    box.enqueue(host_event())  # an id delivered is remembered: a replayed fact keeps its sequence
    assert box.last_sequence() == 13


def test_over_https_the_receiver_stores_what_the_full_sender_would_have_sent(
        tmp_path: Path, certificates: Tuple[Tuple[str, str], Tuple[str, str]], token_file: Path) -> None:
    """Over TLS with the configured CA bundle, the lean child's batches are stored as the events the pydantic
    Sender posts for the same outbox (same ids, sequences, fields), with the same token."""
    cert, key = certificates[0]
    lean, full = Receiver(tls=(cert, key)).start(), Receiver(tls=(cert, key)).start()
    try:
        box = filled_outbox(tmp_path, ["heartbeat", "rollback", "transaction_blocked"])
        pending = box.pending(10)
        _, settings = settings_for(tmp_path, full.url, token_file, ca_bundle=cert)
        Sender(settings.report, TOKEN).send(EventBatch(events=pending))
        answer = deliver(request_for(tmp_path, lean.url, token_file, ca_bundle=cert))
        assert answer["outcome"] == "delivered", answer
        assert box.depth() == 0 and lean.auth_failures == 0
        assert lean.stored == full.stored and len(lean.stored) == 3
    finally:
        lean.stop()
        full.stop()


def test_only_acknowledged_events_leave_the_outbox(tmp_path: Path, token_file: Path) -> None:
    """A 200 that acknowledges one event of a batch of three: that one is marked delivered, the other two stay
    queued and the answer is ``unsure`` (the full child decides)."""
    box = filled_outbox(tmp_path, ["heartbeat"] * 3)
    first = box.pending(1)[0].event_id
    endpoint = Canned(200, json.dumps({"accepted": [first], "duplicates": ["not-in-the-batch"]}).encode())
    try:
        answer = deliver(request_for(tmp_path, endpoint.url, token_file))
    finally:
        endpoint.close()
    assert answer["outcome"] == "unsure" and answer["drained"]["acknowledged_at_seconds"] is not None  # type: ignore[index]
    assert [e.sequence for e in box.pending(10)] == [2, 3]


UNUSUAL_ANSWERS = {
    "500": (500, b'{"detail": "boom"}', ()),
    "401": (401, b'{"detail": "bad token"}', ()),
    "413": (413, b"{}", ()),
    "422": (422, b"{}", ()),
    "redirect": (301, b"", (("Location", "http://127.0.0.1:1/v1/events"),)),
    "201": (201, b'{"accepted": [], "duplicates": []}', ()),
    "not_json": (200, b"ok", ()),
    "duplicate_key": (200, b'{"accepted": [], "accepted": [], "duplicates": []}', ()),
    "extra_field": (200, b'{"accepted": [], "duplicates": [], "more": 1}', ()),
    "ids_not_strings": (200, b'{"accepted": [1], "duplicates": []}', ()),
    "gzip": (200, b'{"accepted": [], "duplicates": []}', (("Content-Encoding", "gzip"),)),
    "over_bound": (200, b'{"accepted": ["' + b"a" * (300 << 10) + b'"]}', ()),
    "none_acknowledged": (200, b'{"accepted": [], "duplicates": []}', ()),
}


@pytest.mark.parametrize("which", sorted(UNUSUAL_ANSWERS))
def test_an_unusual_answer_is_unsure_and_keeps_every_event(tmp_path: Path, token_file: Path, which: str) -> None:
    """Any status but 200 and 502/503/504, or a 200 whose acknowledgement is not strictly {accepted, duplicates}
    with ids of the batch, is ``unsure``; nothing leaves the outbox."""
    box = filled_outbox(tmp_path, ["heartbeat"] * 2)
    endpoint = Canned(*UNUSUAL_ANSWERS[which])
    try:
        answer = deliver(request_for(tmp_path, endpoint.url, token_file))
    finally:
        endpoint.close()
    assert answer["outcome"] == "unsure", answer
    assert len(endpoint.posted) == 1 and box.depth() == 2


@pytest.mark.parametrize("which", ["proxy", "token_mode", "token_missing", "ca_not_pem", "name_mismatch",
                                   "other_host_id", "no_outbox", "orphaned"])
def test_a_setting_it_cannot_honour_is_unsure_and_sends_nothing(
        tmp_path: Path, certificates: Tuple[Tuple[str, str], Tuple[str, str]], token_file: Path,
        which: str) -> None:
    """A proxy in the environment, a token file open to others or missing, a CA file that is not PEM, a
    certificate for another name, an event of another host id, no outbox at all or a daemon that is gone:
    ``unsure``, nothing sent or marked."""
    (cert, key), (other_cert, _) = certificates
    receiver = Receiver(tls=(cert, key)).start()
    try:
        box = filled_outbox(tmp_path, ["heartbeat"])
        ca = {"ca_not_pem": str(token_file), "name_mismatch": other_cert}.get(which, cert)
        request = request_for(tmp_path, receiver.url, token_file, ca_bundle=ca)
        plan: Dict[str, object] = request["plan"]  # type: ignore[assignment]
        environ = {"HTTPS_PROXY": "http://127.0.0.1:3128"} if which == "proxy" else {}
        if which == "token_mode":
            token_file.chmod(0o644)
        if which == "token_missing":
            plan["token_file"] = str(tmp_path / "gone.token")
        if which == "other_host_id":
            request["host_id"] = "renamed-host"
        if which == "no_outbox":
            plan["outbox_path"] = str(tmp_path / "none.sqlite3")
        if which == "orphaned":
            request["daemon_pid"] = 1  # not this process's parent: the daemon that started it is gone
        answer = deliver(request, environ)
    finally:
        receiver.stop()
    assert answer["outcome"] == "unsure", answer
    assert receiver.stored == {} and box.depth() == 1
    assert not (tmp_path / "none.sqlite3").exists()


@pytest.mark.parametrize("which", ["refused", "503"])
def test_a_receiver_that_is_not_serving_is_down_with_the_full_childs_category(tmp_path: Path, token_file: Path,
                                                                             which: str) -> None:
    """Nothing listening is ``down`` as ``unreachable``, a 503 as ``server`` with its status: events kept."""
    box = filled_outbox(tmp_path, ["heartbeat"] * 2)
    endpoint = Canned(503, b"") if which == "503" else None
    url = endpoint.url if endpoint is not None else f"http://127.0.0.1:{closed_port()}"
    try:
        answer = deliver(request_for(tmp_path, url, token_file))
    finally:
        if endpoint is not None:
            endpoint.close()
    assert answer["outcome"] == "down", answer
    failure = answer["drained"]["failure"]  # type: ignore[index]
    assert (failure["category"], failure["status_code"]) == (("server", 503) if which == "503"
                                                             else ("unreachable", None))
    assert failure["url"] == url + "/v1/events" and box.depth() == 2


def test_parse_acknowledgement_takes_exactly_the_two_lists() -> None:
    """Both lists, either left out (the model's defaults), and refusals of anything else."""
    assert parse_acknowledgement(b'{"accepted": ["a"], "duplicates": ["b"]}') == (["a"], ["b"])
    assert parse_acknowledgement(b'{"duplicates": ["b"]}') == ([], ["b"])
    for bad in (b"[]", b'{"accepted": "a"}', b'{"accepted": [null]}', b"\xff", b'{"accepted": [NaN]}'):
        with pytest.raises(Unsure):
            parse_acknowledgement(bad)


def test_the_lean_child_loads_no_third_party_module(tmp_path: Path) -> None:
    """The lean child's command line runs isolated (``-I -S``) and imports only the standard library and the
    stdlib-only agent modules it names."""
    argv = lean_argv("lean", "", "/", "{}", str(tmp_path / "r.json"))
    assert argv[1:3] == ["-I", "-S"]
    boot = argv[4].replace("from agent.daemon_jobs.lean_child import main; sys.exit(main(sys.argv[1:]))",
                           "from agent.daemon_jobs.lean_child import run_parts; "
                           "answer = run_parts({'deliver': {}}); assert answer['deliver']['outcome'] == 'unsure'; "
                           "print(sorted(m for m in sys.modules if m.startswith('agent') or '.' not in m))")
    out = subprocess.run([sys.executable, "-I", "-S", "-c", boot], capture_output=True, text=True, timeout=60,
                         check=True).stdout
    loaded = set(eval(out))  # noqa: S307 - our own print of a list of strings
    assert {m for m in loaded if m.startswith("agent")} == {
        "agent", "agent.daemon_jobs", "agent.daemon_jobs.lean_child", "agent.daemon_jobs.lean_delivery",
        "agent.daemon_jobs.hub_probe",
        "agent.daemon_jobs.procstatus", "agent.wire",
        "agent.errors", "agent.files", "agent.hostfacts", "agent.hostfacts.paths", "agent.strictjson",
        "agent.report", "agent.report.outbox_ack"}
    assert not loaded & {"requests", "urllib3", "pydantic", "structlog", "certifi", "sqlalchemy"}


@pytest.mark.slow  # real children
def test_heartbeat_batches_start_no_full_child_after_the_first(tmp_path: Path, token_file: Path) -> None:
    """The first drain is a full child (it hands back the plan); every later heartbeat batch is the lean child
    alone; a receiver answering 500 starts the full child after the lean one (its failure backs off); one that is
    down is the lean child alone, as ``unreachable``."""
    receiver = Receiver().start()
    try:
        config, settings = settings_for(tmp_path, receiver.url, token_file)
        rt = make_runtime(tmp_path, Host.for_root("/"), settings)
        spawns = Spawns()
        drain = DeliveryInChild(rt, str(config), argv=spawns.full, lean=spawns.lean)
        for _ in range(4):
            rt.outbox.enqueue(host_event())
            drained = drain("interval")
            assert drained.failure is None and drained.acknowledged_at_seconds is not None
        assert spawns.started == ["full", "lean", "lean", "lean"]
        assert rt.outbox.depth() == 0 and len(receiver.stored) == 4

        receiver.mode = "error500"
        rt.outbox.enqueue(host_event())
        drained = drain("interval")
        assert spawns.started[4:] == ["lean", "full"]
        assert drained.failure is not None and drained.failure.category == "server"
        receiver.stop()
        drained = drain("interval")
        assert spawns.started[6:] == ["lean"]
        assert drained.failure is not None and drained.failure.category == "unreachable"
        assert rt.outbox.depth() == 1
    finally:
        receiver.stop()


def test_the_tls_context_verifies_the_name(certificates: Tuple[Tuple[str, str], Tuple[str, str]]) -> None:
    """The context the lean child uses checks host names and certificates, as requests does."""
    from agent.daemon_jobs.hub_probe import tls_context

    context = tls_context(certificates[0][0])
    assert context.check_hostname and context.verify_mode == ssl.CERT_REQUIRED


def test_sigterm_finishes_the_batch_in_flight_and_sends_no_other(tmp_path: Path, token_file: Path,
                                                                 receiver: Receiver) -> None:
    """SIGTERM while the receiver takes a second to answer the first of three one-event batches: the child waits
    for the answer, marks that event delivered, sends nothing more and exits 0 (``unsure``: stopped)."""
    box = filled_outbox(tmp_path, ["heartbeat"] * 3)
    request = request_for(tmp_path, receiver.url, token_file, batch_size=1)
    receiver.mode = "slow:1"
    result = tmp_path / "result.json"
    child = subprocess.Popen(lean_argv("lean", "", "/", json.dumps({"deliver": request}), str(result)))
    try:
        assert receiver.wait_for(lambda r: r.requests >= 1, 60), "the first batch never arrived"
        child.send_signal(signal.SIGTERM)
        assert child.wait(60) == 0
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(10)
    answer = json.loads(result.read_text())["result"]["deliver"]
    assert answer["outcome"] == "unsure" and "SIGTERM" in answer["detail"], answer
    assert receiver.requests == 1 and len(receiver.stored) == 1
    assert [e.sequence for e in box.pending(10)] == [2, 3]
