"""A real HTTP webhook receiver on 127.0.0.1 for the alert tests: down (the port refuses), answering 500, hanging,
or up (204), as the test scripts it; it records every request it got."""

from __future__ import annotations

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Dict, List, Optional


class Receiver:
    """Reserve a port at once (refusing connections: "down"); ``up()`` starts answering on it."""

    def __init__(self) -> None:
        self._reserved = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._reserved.bind(("127.0.0.1", 0))  # bound, never listening: connections are refused
        self.port = self._reserved.getsockname()[1]
        self.requests: List[Dict[str, Any]] = []
        self.script: List[str] = []  # what to do with the next requests: "500", "hang", then "ok" once empty
        self.hang_seconds = 5.0
        self._server: Optional[ThreadingHTTPServer] = None
        self._lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    def up(self, script: Optional[List[str]] = None) -> None:
        self.script = list(script or [])
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                with receiver._lock:
                    action = receiver.script.pop(0) if receiver.script else "ok"
                    receiver.requests.append({"path": self.path, "action": action, "body": json.loads(body),
                                              "delivery": self.headers.get("X-Gpuguard-Delivery"),
                                              "at": time.monotonic()})
                if action == "hang":
                    time.sleep(receiver.hang_seconds)
                    return
                self.send_response(500 if action == "500" else 204)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self._reserved.close()
        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, name="webhook-receiver", daemon=True).start()

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        self._reserved.close()

    def delivered(self, path: str = "/hook") -> List[Dict[str, Any]]:
        """Requests answered 204 on ``path``."""
        with self._lock:
            return [r for r in self.requests if r["action"] == "ok" and r["path"] == path]
