"""Ask the hub for the newest policy bundle in this host's scope: ``GET /v1/policy/bundle`` with the host token.

``If-None-Match`` carries the ETag of the serial in force (``"bundle-N"``), so an unchanged bundle costs a 304.
200 is ``{"serial": N, "bundle": b64, "signature": b64}``, 204 means none is in scope. During a staged rollout every
answer (200, 204, 304) carries the hub's notice (header ``X-Gpuguard-Rollout``, on 200 also the field ``rollout``),
kept as ``Offer.notice`` (agent/bundle/rollout.py; None: no rollout concerns this host). Every other outcome (the hub
unreachable, a refusal, a malformed answer) is a failed fetch: logged, and nothing changes on the host (the policy
in force keeps guarding; the next interval asks again). :func:`parse_offer` is pure.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional, Tuple

from agent.bundle.format import MAX_BUNDLE_BYTES
from agent.bundle.rollout import clean_notice

if TYPE_CHECKING:  # pragma: no cover
    import requests

BUNDLE_PATH = "/v1/policy/bundle"
ROLLOUT_HEADER = "X-Gpuguard-Rollout"
MAX_SIGNATURE_BYTES = 64 * 1024
# base64 of the largest bundle and signature, and the JSON around them.
MAX_OFFER_BYTES = (MAX_BUNDLE_BYTES + MAX_SIGNATURE_BYTES) * 4 // 3 + 4096


@dataclass(frozen=True)
class Offer:
    """What the hub answered: ``status`` unchanged (304), none (204), offered (200) or failed (with ``detail``)."""

    status: str
    serial: Optional[int] = None
    bundle: bytes = b""
    signature: bytes = b""
    detail: str = ""
    notice: Optional[str] = None


def etag_for(serial: Optional[int]) -> Optional[str]:
    """The ETag the hub gives the bundle with ``serial`` (None: no bundle in force, nothing to match)."""
    return None if serial is None else f'"bundle-{serial}"'


def parse_offer(body: bytes) -> Tuple[int, bytes, bytes]:
    """The serial, bundle and signature bytes of a 200 answer; ValueError with one line otherwise."""
    serial, bundle, signature, _ = parse_offer_with_notice(body)
    return serial, bundle, signature


def parse_offer_with_notice(body: bytes) -> Tuple[int, bytes, bytes, Optional[str]]:
    """:func:`parse_offer` and the rollout notice of the body (``rollout``: a string, or null/absent: None)."""
    from agent.strictjson import parse_json_text

    if len(body) > MAX_OFFER_BYTES:
        raise ValueError(f"answer of {len(body)} bytes is larger than {MAX_OFFER_BYTES}")
    try:
        value = parse_json_text("answer", body.decode("utf-8"))
    except Exception as exc:  # noqa: BLE001 - InputFileError or UnicodeDecodeError: one line either way
        raise ValueError(f"not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise ValueError("not a JSON object")
    serial = value.get("serial")
    if not isinstance(serial, int) or isinstance(serial, bool) or serial < 1:
        raise ValueError("serial: not a whole number >= 1")
    decoded = []
    for name in ("bundle", "signature"):
        text = value.get(name)
        if not isinstance(text, str):
            raise ValueError(f"{name}: not a string")
        try:
            decoded.append(base64.b64decode(text, validate=True))
        except (binascii.Error, ValueError):
            raise ValueError(f"{name}: not base64") from None
    notice = value.get("rollout")
    if notice is not None and not isinstance(notice, str):
        raise ValueError("rollout: not a string")
    return serial, decoded[0], decoded[1], clean_notice(notice)


def fetch_offer(endpoint_url: str, token: Optional[str], ca_bundle: Optional[str], serial_in_force: Optional[int],
                timeout_seconds: Tuple[float, float], session: Optional["requests.Session"] = None) -> Offer:
    """One conditional GET of the hub's offer for this host; never raises for what the hub or network does."""
    import requests

    url = endpoint_url.rstrip("/") + BUNDLE_PATH
    headers = {"Accept": "application/json"}
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
            if reply.status_code == 304:
                return Offer("unchanged", serial_in_force, notice=notice)
            if reply.status_code == 204:
                return Offer("none", notice=notice)
            if reply.status_code != 200:
                return Offer("failed", detail=f"{url}: HTTP {reply.status_code}")
            body = reply.raw.read(MAX_OFFER_BYTES + 1, decode_content=True)
    except requests.RequestException as exc:
        return Offer("failed", detail=f"{url}: {type(exc).__name__}")
    finally:
        if session is None:
            http.close()
    try:
        serial, bundle, signature, body_notice = parse_offer_with_notice(body)
    except ValueError as exc:
        return Offer("failed", detail=f"{url}: {exc}")
    if len(signature) > MAX_SIGNATURE_BYTES:
        return Offer("failed", detail=f"{url}: signature larger than {MAX_SIGNATURE_BYTES} bytes")
    return Offer("offered", serial, bundle, signature, notice=body_notice or notice)
