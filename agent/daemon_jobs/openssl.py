"""The resident daemon without OpenSSL: ``ssl`` and hashlib's OpenSSL backend kept out of ``gpuguard run``.

The resident sends nothing (delivery's sending runs in a job child, which loads requests and OpenSSL itself) and
hashes only guard-event lines into event ids, which CPython's built-in SHA-256 does. Left alone, asyncio (imported
by structlog) would load ``ssl`` and pydantic (through secrets and hmac) hashlib's ``_hashlib``:
libssl and libcrypto, 4.6 MiB of the resident's RSS, about a ninth (issue #17). A long-running process that never
maps them also needs no restart after an OpenSSL update (needrestart flags processes that keep a replaced library
mapped); each job child loads the library current at its start.

Where CPython's built-in SHA-256 is missing or refused (a FIPS build that allows only OpenSSL's), hashlib gets its
OpenSSL backend back and only ``ssl`` stays out. Nothing else in the resident needs either: asyncio, http.client and
hmac run without them, as on a Python built without OpenSSL.
"""

from __future__ import annotations

import sys

# A module set to None in sys.modules cannot be imported (ImportError), which every user of these handles.
KEPT_OUT = ("ssl", "_ssl", "_hashlib")
# sha256(b"gpuguard"): the built-in implementation must give it.
_CHECK_DIGEST = "5fa437a634f6a2dbf0ef4ce4706eec1e6bb20ba68d50e32bad79a56f7bc9f0f5"


def keep_openssl_out() -> bool:
    """Make ``ssl`` and ``_hashlib`` unimportable in this process; True when both are out.

    Call first thing in the resident, before anything imports them; where one is loaded already it stays, and so
    does the other."""
    if any(sys.modules.get(name) is not None for name in (*KEPT_OUT, "hashlib")):
        return False
    for name in KEPT_OUT:
        sys.modules[name] = None  # type: ignore[assignment]
    if _builtin_sha256_works():
        return True
    del sys.modules["_hashlib"]
    sys.modules.pop("hashlib", None)  # imported without its backend: import it again with it
    return False


def _builtin_sha256_works() -> bool:
    try:
        import hashlib

        return hashlib.sha256(b"gpuguard").hexdigest() == _CHECK_DIGEST
    except (AttributeError, ImportError, ValueError):
        return False
