"""A real hub process cuts off slow clients: trickled headers, a trickled body, a Content-Length that lies."""

from __future__ import annotations

import http.client
import socket
import time
from pathlib import Path
from typing import Iterator

import pytest
import requests

from agent.hub.tokens import add_token
from tests.hub.factories import batch_json, event
from tests.hub.process import HubProcess, wait_until, write_config

pytestmark = pytest.mark.slow  # a real server per test

HEADER_TIMEOUT_SECONDS = 1.0
BODY_TIMEOUT_SECONDS = 1.5


# The timeouts of the hub a prompt client talks to: far longer than a loaded machine can hold up a prompt request.
PROMPT_TIMEOUT_SECONDS = 60.0


@pytest.fixture
def hub(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[HubProcess]:
    """A hub with the short timeouts above; ``indirect`` parametrization with ``PROMPT_TIMEOUT_SECONDS`` sets both."""
    header, body = (HEADER_TIMEOUT_SECONDS, BODY_TIMEOUT_SECONDS) if not hasattr(request, "param") else (
        request.param, request.param)
    tokens_file = tmp_path / "tokens.json"
    config = write_config(tmp_path / "hub.toml", listen_host="127.0.0.1", listen_port=0,
                          database_url=f"sqlite:///{tmp_path}/hub.db", tokens_file=tokens_file,
                          tokens_reload_seconds=0, shutdown_timeout_seconds=2,
                          header_timeout_seconds=header, body_timeout_seconds=body)
    process = HubProcess(config).start()
    process.tokens_file = tokens_file  # type: ignore[attr-defined]
    yield process
    process.stop()


@pytest.fixture
def host_token(hub: HubProcess) -> str:
    return add_token(str(hub.tokens_file), "host", "host-a")  # type: ignore[attr-defined]


def _connect(hub: HubProcess) -> socket.socket:
    assert hub.port is not None
    sock = socket.create_connection(("127.0.0.1", hub.port), timeout=10)
    return sock


def _trickle(sock: socket.socket, data: bytes, seconds_per_byte: float, budget_seconds: float) -> float:
    """Send one byte at a time until the hub closes the connection; how long it took (or the budget)."""
    started = time.monotonic()
    for byte in data:
        if time.monotonic() - started > budget_seconds:
            break
        try:
            sock.sendall(bytes([byte]))
        except (BrokenPipeError, ConnectionResetError):
            break
        time.sleep(seconds_per_byte)
    return time.monotonic() - started


def _read_until_closed(sock: socket.socket, timeout_seconds: float) -> bytes:
    sock.settimeout(timeout_seconds)
    out = b""
    try:
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                return out
            out += chunk
    except ConnectionResetError:
        return out


def test_headers_sent_one_byte_at_a_time_are_cut_off(hub: HubProcess, host_token: str) -> None:
    """A client trickling its request line and headers loses the connection after the header timeout."""
    sock = _connect(hub)
    # At 50 ms a byte the headers would take over a minute: the trickle ends when the hub cuts the connection, and
    # headers the hub did not cut off would end in an answer, which the read below refuses.
    request = ("POST /v1/events HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
               f"Authorization: Bearer {host_token}\r\nX-Padding: {'p' * 1200}\r\n\r\n").encode()
    _trickle(sock, request, 0.05, 60)
    # The read's 60 s timeout bounds the wait for the close: a bound a loaded machine cannot reach.
    assert _read_until_closed(sock, 60) == b"", "no answer: the connection is just closed"
    assert wait_until(lambda: any('"phase": "headers"' in line for line in hub.lines))


@pytest.mark.parametrize("how", ["trickled", "short"])
def test_a_slow_or_short_body_gets_408_and_the_connection_closes(hub: HubProcess, host_token: str, how: str) -> None:
    """A body at a byte per 50 ms, or one shorter than its Content-Length, ends in 408 within the body timeout."""
    body = batch_json([event("host-a")])
    head = ("POST /v1/events HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Authorization: Bearer {host_token}\r\nContent-Length: {len(body) + (100 if how == 'short' else 0)}"
            "\r\n\r\n").encode()
    sock = _connect(hub)
    sock.sendall(head)
    if how == "trickled":
        _trickle(sock, body, 0.05, BODY_TIMEOUT_SECONDS + 1)
    else:
        sock.sendall(body)
    # The 408 says the body timeout ended the request (a body the hub waited for would never be answered); the
    # read's 60 s timeout bounds the wait for it, a bound a loaded machine cannot reach.
    answer = _read_until_closed(sock, 60)
    assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
    assert b"request_timeout" in answer
    assert wait_until(lambda: any('"phase": "body"' in line for line in hub.lines))  # stderr is read by a thread
    # The hub still serves everyone else.
    assert requests.get(f"{hub.url}/healthz", timeout=60).status_code == 200


@pytest.mark.parametrize("hub", [PROMPT_TIMEOUT_SECONDS], indirect=True)
def test_a_prompt_client_on_a_kept_alive_connection_is_not_cut_off(hub: HubProcess, host_token: str) -> None:
    """Two batches on one kept-alive connection, a pause between them, each well within the timeouts, are both
    stored over that one connection."""
    assert hub.port is not None
    # http.client, unlike requests, never reconnects behind the test's back: a cut connection fails the second post.
    connection = http.client.HTTPConnection("127.0.0.1", hub.port, timeout=60)
    try:
        for n in range(2):
            connection.request("POST", "/v1/events", body=batch_json([event("host-a", sequence=n + 1)]),
                               headers={"Authorization": f"Bearer {host_token}", "Content-Type": "application/json"})
            reply = connection.getresponse()
            text = reply.read()
            assert reply.status == 200, text
            # Idle between requests, as a kept-alive client is; the timeouts are 120 times this pause, so however
            # late a loaded machine ends it, the hub must not cut the connection.
            time.sleep(0.5)
    finally:
        connection.close()
