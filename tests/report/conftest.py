"""Fixtures for report tests: a running receiver, certificates, a token file."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterator, Tuple

import pytest

from tests.report.receiver import Receiver, make_certificate


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver().start()
    yield r
    r.stop()


@pytest.fixture(scope="session")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> Tuple[Tuple[str, str], Tuple[str, str]]:
    """(cert, key) for 127.0.0.1, and (cert, key) for another host name (a name mismatch at 127.0.0.1)."""
    directory = tmp_path_factory.mktemp("tls")
    return make_certificate(directory, "localhost-ip"), make_certificate(directory, "elsewhere", "elsewhere.invalid")


@pytest.fixture
def token_file(tmp_path: Path) -> Path:
    path = tmp_path / "token"
    path.write_text("test-token-0123456789\n")
    os.chmod(path, 0o600)
    return path
