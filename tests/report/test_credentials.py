"""The token file and the CA bundle, checked before anything is sent (agent/report/credentials.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from agent.errors import ConfigError
from agent.report.credentials import check_ca_bundle, load_token, read_credentials
from agent.report.settings import ReportSettings

TOKEN = "test-token-0123456789"


def test_token_file_is_read_and_stripped(token_file: Path) -> None:
    """A 0600 file owned by us gives its one word."""
    assert load_token(str(token_file)) == TOKEN


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o660])
def test_token_file_open_to_group_or_others_is_refused(token_file: Path, mode: int) -> None:
    """Group- or world-accessible token files are a config error naming the mode and the fix."""
    os.chmod(token_file, mode)
    with pytest.raises(ConfigError) as caught:
        load_token(str(token_file))
    assert f"mode {mode:04o}" in str(caught.value) and "chmod 600" in str(caught.value)
    assert TOKEN not in str(caught.value)


def test_missing_or_empty_token_file_is_refused(tmp_path: Path) -> None:
    """Both are config errors that name the file."""
    with pytest.raises(ConfigError, match="does not exist"):
        load_token(str(tmp_path / "nope"))
    empty = tmp_path / "empty"
    empty.write_text("\n")
    os.chmod(empty, 0o600)
    with pytest.raises(ConfigError, match="empty"):
        load_token(str(empty))


def test_ca_bundle_must_be_a_readable_pem_file(tmp_path: Path, certificates) -> None:  # type: ignore[no-untyped-def]
    """A missing or non-PEM bundle is a config error at start, not a TLS failure at every delivery."""
    check_ca_bundle(certificates[0][0])
    check_ca_bundle(str(tmp_path))  # a c_rehash'ed directory
    with pytest.raises(ConfigError, match="cannot be read"):
        check_ca_bundle(str(tmp_path / "missing.pem"))
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate\n")
    with pytest.raises(ConfigError, match="no PEM certificate"):
        check_ca_bundle(str(junk))


def test_read_credentials_checks_the_bundle_and_reads_the_token(tmp_path: Path, token_file: Path,
                                                                certificates) -> None:  # type: ignore[no-untyped-def]
    """The token when a token file is set, None when none is; a bad CA bundle refuses before the token is read."""
    report = ReportSettings(endpoint_url="https://hub.example:8443", token_file=str(token_file),
                            ca_bundle=certificates[0][0])
    assert read_credentials(report) == TOKEN
    assert read_credentials(ReportSettings(endpoint_url="https://hub.example:8443", token_file=None)) is None
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate\n")
    with pytest.raises(ConfigError, match="no PEM certificate"):
        read_credentials(report.model_copy(update={"ca_bundle": str(junk)}))
