"""A small real HTTP(S) receiver on 127.0.0.1 that implements the hub's ingest contract, for tests.

``POST /v1/events`` with an EventBatch body and ``Authorization: Bearer <token>`` answers 200 with
``{"accepted": [...], "duplicates": [...]}`` (deduplicated by event_id), 401 for a bad token, 422 for a body that
is not an EventBatch. Tests switch ``mode`` to make it answer 500, hang past the client's timeout, or refuse a
batch as too large, and can ``hold`` a reply after storing the events (to kill the agent mid-delivery).
"""

from __future__ import annotations

import json
import ssl
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from pydantic import ValidationError

from agent.report.events import EventBatch


class Receiver:
    """The ingest endpoint; ``stored`` holds each event once, ``arrivals`` every (event_id, sequence) received."""

    def __init__(self, token: str = "test-token-0123456789", tls: Optional[Tuple[str, str]] = None,
                 port: int = 0) -> None:
        self.token = token
        self.tls = tls
        self.port = port
        self.mode = "ok"  # ok | error500 | hang | too_large_over:<n> | reject:<event_id> | slow:<seconds>
        self.stored: Dict[str, dict] = {}
        self.stored_order: List[str] = []
        self.arrivals: List[Tuple[str, int]] = []
        self.duplicates_reported: List[str] = []
        self.requests = 0
        self.auth_failures = 0
        self.hold_next = False
        self.held_ids: List[str] = []
        self.held = threading.Event()
        self.release = threading.Event()
        self._lock = threading.RLock()
        self._server: Optional[ThreadingHTTPServer] = None
        self._thread: Optional[threading.Thread] = None
        self._stop_hanging = threading.Event()

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"

    def start(self) -> "Receiver":
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, fmt: str, *args: object) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                receiver._handle(self)

        server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        server.daemon_threads = True
        server.handle_error = lambda request, address: None  # TLS handshakes that the client aborts
        if self.tls:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(*self.tls)
            server.socket = context.wrap_socket(server.socket, server_side=True, do_handshake_on_connect=False)
        self.port = server.server_address[1]
        self._server = server
        self._stop_hanging.clear()
        self._thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop listening (the endpoint is down); ``start`` again serves on the same port."""
        self._stop_hanging.set()
        self.release.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def unhang(self) -> None:
        """Answer normally from now on and let requests that hang return (without a reply)."""
        self.mode = "ok"
        self._stop_hanging.set()

    def sequences_stored(self) -> List[int]:
        with self._lock:
            return [self.stored[i]["sequence"] for i in self.stored_order]

    def kinds_stored(self) -> List[str]:
        with self._lock:
            return [self.stored[i]["payload"]["kind"] for i in self.stored_order]

    def wait_for(self, predicate, timeout_seconds: float = 120.0) -> bool:  # type: ignore[no-untyped-def]
        """True once ``predicate(self)`` holds; False after a deadline generous enough for a loaded machine."""
        deadline = time.monotonic() + timeout_seconds
        while time.monotonic() < deadline:
            with self._lock:
                if predicate(self):
                    return True
            time.sleep(0.02)
        return False

    def _reply(self, handler: BaseHTTPRequestHandler, code: int, body: dict) -> None:
        data = json.dumps(body).encode()
        handler.send_response(code)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        handler.wfile.write(data)

    def _handle(self, handler: BaseHTTPRequestHandler) -> None:
        length = int(handler.headers.get("Content-Length") or 0)
        raw = handler.rfile.read(length)
        with self._lock:
            self.requests += 1
            mode = self.mode
        if handler.path != "/v1/events":
            return self._reply(handler, 404, {"detail": "not found"})
        if handler.headers.get("Authorization") != f"Bearer {self.token}":
            with self._lock:
                self.auth_failures += 1
            return self._reply(handler, 401, {"detail": "bad token"})
        if mode == "error500":
            return self._reply(handler, 500, {"detail": "internal error (test)"})
        if mode == "hang":
            self._stop_hanging.wait(60)
            return None
        if mode.startswith("slow:"):  # then answers as in "ok"
            self._stop_hanging.wait(float(mode.split(":")[1]))
        try:
            batch = EventBatch.model_validate_json(raw)
        except ValidationError as exc:
            return self._reply(handler, 422, {"detail": str(exc)[:200]})
        if mode.startswith("too_large_over:") and len(batch.events) > int(mode.split(":")[1]):
            return self._reply(handler, 413, {"detail": "batch too large"})
        if mode.startswith("reject:") and any(e.event_id == mode.split(":")[1] for e in batch.events):
            return self._reply(handler, 422, {"detail": "event refused (test)"})
        accepted, duplicates = [], []
        with self._lock:
            for event in batch.events:
                self.arrivals.append((event.event_id, event.sequence))
                if event.event_id in self.stored:
                    duplicates.append(event.event_id)
                else:
                    self.stored[event.event_id] = json.loads(event.model_dump_json())
                    self.stored_order.append(event.event_id)
                    accepted.append(event.event_id)
            self.duplicates_reported.extend(duplicates)
            hold, self.hold_next = self.hold_next, False
        if hold:
            self.held_ids = [e.event_id for e in batch.events]
            self.held.set()
            self.release.wait(60)
            return None  # the client was killed meanwhile; nobody reads a reply
        return self._reply(handler, 200, {"accepted": accepted, "duplicates": duplicates})


def make_certificate(directory: Path, name: str, host: str = "127.0.0.1") -> Tuple[str, str]:
    """A self-signed certificate (also usable as its own CA bundle) for ``host``; returns (cert, key) paths."""
    cert, key = directory / f"{name}.pem", directory / f"{name}.key"
    san = f"IP:{host}" if host[0].isdigit() else f"DNS:{host}"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                    "-nodes", "-keyout", str(key), "-out", str(cert), "-days", "2", "-subj", f"/CN={host}",
                    "-addext", f"subjectAltName={san}"], check=True, capture_output=True, timeout=30)
    return str(cert), str(key)


def make_ca(directory: Path, name: str) -> Tuple[str, str]:
    """A self-signed CA certificate (a fleet's own PKI) that signs leaves only; returns (cert, key) paths."""
    cert, key = directory / f"{name}.pem", directory / f"{name}.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                    "-nodes", "-keyout", str(key), "-out", str(cert), "-days", "2", "-subj", f"/CN={name}",
                    "-addext", "basicConstraints=critical,CA:TRUE,pathlen:0",
                    "-addext", "keyUsage=critical,keyCertSign,cRLSign"], check=True, capture_output=True, timeout=30)
    return str(cert), str(key)


def make_ca_signed_certificate(directory: Path, name: str, ca: Tuple[str, str],
                               host: str = "127.0.0.1") -> Tuple[str, str]:
    """A server certificate for ``host`` issued by ``ca`` (its (cert, key) paths); returns (cert, key) paths."""
    cert, key = directory / f"{name}.pem", directory / f"{name}.key"
    san = f"IP:{host}" if host[0].isdigit() else f"DNS:{host}"
    subprocess.run(["openssl", "req", "-x509", "-CA", ca[0], "-CAkey", ca[1], "-newkey", "ec",
                    "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", str(key), "-out", str(cert),
                    "-days", "2", "-subj", f"/CN={host}", "-addext", f"subjectAltName={san}",
                    "-addext", "basicConstraints=critical,CA:FALSE", "-addext", "extendedKeyUsage=serverAuth"],
                   check=True, capture_output=True, timeout=30)
    return str(cert), str(key)
