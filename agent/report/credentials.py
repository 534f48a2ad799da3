"""The report endpoint's credentials: the bearer token file and the CA bundle, checked without loading requests.

The resident daemon checks them at start and on every reload (a bad file refuses the start, or keeps the old
configuration), and each delivery child reads them again before it sends (agent/report/sender.py).
"""

from __future__ import annotations

import os
import stat
from typing import Optional

from agent.errors import ConfigError
from agent.report.settings import ReportSettings


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
    try:
        with open(path, encoding="utf-8") as handle:
            token = handle.read().strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(path, [f"token file cannot be read: {exc}"]) from None
    if not token:
        raise ConfigError(path, ["token file is empty"])
    if any(ch.isspace() for ch in token):
        raise ConfigError(path, ["token file holds more than one word; it must hold just the token"])
    return token


def check_ca_bundle(path: str) -> None:
    """ConfigError when the configured CA bundle (a PEM file, or a c_rehash'ed directory) cannot be used."""
    if os.path.isdir(path):
        return
    try:
        with open(path, "rb") as handle:
            head = handle.read(65536)
    except OSError as exc:
        raise ConfigError(path, [f"ca_bundle cannot be read: {exc.strerror or exc}"]) from None
    if b"-----BEGIN CERTIFICATE-----" not in head:
        raise ConfigError(path, ["ca_bundle holds no PEM certificate"])
