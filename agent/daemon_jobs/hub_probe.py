"""The policy fetch's cheap first step: a stdlib-only child that asks the hub the same conditional questions as the
last full fetch and says whether anything could have changed (issue #45).

The full fetch (agent/daemon_jobs/policy_fetch.py, ``gpuguard _job policy_fetch``) costs 0.3 to 0.4 s of CPU to start
(requests, pydantic, gpgv); at the default 60 s interval that was about half of the daemon's idle CPU, spent almost
always on a 304 or on a hub that is down. The full child hands back a :class:`HubProbePlan` (the requests it made: the
root after the one trusted, the freshness statement, the verified stacks, the bundle with the ETag of the serial in
force; the CA file requests used; no plan where requests would go through a proxy). The resident then starts this
probe instead (``python -I -S``, http.client and ssl, nothing of gpuguard's but this module and agent/wire.py), which
GETs the same paths with the same token and answers one of

    down       the first request got no HTTP answer (refused, timed out, no route), or every answer was 502/503/504
    answered   every request got an HTTP answer: ``digest`` is SHA-256 over each path, status, the ETag, encoding and
               rollout headers and the body (bounded by ``max_bytes``)
    unsure     anything else (TLS refused, a token file that cannot be read, a body over the bound, a reset mid-way)

The probe only transports bytes: it parses and trusts nothing. The resident compares the digest with the one of the
probe that preceded the last successful full fetch; only ``answered`` with the same digest, or ``down``, skip the full
child (agent/daemon_jobs/children.py's PolicyFetchInChild says when it is forced anyway).
"""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import socket
import ssl
import stat
import time
import urllib.parse

from agent.wire import ROLLOUT_HEADER, ROLLOUT_ID_HEADER, ROLLOUT_STAGE_HEADER, ROLLOUT_STATE_HEADER

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs milliseconds of the lean child's start (issue #45)
    from typing import Dict, List, Optional, Sequence, Tuple

# HTTP statuses that say the hub (or the proxy in front of it) is not serving now: the full fetch would fail too.
DOWN_STATUSES = frozenset({502, 503, 504})
MAX_TOKEN_FILE_BYTES = 64 << 10
_CHUNK_BYTES = 64 * 1024
_TLS_CONTEXTS: Dict[Optional[str], ssl.SSLContext] = {}
# Headers whose values the full fetch reads (the ETag, the encoding it refuses, the rollout's notice and fields).
_KEPT_HEADERS = frozenset(name.lower() for name in ("ETag", "Content-Encoding", "Location", ROLLOUT_HEADER,
                                                     ROLLOUT_ID_HEADER, ROLLOUT_STATE_HEADER, ROLLOUT_STAGE_HEADER))


def answers_digest(answers: Sequence[Tuple[str, int, Sequence[Tuple[str, str]], bytes]]) -> str:
    """SHA-256 over each answer's path, status, kept headers (lower-cased names, sorted) and body; pure."""
    digest = hashlib.sha256()
    for path, status, headers, body in answers:
        kept = sorted((name.lower(), value) for name, value in headers
                      if name.lower() in _KEPT_HEADERS)
        digest.update(json.dumps([path, status, kept, len(body)]).encode("utf-8"))
        digest.update(b"\0")
        digest.update(body)
        digest.update(b"\0")
    return digest.hexdigest()


def _read_token(path: Optional[str]) -> Optional[str]:
    """The bearer token as the full fetch sends it (stripped); ValueError when the file cannot be used."""
    if not path:
        return None
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ValueError(f"{path}: not a regular file")
        data = os.read(fd, MAX_TOKEN_FILE_BYTES + 1)
    finally:
        os.close(fd)
    token = data.decode("utf-8").strip()
    if not token or len(data) > MAX_TOKEN_FILE_BYTES or any(ch.isspace() for ch in token):
        raise ValueError(f"{path}: not a single token")
    return token


def tls_context(ca_file: Optional[str]) -> ssl.SSLContext:
    """Verification as requests does it with ``verify=ca_file`` (a file or a c_rehash'ed directory; None: the system
    store). One per CA file in this child: loading a store costs about as much CPU as the child's start, and the
    probe's requests and the lean delivery's POSTs share it (agent/daemon_jobs/lean_child.py)."""
    context = _TLS_CONTEXTS.get(ca_file)
    if context is None:
        is_dir = bool(ca_file) and os.path.isdir(str(ca_file))
        context = ssl.create_default_context(cafile=None if is_dir else ca_file, capath=ca_file if is_dir else None)
        _TLS_CONTEXTS[ca_file] = context
    return context


def _connection(url: urllib.parse.SplitResult, cafile: Optional[str],
                connect_timeout_seconds: float) -> http.client.HTTPConnection:
    host, port = url.hostname or "", url.port
    if url.scheme == "https":
        return http.client.HTTPSConnection(host, port, timeout=connect_timeout_seconds, context=tls_context(cafile))
    if url.scheme == "http":
        return http.client.HTTPConnection(host, port, timeout=connect_timeout_seconds)
    raise ValueError(f"scheme {url.scheme!r}")


def probe(plan: Dict[str, object]) -> Dict[str, str]:
    """Ask every path of ``plan`` in order; ``{"outcome": down|answered|unsure, "digest", "detail"}``."""
    endpoint = str(plan["endpoint_url"]).rstrip("/")
    connect_timeout, read_timeout = float(plan["connect_timeout_seconds"]), float(plan["read_timeout_seconds"])  # type: ignore[arg-type]
    max_bytes = int(plan["max_bytes"])  # type: ignore[call-overload]
    deadline = time.monotonic() + float(plan["deadline_seconds"])  # type: ignore[arg-type]
    try:
        token = _read_token(plan.get("token_file"))  # type: ignore[arg-type]
    except (OSError, ValueError, UnicodeDecodeError) as exc:
        return {"outcome": "unsure", "digest": "", "detail": f"token file: {type(exc).__name__}"}
    answers: List[Tuple[str, int, Sequence[Tuple[str, str]], bytes]] = []
    paths = [(str(p), e if e is None else str(e)) for p, e in plan["paths"]]  # type: ignore[attr-defined]
    for index, (path, etag) in enumerate(paths):
        url = urllib.parse.urlsplit(endpoint + path)
        headers = {"Accept": "application/json", "Accept-Encoding": "identity"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        if etag is not None:
            headers["If-None-Match"] = etag
        connection = None
        try:
            connection = _connection(url, plan.get("ca_file"), connect_timeout)  # type: ignore[arg-type]
            connection.connect()
        except (ssl.SSLError, ssl.CertificateError, ValueError) as exc:
            return {"outcome": "unsure", "digest": "", "detail": f"{endpoint}: {type(exc).__name__}"}
        except OSError as exc:  # refused, timed out, no route, no such name
            if connection is not None:
                connection.close()
            outcome = "down" if index == 0 else "unsure"
            return {"outcome": outcome, "digest": "", "detail": f"{endpoint + path}: {type(exc).__name__}"}
        try:
            assert connection.sock is not None
            connection.sock.settimeout(read_timeout)
            target = url.path + (f"?{url.query}" if url.query else "")
            connection.request("GET", target, headers=headers)
            reply = connection.getresponse()
            body = bytearray()
            while len(body) <= max_bytes and time.monotonic() < deadline:
                chunk = reply.read(_CHUNK_BYTES)
                if not chunk:
                    break
                body += chunk
            if len(body) > max_bytes or time.monotonic() >= deadline:
                return {"outcome": "unsure", "digest": "", "detail": f"{endpoint + path}: answer too long"}
            answers.append((path, reply.status, reply.getheaders(), bytes(body)))
        except (OSError, http.client.HTTPException) as exc:
            return {"outcome": "unsure", "digest": "", "detail": f"{endpoint + path}: {type(exc).__name__}"}
        finally:
            connection.close()
    if answers and all(status in DOWN_STATUSES for _, status, _, _ in answers):
        return {"outcome": "down", "digest": "", "detail": f"{endpoint}: HTTP {answers[0][1]}"}
    return {"outcome": "answered", "digest": answers_digest(answers), "detail": ""}


def probe_answer(plan: object) -> Dict[str, str]:
    """:func:`probe`, with a plan this module cannot read (or a socket timeout) answered ``unsure``: the full fetch
    decides. Run in the lean child (agent/daemon_jobs/lean_child.py)."""
    try:
        if not isinstance(plan, dict):
            raise TypeError("the plan is not an object")
        return probe(plan)
    except (KeyError, TypeError, ValueError) as exc:
        return {"outcome": "unsure", "digest": "", "detail": f"plan: {type(exc).__name__}"}
    except socket.timeout:
        return {"outcome": "unsure", "digest": "", "detail": "timed out"}
