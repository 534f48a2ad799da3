"""Ask the hub for the newest policy bundle in this host's scope: ``GET /v1/policy/bundle`` with the host token.

``If-None-Match`` carries the ETag of the serial in force (``"bundle-N"``), so an unchanged bundle costs a 304.
200 is ``{"serial": N, "bundle": b64, "signature": b64}``, 204 means none is in scope. During a staged rollout every
answer (200, 204, 304) carries the rollout's typed fields (``rollout_id``, ``state``, ``admitted_stage``: headers,
and on 200 JSON fields; agent/wire.py), kept as ``FetchOutcome.rollout`` (agent/bundle/rollout_fields.py,
checked strictly: malformed in the body refuses the answer, in the headers is ignored), and the hub's notice,
display text only (header ``X-Gpuguard-Rollout``, field ``rollout``), kept as ``FetchOutcome.notice``. Every other
outcome (the hub
unreachable, a refusal, a malformed answer) is a failed fetch: logged, and nothing changes on the host (the policy
in force keeps guarding; the next interval asks again). :func:`parse_offer` is pure.

The whole exchange is bounded: at most :data:`MAX_OFFER_BYTES` read (uncompressed: ``Accept-Encoding: identity``,
and a compressed answer is refused, so no small answer inflates in memory), and at most ``deadline_seconds`` from
the connect to the last byte (the request runs on a worker thread; the connect and read timeouts alone bound each
socket read, so a hub trickling a byte a second could hold the fetch for days).
"""

from __future__ import annotations

import base64
import binascii
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, List, Optional, Tuple

from agent.bundle.format import MAX_BUNDLE_BYTES, MAX_SERIAL
from agent.bundle.rollout import clean_notice
from agent.bundle.rollout_fields import RolloutFields, read_rollout_fields, rollout_fields_of_headers
from agent.printable import printable
from agent.wire import (
    BUNDLE_PATH,
    MAX_SIGNATURE_BYTES,
    OFFER_NOTICE_FIELD,
    OFFER_ROLLOUT_ID_FIELD,
    OFFER_STAGE_FIELD,
    OFFER_STATE_FIELD,
    ROLLOUT_HEADER,
    etag_of,
)

if TYPE_CHECKING:  # pragma: no cover
    import requests

# base64 of the largest bundle and signature, and the JSON around them.
MAX_OFFER_BYTES = (MAX_BUNDLE_BYTES + MAX_SIGNATURE_BYTES) * 4 // 3 + 4096
# From the connect to the last byte: the largest answer at 48 KiB/s.
FETCH_DEADLINE_SECONDS = 120.0
_CHUNK_BYTES = 64 * 1024


@dataclass(frozen=True)
class FetchOutcome:
    """What the hub answered: ``status`` unchanged (304), none (204), offered (200) or failed (with ``detail``)."""

    status: str
    serial: Optional[int] = None
    bundle: bytes = b""
    signature: bytes = b""
    detail: str = ""
    notice: Optional[str] = None  # display text only
    rollout: Optional[RolloutFields] = None  # what decides (None: no rollout concerns this host)


def etag_for(serial: Optional[int]) -> Optional[str]:
    """The ETag the hub gives the bundle with ``serial`` (None: no bundle in force, nothing to match)."""
    return None if serial is None else etag_of(serial)


def parse_offer(body: bytes) -> Tuple[int, bytes, bytes]:
    """The serial, bundle and signature bytes of a 200 answer; ValueError with one line otherwise."""
    serial, bundle, signature, _, _ = parse_offer_with_rollout(body)
    return serial, bundle, signature


def parse_offer_with_rollout(body: bytes) -> Tuple[int, bytes, bytes, Optional[str], Optional[RolloutFields]]:
    """:func:`parse_offer`, the rollout notice of the body (``rollout``: a string, or null/absent: None) and its
    rollout fields (``rollout_id``, ``state``, ``admitted_stage``; ValueError for a malformed one)."""
    from agent.strictjson import parse_json_text

    if len(body) > MAX_OFFER_BYTES:
        raise ValueError(f"answer of {len(body)} bytes is larger than {MAX_OFFER_BYTES}")
    try:
        value = parse_json_text("answer", body.decode("utf-8"), unique_keys=True)
    except Exception as exc:  # noqa: BLE001 - InputFileError or UnicodeDecodeError: one line either way
        raise ValueError(f"not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise ValueError("not a JSON object")
    serial = value.get("serial")
    if not isinstance(serial, int) or isinstance(serial, bool) or not 1 <= serial <= MAX_SERIAL:
        raise ValueError(f"serial: not a whole number in 1..{MAX_SERIAL}")
    decoded = []
    for name in ("bundle", "signature"):
        text = value.get(name)
        if not isinstance(text, str):
            raise ValueError(f"{name}: not a string")
        try:
            decoded.append(base64.b64decode(text, validate=True))
        except (binascii.Error, ValueError):
            raise ValueError(f"{name}: not base64") from None
    notice = value.get(OFFER_NOTICE_FIELD)
    if notice is not None and not isinstance(notice, str):
        raise ValueError(f"{OFFER_NOTICE_FIELD}: not a string")
    fields = read_rollout_fields(value.get(OFFER_ROLLOUT_ID_FIELD), value.get(OFFER_STATE_FIELD),
                                 value.get(OFFER_STAGE_FIELD))
    return serial, decoded[0], decoded[1], clean_notice(notice), fields


def fetch_offer(endpoint_url: str, token: Optional[str], ca_bundle: Optional[str], serial_in_force: Optional[int],
                timeout_seconds: Tuple[float, float], session: Optional["requests.Session"] = None,
                deadline_seconds: float = FETCH_DEADLINE_SECONDS) -> FetchOutcome:
    """One conditional GET of the hub's offer for this host, over within ``deadline_seconds``; never raises for what
    the hub or network does."""
    url = endpoint_url.rstrip("/") + BUNDLE_PATH
    answers: List[FetchOutcome] = []
    cancelled = threading.Event()

    def ask() -> None:
        answers.append(_fetch(url, token, ca_bundle, serial_in_force, timeout_seconds, session, cancelled,
                              time.monotonic() + deadline_seconds))

    # A daemon thread: one the hub still holds after the deadline ends with the job child that started it.
    worker = threading.Thread(target=ask, name="policy-fetch", daemon=True)
    worker.start()
    worker.join(deadline_seconds)
    cancelled.set()
    if not answers:
        return FetchOutcome("failed", detail=f"{url}: no complete answer within {deadline_seconds:g} s")
    return answers[0]


def _fetch(url: str, token: Optional[str], ca_bundle: Optional[str], serial_in_force: Optional[int],
           timeout_seconds: Tuple[float, float], session: Optional["requests.Session"], cancelled: threading.Event,
           deadline: float) -> FetchOutcome:
    import requests
    import urllib3

    headers = {"Accept": "application/json", "Accept-Encoding": "identity"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    etag = etag_for(serial_in_force)
    if etag is not None:
        headers["If-None-Match"] = etag
    http = session or requests.Session()
    try:
        with http.get(url, headers=headers, timeout=timeout_seconds, verify=ca_bundle or True,
                      allow_redirects=False, stream=True) as reply:
            notice = clean_notice(reply.headers.get(ROLLOUT_HEADER))
            rollout = rollout_fields_of_headers(reply.headers)
            if reply.status_code == 304:
                return FetchOutcome("unchanged", serial_in_force, notice=notice, rollout=rollout)
            if reply.status_code == 204:
                return FetchOutcome("none", notice=notice, rollout=rollout)
            if reply.status_code != 200:
                return FetchOutcome("failed", detail=f"{url}: HTTP {reply.status_code}")
            encoding = reply.headers.get("Content-Encoding", "identity").strip().lower()
            if encoding not in ("", "identity"):
                return FetchOutcome("failed",
                                    detail=f"{url}: a {printable(encoding)[:40]}-encoded answer (asked for none)")
            received = bytearray()
            while len(received) <= MAX_OFFER_BYTES and not cancelled.is_set() and time.monotonic() < deadline:
                chunk = reply.raw.read(_CHUNK_BYTES, decode_content=False)
                if not chunk:
                    break
                received += chunk
            body = bytes(received)
    except (requests.RequestException, urllib3.exceptions.HTTPError, OSError) as exc:
        # urllib3's own errors (a body cut short, a read timeout) come through reply.raw unwrapped.
        return FetchOutcome("failed", detail=f"{url}: {type(exc).__name__}")
    finally:
        if session is None:
            http.close()
    if cancelled.is_set() or time.monotonic() >= deadline:
        return FetchOutcome("failed", detail=f"{url}: the answer did not end in time")
    try:
        serial, bundle, signature, body_notice, body_rollout = parse_offer_with_rollout(body)
    except ValueError as exc:
        return FetchOutcome("failed", detail=f"{url}: {exc}")
    if len(signature) > MAX_SIGNATURE_BYTES:
        return FetchOutcome("failed", detail=f"{url}: signature larger than {MAX_SIGNATURE_BYTES} bytes")
    return FetchOutcome("offered", serial, bundle, signature, notice=body_notice or notice,
                        rollout=body_rollout or rollout)
