"""The lean child's one token reader (agent/daemon_jobs/hub_probe.py ``read_token``, used by the policy probe and
the lean delivery): it takes exactly the token files the full children's agent/report/credentials.py takes, with the
same token, and refuses the rest; the probe and the delivery answer ``unsure`` for a file it refuses."""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Callable, Dict, Optional

import pytest

from agent.daemon_jobs.hub_probe import MAX_TOKEN_FILE_BYTES, TokenRefused, probe, read_token
from agent.daemon_jobs.lean_delivery import deliver
from agent.errors import ConfigError
from agent.report.credentials import MAX_TOKEN_FILE_BYTES as FULL_CHILD_MAX_TOKEN_FILE_BYTES
from agent.report.credentials import load_token


def _write(path: Path, data: bytes, mode: int = 0o600) -> None:
    path.write_bytes(data)
    os.chmod(path, mode)


def _symlink_to_good(path: Path) -> None:
    _write(path.with_name("target"), b"tok-123\n")
    path.symlink_to(path.with_name("target"))


# Token files, each made at ``path``: the ones both readers take and the ones both refuse.
FILES: Dict[str, Callable[[Path], None]] = {
    "good": lambda p: _write(p, b"tok-123\n"),
    "good_padded": lambda p: _write(p, b"  \n tok-123 \t\n\n"),
    "good_owner_read_only": lambda p: _write(p, b"tok-123", 0o400),
    "symlink_to_good": _symlink_to_good,
    "group_readable": lambda p: _write(p, b"tok-123\n", 0o640),
    "world_readable": lambda p: _write(p, b"tok-123\n", 0o644),
    "empty": lambda p: _write(p, b""),
    "only_whitespace": lambda p: _write(p, b" \n\t\n"),
    "two_words": lambda p: _write(p, b"tok 123\n"),
    "two_lines": lambda p: _write(p, b"tok\n123\n"),
    "not_utf8": lambda p: _write(p, b"tok-\xff\n"),
    "over_the_bound": lambda p: _write(p, b"t" * (MAX_TOKEN_FILE_BYTES + 1)),
    "a_fifo": lambda p: os.mkfifo(p, 0o600),
    "a_directory": lambda p: p.mkdir(mode=0o700),
    "missing": lambda p: None,
}


def full_child(path: str) -> Optional[str]:
    """What the full children's reader makes of the file (None: refused)."""
    try:
        return load_token(path)
    except ConfigError:
        return None


def lean_child(path: str) -> Optional[str]:
    """What the lean child's reader makes of it (None: refused)."""
    try:
        return read_token(path)
    except TokenRefused:
        return None


def test_the_bound_is_the_full_childs() -> None:
    """The lean reader reads no more than the full children do."""
    assert MAX_TOKEN_FILE_BYTES == FULL_CHILD_MAX_TOKEN_FILE_BYTES


@pytest.mark.parametrize("case", sorted(FILES))
def test_the_lean_reader_takes_what_the_full_child_takes(tmp_path: Path, case: str) -> None:
    """Each file is taken by both readers with the same token, or refused by both (within bounded time: a FIFO
    never blocks)."""
    path = tmp_path / "token"
    FILES[case](path)
    expected = full_child(str(path))
    assert (expected is not None) == case.startswith(("good", "symlink_to_good")), expected
    assert lean_child(str(path)) == expected


def test_no_token_file_is_no_token() -> None:
    """No token file configured: no Authorization header, in both."""
    assert read_token(None) is None and read_token("") is None


def closed_port() -> int:
    """A port on 127.0.0.1 that nothing listens on (bound, then closed)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_the_probe_and_the_delivery_are_unsure_for_a_group_readable_token(tmp_path: Path) -> None:
    """A token file the full child would refuse (mode 0640) makes both parts ``unsure`` before any request (the
    endpoint is a closed port: ``down`` would mean they tried); the probe's own reader took it before."""
    token = tmp_path / "token"
    _write(token, b"tok-123\n", 0o640)
    port = closed_port()
    plan = {"endpoint_url": f"http://127.0.0.1:{port}", "token_file": str(token), "ca_file": None,
            "connect_timeout_seconds": 5, "read_timeout_seconds": 5, "deadline_seconds": 30, "max_bytes": 1024,
            "paths": [["/v1/policy/bundle", None]]}
    assert probe(plan)["outcome"] == "unsure"
    request = {"plan": {"ingest_url": f"http://127.0.0.1:{port}/v1/events", "token_file": str(token), "ca_file": None,
                        "connect_timeout_seconds": 5, "read_timeout_seconds": 5, "batch_size": 5,
                        "user_agent": "t", "schema_version": 1, "outbox_path": str(tmp_path / "outbox.sqlite3")},
               "host_id": "h"}
    answer = deliver(request, environ={})
    assert answer["outcome"] == "unsure" and "token file" in str(answer["detail"]), answer
