"""The report endpoint's credentials: the bearer token file and the CA bundle, checked without loading requests.

The resident daemon checks them at start and on every reload (a bad file refuses the start, or keeps the old
configuration), and each delivery child reads them again before it sends (agent/report/sender.py).
"""

from __future__ import annotations

import os
import stat
from typing import Optional

from agent.errors import ConfigError, InputFileError
from agent.files import decode_text, read_bytes_bounded
from agent.report.settings import ReportSettings

MAX_TOKEN_FILE_BYTES = 64 << 10  # a token is a few dozen bytes


def read_credentials(report: ReportSettings) -> Optional[str]:
    """Check the CA bundle (when set) and read the token (when set); ConfigError names the file and the problem."""
    if report.ca_bundle:
        check_ca_bundle(report.ca_bundle)
    return load_token(report.token_file) if report.token_file else None


def load_token(path: str) -> str:
    """Read the bearer token; ConfigError when the file is missing, empty, or open to group/others."""
    try:
        info = os.stat(path)
    except FileNotFoundError:
        raise ConfigError(path, ["token file does not exist"]) from None
    except OSError as exc:
        raise ConfigError(path, [f"token file cannot be read: {exc.strerror or exc}"]) from None
    problems = []
    mode = stat.S_IMODE(info.st_mode)
    if not stat.S_ISREG(info.st_mode):
        problems.append("token file is not a regular file")
    if mode & 0o077:
        problems.append(f"token file is accessible by group or others (mode {mode:04o}); "
                        f"run: chmod 600 {path}")
    if info.st_uid not in (0, os.geteuid()):
        problems.append(f"token file is owned by uid {info.st_uid}, not by root or the agent's user")
    if problems:
        raise ConfigError(path, problems)
    try:  # opened so that a FIFO swapped in after the stat never blocks (agent/files.py)
        token = decode_text(path, read_bytes_bounded(path, MAX_TOKEN_FILE_BYTES)).strip()
    except InputFileError as exc:
        raise ConfigError(path, [f"token file cannot be read: {exc.reason}"]) from None
    if not token:
        raise ConfigError(path, ["token file is empty"])
    if any(ch.isspace() for ch in token):
        raise ConfigError(path, ["token file holds more than one word; it must hold just the token"])
    return token


def check_ca_bundle(path: str) -> None:
    """ConfigError when the configured CA bundle (a PEM file, or a c_rehash'ed directory) cannot be used."""
    if os.path.isdir(path):
        return
    try:  # a FIFO or a device in its place is refused at once, not waited on or read without end
        head = read_bytes_bounded(path)[:65536]
    except InputFileError as exc:
        raise ConfigError(path, [f"ca_bundle cannot be read: {exc.reason}"]) from None
    if b"-----BEGIN CERTIFICATE-----" not in head:
        raise ConfigError(path, ["ca_bundle holds no PEM certificate"])
