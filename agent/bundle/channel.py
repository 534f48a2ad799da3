"""Trust through the channel: at each policy fetch, under a trusted root, walk the hub's newer roots one version at
a time, take its freshness statement and its deny list (agent/bundle/root.py, freshness.py, deny.py).

``GET ROOT_PATH?version=N`` answers ``{"root": b64, "signature": b64}`` (204: the hub has no such version) and
``GET FRESHNESS_PATH`` ``{"statement": b64, "signature": b64}`` (204: the hub signs none), ``GET DENY_PATH``
``{"deny": b64, "signature": b64}`` (204: the hub has none). Each answer is bounded in
bytes and in time from the connect to the last byte; whatever fails (the hub, the network, a refused root or
statement) changes nothing trusted and is returned as one line for the fetch's result (a refused root or statement
is never kept; the policy in force keeps guarding). Without a trusted root nothing is asked.
"""

from __future__ import annotations

import base64
import binascii
import tempfile
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable, List, Optional, Tuple, TypeVar

from agent.bundle.deny import MAX_DENY_BYTES
from agent.bundle.freshness import MAX_STATEMENT_BYTES, check_statement, newest_for
from agent.bundle.roles import MAX_ROOT_BYTES, MAX_SIGNATURES_BYTES
from agent.bundle.root import MAX_ROOT_ROTATIONS, RootStore
from agent.errors import BundleRefused, GpuguardError
from agent.wire import DENY_PATH, FRESHNESS_PATH, ROOT_PATH

if TYPE_CHECKING:  # pragma: no cover
    from agent.bundle.install import BundleInstaller
    from agent.bundle.scope import ScopeFacts

# From the connect to the last byte, for one root or statement.
CHANNEL_DEADLINE_SECONDS = 60.0
_CHUNK_BYTES = 64 * 1024


class _Unanswered(Exception):  # noqa: N818 - internal, never leaves this module
    """One answer of the hub could not be had or read (internal: turned into the fetch's one-line detail)."""


def bounded_get(url: str, token: Optional[str], ca_bundle: Optional[str], timeout_seconds: Tuple[float, float],
                max_bytes: int, deadline_seconds: float = CHANNEL_DEADLINE_SECONDS) -> Tuple[int, bytes]:
    """The status and body of one GET, the body at most ``max_bytes`` and the whole within ``deadline_seconds``;
    _Unanswered otherwise."""
    answers: List[Tuple[int, bytes]] = []
    failures: List[str] = []
    cancelled = threading.Event()
    deadline = time.monotonic() + deadline_seconds

    def ask() -> None:
        import requests
        import urllib3

        headers = {"Accept": "application/json", "Accept-Encoding": "identity"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        try:
            with requests.get(url, headers=headers, timeout=timeout_seconds, verify=ca_bundle or True,
                              allow_redirects=False, stream=True) as reply:
                received = bytearray()
                while len(received) <= max_bytes and not cancelled.is_set() and time.monotonic() < deadline:
                    chunk = reply.raw.read(_CHUNK_BYTES, decode_content=False)
                    if not chunk:
                        answers.append((reply.status_code, bytes(received)))
                        return
                    received += chunk
                failures.append("larger than allowed" if len(received) > max_bytes else "did not end in time")
        except (requests.RequestException, urllib3.exceptions.HTTPError, OSError) as exc:
            failures.append(type(exc).__name__)

    worker = threading.Thread(target=ask, name="policy-channel", daemon=True)
    worker.start()
    worker.join(deadline_seconds)
    cancelled.set()
    if not answers:
        raise _Unanswered(f"{url}: {failures[0] if failures else f'no answer within {deadline_seconds:g} s'}")
    return answers[0]


def _pair(url: str, body: bytes, names: Tuple[str, str], max_bytes: int) -> Tuple[bytes, bytes]:
    """The two base64 fields of a 200 answer; _Unanswered with one line otherwise."""
    from agent.strictjson import parse_json_text

    try:
        value = parse_json_text(url, body.decode("utf-8"), unique_keys=True)
    except (GpuguardError, UnicodeDecodeError):
        raise _Unanswered(f"{url}: not JSON") from None
    if not isinstance(value, dict):
        raise _Unanswered(f"{url}: not a JSON object")
    decoded = []
    for name, limit in zip(names, (max_bytes, MAX_SIGNATURES_BYTES)):
        text = value.get(name)
        try:
            data = base64.b64decode(text if isinstance(text, str) else "?", validate=True)
        except (binascii.Error, ValueError):
            raise _Unanswered(f"{url}: {name}: not base64") from None
        if len(data) > limit:
            raise _Unanswered(f"{url}: {name}: larger than {limit} bytes")
        decoded.append(data)
    return decoded[0], decoded[1]


def refresh_trust(installer: "BundleInstaller", endpoint_url: str, token: Optional[str], ca_bundle: Optional[str],
                  timeout_seconds: Tuple[float, float], facts: Callable[[], "ScopeFacts"]) -> Optional[str]:
    """Walk the hub's newer roots, take its freshness statement, then its deny list (asked even when the statement
    failed: a known-bad version waits for nothing); None when all went well, else the problems in one line. Never
    raises for what the hub, the network or the files it serves do."""
    base = endpoint_url.rstrip("/")
    problems: List[str] = []
    root = _guarded(base, problems, lambda: RootStore(installer.host, installer.paths.state_dir,
                                                      installer.guard.keys_dir).trusted(base))
    if root is None:
        return "; ".join(problems) or None

    def signed(url: str, name: str, max_bytes: int) -> Optional[Tuple[bytes, bytes]]:
        """The document (field ``name``) and its signatures the hub answers at ``url`` with a 200; None for its
        204 (nothing to serve); _Unanswered for any other status or answer."""
        status, body = bounded_get(url, token, ca_bundle, timeout_seconds, 2 * max_bytes)
        if status == 204:
            return None
        if status != 200:
            raise _Unanswered(f"{url}: HTTP {status}")
        return _pair(url, body, (name, "signature"), max_bytes)

    def walk_and_fresh() -> None:
        nonlocal root
        assert root is not None
        for _ in range(MAX_ROOT_ROTATIONS):
            url = f"{base}{ROOT_PATH}?version={root.version + 1}"
            served = signed(url, "root", MAX_ROOT_BYTES)
            if served is None:
                break
            root = installer.walk_roots([served], url)
        url = base + FRESHNESS_PATH
        served = signed(url, "statement", MAX_STATEMENT_BYTES)
        if served is None:
            return
        data, signature = served
        state = installer.state()
        with tempfile.TemporaryDirectory(prefix="gpuguard-freshness-") as work:
            statement = check_statement(installer.host, root, data, signature, installer.host.clock(),
                                        state.freshness_issued_at, Path(work), url)
        installer.record_freshness(statement, newest_for(statement, facts()))

    def deny() -> None:
        # The known-bad versions, at every fetch and whatever a rollout holds back (agent/bundle/deny.py).
        assert root is not None
        url = base + DENY_PATH
        served = signed(url, "deny", MAX_DENY_BYTES)
        if served is not None:
            installer.take_deny(root, served[0], served[1], url)

    _guarded(base, problems, walk_and_fresh)
    _guarded(base, problems, deny)
    return "; ".join(problems) or None


_T = TypeVar("_T")


def _guarded(base: str, problems: List[str], step: Callable[[], _T]) -> Optional[_T]:
    """``step()``, or None with its problem appended in one line."""
    try:
        return step()
    except _Unanswered as exc:
        problems.append(str(exc))
    except BundleRefused as exc:
        problems.append(f"{exc} [{exc.kind}]" if exc.kind else str(exc))
    except (GpuguardError, OSError) as exc:
        problems.append(f"{base}: {exc}")
    return None
