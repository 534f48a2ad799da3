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
MAX_TOKEN_FILE_BYTES = 64 << 10  # agent/report/credentials.py's (tests/daemon/test_lean_token.py holds them equal)
_CHUNK_BYTES = 64 * 1024
_TLS_CONTEXTS: Dict[Tuple[Optional[str], Optional[str]], ssl.SSLContext] = {}
_TRUSTS: Dict[Tuple[object, ...], Trust] = {}
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


class TokenRefused(ValueError):
    """A token file the full children would refuse (agent/report/credentials.py's ``load_token``): the full child
    decides, and says why in its own words."""


def read_token(path: Optional[str]) -> Optional[str]:
    """The bearer token as agent/report/credentials.py's ``load_token`` reads it, with its checks: a regular file
    (a link to one is followed) of root or this user, closed to group and others, at most MAX_TOKEN_FILE_BYTES of
    UTF-8, one word once stripped; TokenRefused naming the problem where it would refuse it. The lean child's one
    reader: the policy probe's and the lean delivery's (agent/daemon_jobs/lean_delivery.py)."""
    if not path:
        return None
    try:
        info = os.stat(path)
        if not stat.S_ISREG(info.st_mode) or stat.S_IMODE(info.st_mode) & 0o077 \
                or info.st_uid not in (0, os.geteuid()):
            raise TokenRefused("token file: not a regular file of root or this user, closed to group and others")
        # O_NONBLOCK: a FIFO put there since the stat never blocks the read (as agent/files.py's readers)
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise TokenRefused("token file: not a regular file")
            data = b""
            while len(data) <= MAX_TOKEN_FILE_BYTES:
                chunk = os.read(fd, MAX_TOKEN_FILE_BYTES + 1 - len(data))
                if not chunk:
                    break
                data += chunk
        finally:
            os.close(fd)
        token = data.decode("utf-8").strip()
    except OSError as exc:
        raise TokenRefused(f"token file: {type(exc).__name__}") from None
    except UnicodeDecodeError:
        raise TokenRefused("token file: not UTF-8") from None
    if len(data) > MAX_TOKEN_FILE_BYTES:
        raise TokenRefused(f"token file: over {MAX_TOKEN_FILE_BYTES} bytes")
    if not token or any(ch.isspace() for ch in token):
        raise TokenRefused("token file: not a single token")
    return token


def tls_context(cafile: Optional[str], capath: Optional[str] = None) -> ssl.SSLContext:
    """Verification as requests does it with ``verify=cafile`` (a file or a c_rehash'ed directory; None: the system
    store), or through the hashed directory ``capath`` alone. One per trust in this child: loading a public-sized
    file costs about as much CPU as the child's start, and the probe's requests and the lean delivery's POSTs share
    it (agent/daemon_jobs/lean_child.py)."""
    key = (cafile, capath)
    context = _TLS_CONTEXTS.get(key)
    if context is None:
        if capath is None and cafile and os.path.isdir(cafile):
            cafile, capath = None, cafile
        context = ssl.create_default_context(cafile=cafile, capath=capath)
        _TLS_CONTEXTS[key] = context
    return context


class Trust:
    """What a plan's HTTPS connections verify with: the CA file's hashed directory (agent/report/tls_anchors.py)
    while the file's stat is the stamp the plan carries (it holds only the file's certificates, and OpenSSL reads
    only the ones a verification needs), else the whole file. A verification that fails through the directory is
    tried once more with the whole file (a damaged or pruned directory costs only that); ``fallback`` says so."""

    __slots__ = ("ca_file", "anchor_dir", "fallback")

    def __init__(self, ca_file: Optional[str], anchor_dir: Optional[str]) -> None:
        self.ca_file = ca_file
        self.anchor_dir = anchor_dir
        self.fallback = ""

    def context(self) -> ssl.SSLContext:
        """The context to connect with now; OSError or ssl.SSLError when it cannot be loaded."""
        return tls_context(None, self.anchor_dir) if self.anchor_dir else tls_context(self.ca_file)

    def fall_back(self, exc: ssl.SSLCertVerificationError) -> bool:
        """After a verification failure: True when the next try uses the whole file (only once, from the dir)."""
        if self.anchor_dir is None:
            return False
        self.fallback = (f"the CA file's anchor directory {self.anchor_dir} did not verify "
                         f"({exc.verify_message}): the whole CA file was loaded")
        self.anchor_dir = None
        return True


def trust_for(plan: Dict[str, object]) -> Trust:
    """The plan's :class:`Trust`, one per CA file, directory and stamp in this child (one stat of the file)."""
    ca_file, anchor_dir, stamp = plan.get("ca_file"), plan.get("ca_anchor_dir"), plan.get("ca_file_stamp")
    key: Tuple[object, ...] = (ca_file, anchor_dir, None if stamp is None else tuple(stamp))  # type: ignore[arg-type]
    trust = _TRUSTS.get(key)
    if trust is None:
        usable = None
        if ca_file and anchor_dir and stamp is not None:
            try:
                info = os.stat(str(ca_file))
                if [info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns] == list(stamp):  # type: ignore[call-overload]
                    usable = str(anchor_dir)
            except OSError:
                pass  # the file's own load says what is wrong with it
        trust = _TRUSTS[key] = Trust(None if ca_file is None else str(ca_file), usable)
    return trust


def connect_https(host: str, port: Optional[int], timeout_seconds: float,
                  trust: Trust) -> http.client.HTTPSConnection:
    """A connected HTTPSConnection; a verification failure through the anchor directory tried once more with the
    whole CA file. Raises what ``connect`` raises, the connection closed."""
    connection = http.client.HTTPSConnection(host, port, timeout=timeout_seconds, context=trust.context())
    try:
        try:
            connection.connect()
        except ssl.SSLCertVerificationError as exc:
            connection.close()
            if not trust.fall_back(exc):
                raise
            try:
                context = trust.context()
            except ssl.SSLError:
                raise
            except OSError as load:  # the file stat'ed a moment ago went away: a TLS failure, not a hub down
                raise ssl.SSLError(f"CA file: {type(load).__name__}") from None
            connection = http.client.HTTPSConnection(host, port, timeout=timeout_seconds, context=context)
            connection.connect()
    except BaseException:
        connection.close()
        raise
    return connection


def _connect(url: urllib.parse.SplitResult, trust: Optional[Trust],
             connect_timeout_seconds: float) -> http.client.HTTPConnection:
    host, port = url.hostname or "", url.port
    if url.scheme == "https" and trust is not None:
        return connect_https(host, port, connect_timeout_seconds, trust)
    if url.scheme == "http":
        connection = http.client.HTTPConnection(host, port, timeout=connect_timeout_seconds)
        try:
            connection.connect()
        except BaseException:
            connection.close()
            raise
        return connection
    raise ValueError(f"scheme {url.scheme!r}")


def probe(plan: Dict[str, object]) -> Dict[str, str]:
    """Ask every path of ``plan`` in order; ``{"outcome": down|answered|unsure, "digest", "detail", "trust"}``."""
    endpoint = str(plan["endpoint_url"]).rstrip("/")
    connect_timeout, read_timeout = float(plan["connect_timeout_seconds"]), float(plan["read_timeout_seconds"])  # type: ignore[arg-type]
    max_bytes = int(plan["max_bytes"])  # type: ignore[call-overload]
    deadline = time.monotonic() + float(plan["deadline_seconds"])  # type: ignore[arg-type]
    try:
        token = read_token(plan.get("token_file"))  # type: ignore[arg-type]
    except TokenRefused as exc:
        return {"outcome": "unsure", "digest": "", "detail": str(exc), "trust": ""}
    trust = trust_for(plan) if endpoint.startswith("https:") else None
    answers: List[Tuple[str, int, Sequence[Tuple[str, str]], bytes]] = []
    paths = [(str(p), e if e is None else str(e)) for p, e in plan["paths"]]  # type: ignore[attr-defined]
    for index, (path, etag) in enumerate(paths):
        url = urllib.parse.urlsplit(endpoint + path)
        headers = {"Accept": "application/json", "Accept-Encoding": "identity"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        if etag is not None:
            headers["If-None-Match"] = etag
        try:
            connection = _connect(url, trust, connect_timeout)
        except (ssl.SSLError, ssl.CertificateError, ValueError) as exc:
            return _answer(trust, "unsure", detail=f"{endpoint}: {type(exc).__name__}")
        except OSError as exc:  # refused, timed out, no route, no such name
            outcome = "down" if index == 0 else "unsure"
            return _answer(trust, outcome, detail=f"{endpoint + path}: {type(exc).__name__}")
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
                return _answer(trust, "unsure", detail=f"{endpoint + path}: answer too long")
            answers.append((path, reply.status, reply.getheaders(), bytes(body)))
        except (OSError, http.client.HTTPException) as exc:
            return _answer(trust, "unsure", detail=f"{endpoint + path}: {type(exc).__name__}")
        finally:
            connection.close()
    if answers and all(status in DOWN_STATUSES for _, status, _, _ in answers):
        return _answer(trust, "down", detail=f"{endpoint}: HTTP {answers[0][1]}")
    return _answer(trust, "answered", digest=answers_digest(answers))


def _answer(trust: Optional[Trust], outcome: str, digest: str = "", detail: str = "") -> Dict[str, str]:
    """The probe's answer, with ``trust``: why the anchor directory was given up for the whole CA file ("": it
    was not), which the daemon logs."""
    return {"outcome": outcome, "digest": digest, "detail": detail, "trust": "" if trust is None else trust.fallback}


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
