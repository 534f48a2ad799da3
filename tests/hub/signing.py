"""One real signing key for the hub's tests (gpg in a throwaway home, made once per test process) and the keys
directory a hub under test trusts: pushes carry real detached signatures, which the hub verifies with gpgv."""

from __future__ import annotations

import atexit
import shutil
import tempfile
import threading
from pathlib import Path
from typing import Dict, Optional

from agent.hub.bundles import SignatureCheck
from agent.hub.trust import gpgv_check
from tests.bundle.keys import Signer

_made: Optional[Signer] = None
_home: Optional[Path] = None
_lock = threading.Lock()
_signatures: Dict[bytes, bytes] = {}


def signer() -> Signer:
    """The process's hub signing key (made at the first call)."""
    with _lock:
        return _signer()


def _signer() -> Signer:
    global _made, _home
    if _made is None:
        _home = Path(tempfile.mkdtemp(prefix="gpuguard-hub-signer-"))
        atexit.register(shutil.rmtree, str(_home), True)
        _made = Signer(_home, "release")
        _made.export(_home / "keys" / "release.gpg")
    return _made


def keys_dir() -> str:
    """The directory holding only the signing key's keyring: what a hub under test trusts."""
    return str(signer().home.parent / "keys")


def signature_of(data: bytes) -> bytes:
    """A real detached signature of ``data`` by the signing key (one gpg at a time: each run ends its agent; the
    same bytes are signed once per process)."""
    with _lock:
        if data not in _signatures:
            with tempfile.TemporaryDirectory(prefix="gpuguard-sign-") as work:
                path = Path(work) / "bundle.json"
                path.write_bytes(data)
                _signatures[data] = _signer().sign(path).read_bytes()
        return _signatures[data]


def check() -> SignatureCheck:
    """The hub's own gpgv check against :func:`keys_dir`."""
    return gpgv_check(keys_dir())
