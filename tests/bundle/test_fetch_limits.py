"""The hub's answer is bounded in time and size: a hub that trickles its headers or its body, compresses its answer
or cuts it short is a failed fetch in one line, within the deadline."""

from __future__ import annotations

import base64
import gzip
import json
import socket
import threading
import time
from typing import Iterator, List

import pytest

from agent.bundle.fetch import fetch_offer

HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"


class OneAnswerHub:
    """A server on 127.0.0.1 that answers each connection with ``answer(conn)`` and records the request heads."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.requests: List[bytes] = []
        self.stop = threading.Event()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(0.2)
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.listener.accept()
            except OSError:
                continue
            with conn:
                conn.settimeout(5.0)
                head = b""
                try:
                    while b"\r\n\r\n" not in head:
                        received = conn.recv(4096)
                        if not received:
                            break
                        head += received
                    self.requests.append(head)
                    self._answer(conn)
                except OSError:
                    pass

    def _trickle(self, conn: socket.socket, byte: bytes) -> None:
        """One byte every 0.1 s for at most 60 s: never slow enough for a read timeout of 1 s."""
        ends = time.monotonic() + 60.0
        while not self.stop.is_set() and time.monotonic() < ends:
            conn.sendall(byte)
            time.sleep(0.1)

    def _answer(self, conn: socket.socket) -> None:
        if self.mode == "trickle-body":
            conn.sendall(HEAD + b"Content-Length: 100000\r\n\r\n")
            self._trickle(conn, b" ")
        elif self.mode == "short-body":
            conn.sendall(HEAD + b"Content-Length: 100000\r\n\r\n{\"serial\": 3")
        elif self.mode == "trickle-headers":
            conn.sendall(HEAD + b"X-Slow: ")
            self._trickle(conn, b"a")
        else:
            body = json.dumps({"serial": 3, "bundle": base64.b64encode(b"B").decode(),
                               "signature": base64.b64encode(b"S").decode()}).encode()
            packed = gzip.compress(body)
            conn.sendall(HEAD + b"Content-Encoding: gzip\r\nContent-Length: %d\r\n\r\n" % len(packed) + packed)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(10.0)
        self.listener.close()


@pytest.fixture
def slow_hub(request: pytest.FixtureRequest) -> Iterator[OneAnswerHub]:
    hub = OneAnswerHub(request.param)
    yield hub
    hub.close()


@pytest.mark.parametrize("slow_hub", ["trickle-body", "trickle-headers"], indirect=True)
def test_a_trickling_hub_fails_within_the_deadline(slow_hub: OneAnswerHub) -> None:
    """A byte every 0.1 s never trips the 1 s read timeout, yet the fetch fails once its 2 s deadline has passed."""
    started = time.monotonic()
    offer = fetch_offer(slow_hub.url, "t", None, 1, (1.0, 1.0), deadline_seconds=2.0)
    elapsed = time.monotonic() - started
    assert offer.status == "failed" and offer.serial is None, offer
    assert offer.detail == f"{slow_hub.url}/v1/policy/bundle: no complete answer within 2 s"
    assert elapsed < 30.0  # the 2 s deadline, not the 60 s trickle: a bound a loaded machine cannot reach


@pytest.mark.parametrize("slow_hub", ["gzip"], indirect=True)
def test_a_compressed_answer_is_refused(slow_hub: OneAnswerHub) -> None:
    """The agent asks for an uncompressed answer, and one compressed anyway (which could inflate far past the size
    limit in memory) is a failed fetch."""
    offer = fetch_offer(slow_hub.url, "t", None, 1, (2.0, 2.0))
    assert (offer.status, offer.bundle) == ("failed", b"")
    assert offer.detail.endswith(": a gzip-encoded answer (asked for none)")
    assert b"\r\naccept-encoding: identity\r\n" in slow_hub.requests[0].lower()


@pytest.mark.parametrize("slow_hub", ["short-body"], indirect=True)
def test_an_answer_cut_short_is_a_failed_fetch(slow_hub: OneAnswerHub) -> None:
    """A hub that closes the connection before the body it announced is a failed fetch in one line, not an
    exception out of the fetch (urllib3 raises its own error from the raw read)."""
    offer = fetch_offer(slow_hub.url, "t", None, 1, (2.0, 2.0))
    assert (offer.status, offer.detail) == ("failed", f"{slow_hub.url}/v1/policy/bundle: ProtocolError")
