"""Delivery without the full child: a stdlib-only child that sends the outbox's pending batches as the full one does
and marks what the receiver acknowledged (issue #45).

The full delivery child (``gpuguard _job deliver``: requests, pydantic) costs about 0.3 s of CPU to start, and at
the default intervals it ran after every heartbeat: most of the daemon's idle CPU. The full child hands back a
:class:`~agent.daemon_jobs.protocol.DeliveryPlan` (the ingest URL, token file, the CA file requests verified with,
timeouts, batch size, User-Agent; none where requests would use a proxy or a .netrc); the resident then starts this
child (``python -I -S``: sqlite3, json, http.client, ssl, and of gpuguard's only this module, the policy probe's
(its bounds), agent/files.py with its stdlib leaves and agent/report/outbox_ack.py), which drains the outbox in
sequence order, ``batch_size`` events a POST with the same headers and token, the stored event bodies as they are
(the same ids, sequences and fields), and answers one of

    delivered  the outbox is empty: every batch was acknowledged (accepted or duplicate) and marked delivered
    down       no HTTP answer (refused, timed out, no route, reset), or 502/503/504: the events stay queued and the
               daemon backs off as after the full child's failure
    unsure     anything else: a proxy in the environment, a token file or CA file it cannot use, TLS refused, an
               event of another host id or that is not an event, another status, an acknowledgement it cannot
               parse strictly or that leaves some of the batch unacknowledged: the full child decides

A batch leaves the outbox only for the ids the receiver's acknowledgement names (agent/report/outbox_ack.py, the
Outbox's own SQL, in one transaction), so a SIGTERM or SIGKILL at any point loses nothing: what was not marked is
sent again, and the receiver answers it as a duplicate. Before each batch the child checks that the daemon that
started it is still its parent (the full child's PR_SET_PDEATHSIG, without ctypes): an orphan sends nothing more;
SIGTERM (the daemon stopping) lets the batch in flight finish and be marked, as in the full child.
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import sqlite3
import ssl
import time
import urllib.parse

from agent.daemon_jobs.hub_probe import DOWN_STATUSES, TokenRefused, Trust, connect_https, read_token, trust_for
from agent.errors import InputFileError
from agent.files import read_json_file, write_atomically
from agent.report.outbox_ack import (
    HWM_SUFFIX,
    ack_rows,
    high_water_of,
    high_water_text,
    next_high_water,
)
from agent.strictjson import parse_json_text

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs milliseconds of the lean child's start (issue #45)
    from typing import Dict, List, Optional, Sequence, Tuple

    Result = Dict[str, object]

# The largest acknowledgement read: 500 ids of at most 64 characters each, quoted, with room to spare.
MAX_ACK_BYTES = 256 << 10
_ACK_FIELDS = frozenset({"accepted", "duplicates"})
# Variables that make requests send through a proxy (any case); the lean child never does.
_PROXY_VARIABLES = ("http_proxy", "https_proxy", "all_proxy")

# Batches listed in the result for the daemon's log (a drain of a full outbox, one event a batch, lists the first).
MAX_BATCHES_LISTED = 1000

# Set by SIGTERM: as the full child's ``stopping``, the batch in flight is finished (sent and marked) and no other.
_STOPPING: List[int] = []


class Unsure(Exception):
    """Something this child does not decide: the full child does."""


class Down(Exception):
    """No HTTP answer, or 502/503/504: the events stay queued, the daemon backs off."""

    def __init__(self, category: str, reason: str, status_code: Optional[int] = None) -> None:
        super().__init__(reason)
        self.category = category
        self.reason = reason
        self.status_code = status_code


def parse_acknowledgement(body: bytes) -> Tuple[List[str], List[str]]:
    """``(accepted, duplicates)`` from the receiver's 200 answer: a JSON object with only those fields, each a list
    of strings, no key twice, UTF-8, at most MAX_ACK_BYTES; Unsure for anything else. Pure."""
    if len(body) > MAX_ACK_BYTES:
        raise Unsure("acknowledgement over its bound")
    try:
        data = parse_json_text("acknowledgement", body.decode("utf-8"), max_depth=2, unique_keys=True)
    except (UnicodeDecodeError, InputFileError) as exc:
        raise Unsure(f"acknowledgement is not strict JSON ({type(exc).__name__})") from None
    if not isinstance(data, dict) or not set(data) <= _ACK_FIELDS:
        raise Unsure("acknowledgement is not {accepted, duplicates}")
    lists = []
    for name in ("accepted", "duplicates"):
        value = data.get(name, [])
        if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
            raise Unsure(f"acknowledgement: {name} is not a list of event ids")
        lists.append(value)
    return lists[0], lists[1]


def batch_body(schema_version: int, bodies: Sequence[str]) -> bytes:
    """The POST body: an EventBatch of the stored event bodies as they are, in their order; pure."""
    return (f'{{"schema_version":{schema_version},"events":[' + ",".join(bodies) + "]}").encode("utf-8")


def checked_bodies(rows: Sequence[Tuple[int, str, str]], host_id: str) -> List[str]:
    """The rows' bodies when each is an event object of this host with its row's id and sequence; Unsure else
    (the full child validates it, rewrites an old host id or parks what is unreadable). Pure."""
    bodies = []
    for sequence, event_id, body in rows:
        try:
            event = json.loads(body)
        except ValueError:
            raise Unsure(f"outbox sequence {sequence}: not JSON") from None
        if not isinstance(event, dict) or event.get("event_id") != event_id or event.get("sequence") != sequence \
                or event.get("host_id") != host_id:
            raise Unsure(f"outbox sequence {sequence}: another id, sequence or host id")
        bodies.append(body)
    return bodies


class Poster:
    """POSTs batches to the plan's URL over one connection at a time (as requests does: no redirects followed)."""

    def __init__(self, plan: Dict[str, object], token: Optional[str]) -> None:
        self.url = str(plan["ingest_url"])
        self._parts = urllib.parse.urlsplit(self.url)
        if self._parts.scheme not in ("http", "https") or not self._parts.hostname:
            raise Unsure(f"ingest URL scheme {self._parts.scheme!r}")
        self._connect_timeout = float(plan["connect_timeout_seconds"])  # type: ignore[arg-type]
        self._read_timeout = float(plan["read_timeout_seconds"])  # type: ignore[arg-type]
        self.trust: Optional[Trust] = None
        if self._parts.scheme == "https":
            self.trust = trust_for(plan)
            try:
                self.trust.context()
            except (OSError, ssl.SSLError) as exc:
                raise Unsure(f"CA file: {type(exc).__name__}") from None
        self._headers = {"Content-Type": "application/json", "User-Agent": str(plan["user_agent"]),
                         "Accept": "application/json", "Accept-Encoding": "identity"}
        if token:
            self._headers["Authorization"] = f"Bearer {token}"

    def post(self, body: bytes) -> Tuple[List[str], List[str]]:
        """One batch; its acknowledgement, or Down / Unsure."""
        host, port = self._parts.hostname or "", self._parts.port
        connection: http.client.HTTPConnection
        try:
            if self.trust is not None:
                connection = connect_https(host, port, self._connect_timeout, self.trust)
            else:
                connection = http.client.HTTPConnection(host, port, timeout=self._connect_timeout)
                connection.connect()
        except (ssl.SSLError, ssl.CertificateError) as exc:
            raise Unsure(f"TLS: {type(exc).__name__}") from None
        except socket.timeout:
            raise Down("timeout", "connect timed out") from None
        except OSError as exc:  # refused, no route, no such name
            raise Down("unreachable", f"{type(exc).__name__}: {exc.strerror or exc}") from None
        try:
            assert connection.sock is not None
            connection.sock.settimeout(self._read_timeout)
            target = self._parts.path + (f"?{self._parts.query}" if self._parts.query else "")
            try:
                connection.request("POST", target, body=body, headers=self._headers)
                reply = connection.getresponse()
                status = reply.status
                encoding = (reply.getheader("Content-Encoding") or "identity").strip().lower()
                answer = reply.read(MAX_ACK_BYTES + 1)
            except socket.timeout:
                raise Down("timeout", "no answer within the read timeout") from None
            except ssl.SSLError as exc:
                raise Unsure(f"TLS: {type(exc).__name__}") from None
            except (OSError, http.client.HTTPException) as exc:  # reset, closed without an answer
                raise Down("unreachable", f"{type(exc).__name__}") from None
        finally:
            connection.close()
        if status in DOWN_STATUSES:
            raise Down("server", f"HTTP {status}", status)
        if status != 200:
            raise Unsure(f"HTTP {status}")
        if encoding != "identity":
            raise Unsure(f"acknowledgement in {encoding!r} encoding")
        return parse_acknowledgement(answer)


def _mark(conn: sqlite3.Connection, outbox_path: str, event_ids: Sequence[str]) -> None:
    """Move acknowledged events to ``delivered`` (one transaction) and rewrite the high-water mark as the Outbox
    does; Unsure when the mark cannot be read (the full child logs it)."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        ack_rows(conn, event_ids)
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")
    try:
        mark = high_water_of(read_json_file(outbox_path + HWM_SUFFIX))
    except InputFileError as exc:
        raise Unsure(f"high-water mark: {exc.reason}") from None
    try:
        write_atomically(outbox_path + HWM_SUFFIX, high_water_text(next_high_water(conn, mark.reserved_through)),
                         mode=0o600)
    except OSError as exc:
        raise Unsure(f"high-water mark: {type(exc).__name__}") from None


def _drained(acknowledged_at: Optional[float], failure: Optional[Down] = None, batch_events: int = 0,
             url: str = "") -> Result:
    """agent.daemon_jobs.delivery.Drained as JSON."""
    return {"acknowledged_at_seconds": acknowledged_at, "failed_batch_events": batch_events,
            "failure": None if failure is None else {"url": url, "category": failure.category,
                                                     "reason": failure.reason, "status_code": failure.status_code}}


def deliver(request: Dict[str, object], environ: Optional[Dict[str, str]] = None) -> Result:
    """Drain the outbox as the plan says; ``{"outcome": delivered|down|unsure, "drained", "detail", "trust"}``
    (``trust``: why the CA file's anchor directory was given up for the whole file, "" when it was not)."""
    posters: List[Poster] = []
    result = _deliver(request, environ, posters)
    trust = posters[0].trust if posters else None
    result["trust"] = "" if trust is None else trust.fallback
    return result


def _deliver(request: Dict[str, object], environ: Optional[Dict[str, str]], posters: List[Poster]) -> Result:
    plan = request["plan"]
    assert isinstance(plan, dict)
    host_id = str(request["host_id"])
    daemon_pid = request.get("daemon_pid")
    env = os.environ if environ is None else environ
    acknowledged_at: Optional[float] = None
    if any(env.get(name) or env.get(name.upper()) for name in _PROXY_VARIABLES):
        return {"outcome": "unsure", "drained": _drained(None), "detail": "a proxy in the environment"}
    batch_size = int(plan["batch_size"])
    outbox_path = str(plan["outbox_path"])
    conn: Optional[sqlite3.Connection] = None
    batches: List[Dict[str, int]] = []
    try:
        try:
            token = read_token(plan.get("token_file"))
        except TokenRefused as exc:
            raise Unsure(str(exc)) from None
        poster = Poster(plan, token)
        posters.append(poster)
        # mode=rw: an outbox that is not there is never created here (the daemon creates it).
        conn = sqlite3.connect(f"file:{urllib.parse.quote(outbox_path)}?mode=rw", uri=True, isolation_level=None,
                               timeout=30.0)
        while True:
            if daemon_pid is not None and os.getppid() != daemon_pid:  # orphaned: never drain beside the next daemon
                raise Unsure("the daemon that started this child is gone")
            if _STOPPING:
                raise Unsure("stopped by SIGTERM")
            rows = conn.execute("SELECT sequence, event_id, body FROM events ORDER BY sequence LIMIT ?",
                                (batch_size,)).fetchall()
            if not rows:
                return {"outcome": "delivered", "drained": _drained(acknowledged_at), "detail": "", "batches": batches}
            try:
                accepted, duplicates = poster.post(batch_body(int(plan["schema_version"]),
                                                              checked_bodies(rows, host_id)))
            except Down as down:
                return {"outcome": "down", "drained": _drained(acknowledged_at, down, len(rows), poster.url),
                        "detail": down.reason, "batches": batches}
            sent = [row[1] for row in rows]
            acknowledged = set(accepted) | set(duplicates)
            marked = [event_id for event_id in sent if event_id in acknowledged]
            if marked:
                _mark(conn, outbox_path, marked)
                acknowledged_at = time.time()
                if len(batches) < MAX_BATCHES_LISTED:
                    batches.append({"events": len(rows), "accepted": len(set(accepted) & set(sent)),
                                    "duplicates": len(set(duplicates) & set(sent)), "first_sequence": rows[0][0],
                                    "last_sequence": rows[-1][0]})
            if len(marked) != len(sent):
                raise Unsure(f"acknowledged {len(marked)} of the batch's {len(sent)} events")
    except Unsure as exc:
        return {"outcome": "unsure", "drained": _drained(acknowledged_at), "detail": str(exc), "batches": batches}
    except sqlite3.Error as exc:
        return {"outcome": "unsure", "drained": _drained(acknowledged_at), "detail": f"outbox: {exc}",
                "batches": batches}
    finally:
        if conn is not None:
            conn.close()


def stop_after_this_batch(signum: int, frame: object) -> None:
    """SIGTERM (the daemon stopping): the batch in flight is finished and marked, no other is sent."""
    _STOPPING.append(signum)


def delivery_answer(request: object) -> Result:
    """:func:`deliver`, with a request this module cannot read answered ``unsure``: the full child decides. Run in
    the lean child (agent/daemon_jobs/lean_child.py), which sets :func:`stop_after_this_batch` for SIGTERM."""
    try:
        if not isinstance(request, dict):
            raise TypeError("the request is not an object")
        return deliver(request)
    except (KeyError, TypeError, ValueError, AssertionError) as exc:
        return {"outcome": "unsure", "drained": _drained(None), "detail": f"request: {type(exc).__name__}"}
