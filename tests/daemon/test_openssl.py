"""The resident keeps OpenSSL out (agent/daemon_jobs/openssl.py): no libssl or libcrypto mapped, SHA-256 still works.

Each check runs in a fresh interpreter: making modules unimportable is for the process's whole life.
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.conftest import run_fresh_python
from tests.daemon.conftest import AgentProcess, agent_config
from tests.report.receiver import Receiver

_OPENSSL_LIBS = ("libssl.so", "libcrypto.so")

_PROBE = """
import json, sys
{before}
from agent.daemon_jobs.openssl import keep_openssl_out
out = keep_openssl_out()
import asyncio, hashlib, hmac, secrets, http.client, pydantic, structlog
from apscheduler.schedulers.background import BackgroundScheduler
try:
    import ssl
    ssl_importable = True
except ImportError:
    ssl_importable = False
maps = open("/proc/self/maps").read()
print(json.dumps({{"out": out, "ssl_importable": ssl_importable,
                  "sha256": hashlib.sha256(b"gpuguard-guard-event").hexdigest(),
                  "hmac": hmac.new(b"k", b"m", "sha256").hexdigest(),
                  "mapped": sorted({{lib for lib in {libs!r} if lib in maps}})}}))
"""


def _probe(before: str = "") -> dict:
    return json.loads(run_fresh_python(_PROBE.format(before=before, libs=_OPENSSL_LIBS)).strip().splitlines()[-1])


def test_the_resident_maps_no_openssl_and_hashes_with_the_builtin_sha256() -> None:
    """After keep_openssl_out, what the resident imports loads neither library; SHA-256 and HMAC give the digests
    OpenSSL would."""
    seen = _probe()
    assert seen["out"] is True and seen["ssl_importable"] is False and seen["mapped"] == []
    assert seen["sha256"] == "33a3b32804c4eff0222f409c23b3daf444d4ee47e347e329b35e80fdf7f343e4"
    assert seen["hmac"] == "b60090e3052297aeb5a080889ce2fc4bca957e756faeb4df7d31800ca1e771ec"


def test_without_a_builtin_sha256_hashlib_keeps_openssl_and_only_ssl_stays_out() -> None:
    """A FIPS-style Python whose built-in SHA-256 is missing: hashlib gets its OpenSSL backend back."""
    seen = _probe('sys.modules["_sha256"] = None; sys.modules["_sha2"] = None')
    assert seen["out"] is False and seen["ssl_importable"] is False
    assert seen["sha256"] == "33a3b32804c4eff0222f409c23b3daf444d4ee47e347e329b35e80fdf7f343e4"
    assert "libcrypto.so" in seen["mapped"]


def test_too_late_changes_nothing() -> None:
    """Where hashlib is loaded already, nothing is made unimportable (ssl still imports)."""
    seen = _probe("import hashlib")
    assert seen["out"] is False and seen["ssl_importable"] is True


def test_gpuguard_run_keeps_openssl_out_and_still_delivers_over_tls(agent: AgentProcess, token_file: Path,
                                                                   certificates) -> None:  # type: ignore[no-untyped-def]
    """The real ``gpuguard run``: no OpenSSL library mapped in the resident while its delivery children send over
    HTTPS to a receiver with a private CA."""
    receiver = Receiver(tls=certificates[0]).start()
    try:
        agent.write_config(agent_config(agent.state_dir, receiver.url, token_file, ca_bundle=certificates[0][0]))
        agent.start()
        assert receiver.wait_for(lambda r: len(r.stored) >= 3), "nothing arrived over HTTPS"
        assert agent.proc is not None
        maps = Path(f"/proc/{agent.proc.pid}/maps").read_text()
        assert [lib for lib in _OPENSSL_LIBS if lib in maps] == []
        assert agent.terminate() == 0
    finally:
        receiver.stop()
