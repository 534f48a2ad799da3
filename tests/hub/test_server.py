"""A real hub process (uvicorn on 127.0.0.1, port picked by the kernel) taking real batches over HTTP."""

from __future__ import annotations

import socket
import sqlite3
import threading
from pathlib import Path
from typing import Dict, Iterator, List

import pytest
import requests

from agent.hub.tokens import add_token
from tests.hub.factories import ROCM_62, batch_json, event, ids
from tests.hub.process import HubProcess, write_config

pytestmark = pytest.mark.slow  # real servers or processes per test: left out of `make test-fast`

MAX_BODY_BYTES = 64 * 1024
TIMEOUT_SECONDS = 10


@pytest.fixture
def hub(tmp_path: Path) -> Iterator[HubProcess]:
    tokens_file = tmp_path / "tokens.json"
    config = write_config(tmp_path / "hub.toml", listen_host="127.0.0.1", listen_port=0,
                          database_url=f"sqlite:///{tmp_path}/hub.db", tokens_file=tokens_file,
                          max_body_bytes=MAX_BODY_BYTES, tokens_reload_seconds=0, shutdown_timeout_seconds=5)
    process = HubProcess(config).start()
    process.db_path = tmp_path / "hub.db"  # type: ignore[attr-defined]
    process.tokens_file = tokens_file  # type: ignore[attr-defined]
    yield process
    process.stop()


@pytest.fixture
def host_token(hub: HubProcess) -> str:
    return add_token(str(hub.tokens_file), "host", "host-a")  # type: ignore[attr-defined]


def post(hub: HubProcess, token: str, body: bytes, session: requests.Session = None) -> requests.Response:
    sender = session or requests
    return sender.post(f"{hub.url}/v1/events", data=body, timeout=TIMEOUT_SECONDS,
                       headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})


def stored_ids(db_path: Path) -> List[str]:
    with sqlite3.connect(db_path) as conn:
        return [row[0] for row in conn.execute("SELECT event_id FROM events ORDER BY event_id")]


def raw_exchange(hub: HubProcess, request: bytes) -> bytes:
    """Send raw bytes, read the answer until the server closes or 5 s pass."""
    with socket.create_connection(("127.0.0.1", hub.port), timeout=5) as conn:
        try:
            conn.sendall(request)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the hub may answer and close before reading everything: read what it said
        answer = b""
        try:
            while True:
                chunk = conn.recv(65536)
                if not chunk:
                    break
                answer += chunk
                if b"\r\n\r\n" in answer and b'"detail"' in answer and answer.rstrip().endswith(b"}"):
                    break
        except (ConnectionResetError, socket.timeout):
            pass
        return answer


def test_it_listens_on_loopback_and_answers_health(hub: HubProcess) -> None:
    """The real hub server listens on loopback by default and answers /healthz ok."""
    assert hub.port and hub.port > 0
    [listening] = hub.events("hub_listening")
    assert listening["host"] == "127.0.0.1"
    assert requests.get(f"{hub.url}/healthz", timeout=TIMEOUT_SECONDS).json()["status"] == "ok"


def test_real_batches_are_stored_once_and_resends_answered_as_duplicates(hub: HubProcess, host_token: str) -> None:
    """A batch sent twice to the real server is stored once; the resend is answered all duplicates."""
    events = [event("host-a", kind="snapshot_changed", pairing=ROCM_62), event("host-a"), event("host-a")]
    with requests.Session() as session:
        first = post(hub, host_token, batch_json(events), session)
        again = post(hub, host_token, batch_json(events), session)
    assert first.status_code == 200 and first.json()["accepted"] == ids(events)
    assert again.status_code == 200 and again.json() == {"accepted": [], "duplicates": ids(events)}
    assert stored_ids(hub.db_path) == sorted(ids(events))  # type: ignore[attr-defined]


def test_concurrent_senders_lose_nothing_and_store_nothing_twice(hub: HubProcess, host_token: str) -> None:
    """8 threads each send 25 one-event batches, every batch twice; every event is stored exactly once."""
    sent: Dict[int, List[str]] = {}
    statuses: List[int] = []

    def sender(worker: int) -> None:
        mine = [event("host-a") for _ in range(25)]
        sent[worker] = ids(mine)
        with requests.Session() as session:
            for item in mine:
                for _ in range(2):
                    statuses.append(post(hub, host_token, batch_json([item]), session).status_code)

    threads = [threading.Thread(target=sender, args=(w,)) for w in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert statuses == [200] * 400
    assert stored_ids(hub.db_path) == sorted(i for batch in sent.values() for i in batch)  # type: ignore[attr-defined]


def test_bad_and_missing_tokens_are_refused(hub: HubProcess, host_token: str) -> None:
    """The real server refuses a missing or bad token (401) and another host's events (403), storing nothing."""
    body = batch_json([event("host-a")])
    missing = requests.post(f"{hub.url}/v1/events", data=body, timeout=TIMEOUT_SECONDS)
    bad = post(hub, host_token[:-2] + "xx", body)
    wrong_host = post(hub, host_token, batch_json([event("host-b")]))
    assert (missing.status_code, bad.status_code, wrong_host.status_code) == (401, 401, 403)
    assert stored_ids(hub.db_path) == []  # type: ignore[attr-defined]


def test_malformed_and_schema_invalid_bodies_are_refused(hub: HubProcess, host_token: str) -> None:
    """The real server refuses broken JSON with 400 and a body that is not an EventBatch with 422."""
    assert post(hub, host_token, b'{"events": [').status_code == 400
    refused = post(hub, host_token, b'{"events": [{"host_id": "host-a"}]}')
    assert refused.status_code == 422 and "EventBatch" in refused.json()["detail"]


def test_a_declared_oversize_body_is_refused_without_being_read(hub: HubProcess, host_token: str) -> None:
    """Content-Length says 100 MB and no body follows: 413 at once, not a wait for 100 MB."""
    answer = raw_exchange(hub, (
        "POST /v1/events HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Authorization: Bearer {host_token}\r\nContent-Length: 100000000\r\n\r\n").encode())
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    assert b"body_too_large" in answer


def test_a_chunked_body_past_the_limit_is_refused(hub: HubProcess, host_token: str) -> None:
    """No Content-Length at all: the hub counts the chunks and stops at the limit."""
    chunk = b"x" * 8192
    chunks = b"".join(b"%x\r\n%s\r\n" % (len(chunk), chunk) for _ in range(MAX_BODY_BYTES // len(chunk) + 2))
    answer = raw_exchange(hub, (
        "POST /v1/events HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Authorization: Bearer {host_token}\r\nTransfer-Encoding: chunked\r\n\r\n").encode() + chunks + b"0\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]


def test_an_oversize_body_from_requests_is_413(hub: HubProcess, host_token: str) -> None:
    """What the agent's sender would see for a too-big batch (Content-Length set by requests)."""
    try:
        response = post(hub, host_token, b" " * (MAX_BODY_BYTES + 1))
    except requests.ConnectionError:
        pytest.fail("the hub reset the connection instead of answering 413")
    assert response.status_code == 413 and response.json()["error"] == "body_too_large"


def test_sigterm_stops_gracefully_and_keeps_what_was_acknowledged(hub: HubProcess, host_token: str) -> None:
    """SIGTERM stops the server with exit 0, and every event it acknowledged is stored."""
    events = [event("host-a") for _ in range(20)]
    assert post(hub, host_token, batch_json(events)).status_code == 200
    assert hub.stop() == 0, hub.log_text()
    assert hub.events("hub_stopped"), hub.log_text()
    assert stored_ids(hub.db_path) == sorted(ids(events))  # type: ignore[attr-defined]


def test_a_stopped_hub_starts_again_on_the_same_database(hub: HubProcess, host_token: str) -> None:
    """Restart keeps the data: a resend after the restart is a duplicate."""
    sent = [event("host-a")]
    assert post(hub, host_token, batch_json(sent)).status_code == 200
    assert hub.stop() == 0
    hub.start()
    assert post(hub, host_token, batch_json(sent)).json() == {"accepted": [], "duplicates": ids(sent)}
