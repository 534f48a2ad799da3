"""The hub's verified stacks for this host's ``[workloads]`` rule: ``GET /v1/workloads/verified`` with the host
token, checked as the hook will read it (agent/hostfacts/verified_stacks.py: strict JSON, unique keys, the bounds
of agent/wire.py), then written atomically to ``workloads-verified.json`` in the state directory.

The daemon's policy fetch calls :func:`refresh_verified` when the policy in force has a ``[workloads]`` section. A
failed fetch (the hub unreachable, an older hub without the path, an answer that is not the list) keeps the cached
list: a pass on a stack is never taken back, so a stale list refuses at worst a stack verified since. At most
``MAX_VERIFIED_BYTES`` are read (uncompressed: ``Accept-Encoding: identity``, a compressed answer is refused).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Optional, Tuple

from agent.printable import printable
from agent.wire import MAX_VERIFIED_BYTES, VERIFIED_STACKS_PATH

if TYPE_CHECKING:  # pragma: no cover
    import requests

_CHUNK_BYTES = 64 * 1024


def refresh_verified(endpoint_url: str, token: Optional[str], ca_bundle: Optional[str],
                     timeout_seconds: Tuple[float, float], path: str,
                     session: Optional["requests.Session"] = None) -> Tuple[bool, str]:
    """Fetch the list and write it to ``path``: (True, how many workloads) or (False, why, the cached list kept);
    never raises for what the hub or the network does."""
    import requests
    import urllib3

    from agent.errors import InputFileError
    from agent.files import write_atomically
    from agent.hostfacts.verified_stacks import parse_verified_stacks
    from agent.strictjson import parse_json_text

    url = endpoint_url.rstrip("/") + VERIFIED_STACKS_PATH
    headers = {"Accept": "application/json", "Accept-Encoding": "identity"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    http = session or requests.Session()
    try:
        with http.get(url, headers=headers, timeout=timeout_seconds, verify=ca_bundle or True,
                      allow_redirects=False, stream=True) as reply:
            if reply.status_code != 200:
                return False, f"{url}: HTTP {reply.status_code}"
            encoding = reply.headers.get("Content-Encoding", "identity").strip().lower()
            if encoding not in ("", "identity"):
                return False, f"{url}: a {printable(encoding)[:40]}-encoded answer (asked for none)"
            received = bytearray()
            while len(received) <= MAX_VERIFIED_BYTES:
                chunk = reply.raw.read(_CHUNK_BYTES, decode_content=False)
                if not chunk:
                    break
                received += chunk
    except (requests.RequestException, urllib3.exceptions.HTTPError, OSError) as exc:
        return False, f"{url}: {type(exc).__name__}"
    finally:
        if session is None:
            http.close()
    if len(received) > MAX_VERIFIED_BYTES:
        return False, f"{url}: more than {MAX_VERIFIED_BYTES} bytes"
    try:
        data = parse_json_text(url, bytes(received).decode("utf-8"), unique_keys=True)
        listing = parse_verified_stacks(data)
    except UnicodeDecodeError:
        return False, f"{url}: not UTF-8"
    except (InputFileError, ValueError) as exc:
        return False, f"{url}: {exc}"
    try:
        write_atomically(path, json.dumps(data, sort_keys=True, ensure_ascii=False) + "\n")
    except OSError as exc:
        return False, f"{path}: {exc.strerror or exc}"
    return True, f"{len(listing.workloads)} workload(s)"
