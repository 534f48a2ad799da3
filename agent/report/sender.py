"""The sender: POSTs event batches to the endpoint over HTTPS, and the backoff used between failed tries.

TLS verification is always on: against ``ca_bundle`` when set, else requests' default trust store. Every call has
a connect and a read timeout; redirects are not followed (they could carry the token elsewhere). The bearer token
comes from a file that only its owner (root or the agent's user) may read or write; the token is held by the
Sender alone and never logged or put into an error message. requests' exceptions are mapped to DeliveryError here.
"""

from __future__ import annotations

import os
import random
import stat
from typing import List, Optional

import requests

from agent import __version__
from agent.errors import ConfigError, DeliveryError
from agent.models import FrozenModel
from agent.report.events import EventBatch
from agent.report.settings import ReportSettings

# How much of an error reply goes into a log line: enough to see what the receiver said.
_REPLY_EXCERPT_CHARS = 300


class DeliveryResult(FrozenModel):
    """What the receiver said about a batch: taken now, or already had (both mean: forget them)."""

    accepted: List[str] = []
    duplicates: List[str] = []

    @property
    def acknowledged(self) -> List[str]:
        return [*self.accepted, *self.duplicates]


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


class Backoff:
    """Exponential backoff with full jitter: a delay drawn uniformly from 0 to min(cap, base * 2**failures)."""

    def __init__(self, base_seconds: float, cap_seconds: float, rng: Optional[random.Random] = None) -> None:
        self.base_seconds = base_seconds
        self.cap_seconds = cap_seconds
        self.failures = 0
        self._rng = rng or random.Random()

    def next_delay_seconds(self) -> float:
        """Count one more failure and return how long to wait before the next try."""
        ceiling = min(self.cap_seconds, self.base_seconds * (2.0 ** min(self.failures, 60)))
        self.failures += 1
        return self._rng.uniform(0.0, ceiling)

    def reset(self) -> None:
        self.failures = 0


class Sender:
    """POSTs EventBatch JSON to ``<endpoint_url>/v1/events`` and maps every outcome to a result or DeliveryError."""

    def __init__(self, settings: ReportSettings, token: Optional[str],
                 session: Optional[requests.Session] = None) -> None:
        if settings.ingest_url is None:
            raise ValueError("Sender needs report.endpoint_url")
        self.url = settings.ingest_url
        self._verify = settings.ca_bundle if settings.ca_bundle else True
        self._timeout = (settings.connect_timeout_seconds, settings.read_timeout_seconds)
        self._token = token
        self._session = session or requests.Session()

    def __repr__(self) -> str:
        return f"Sender(url={self.url!r})"

    def close(self) -> None:
        self._session.close()

    def send(self, batch: EventBatch) -> DeliveryResult:
        """Deliver one batch; DeliveryError says why it was not taken and whether retrying can help."""
        headers = {"Content-Type": "application/json", "User-Agent": f"gpuguard-agent/{__version__}"}
        if self._token:
            headers["Authorization"] = f"Bearer {self._token}"
        body = batch.model_dump_json().encode("utf-8")
        try:
            reply = self._session.post(self.url, data=body, headers=headers, timeout=self._timeout,
                                       verify=self._verify, allow_redirects=False)
        except requests.exceptions.SSLError as exc:
            raise DeliveryError(self.url, "tls", _first_line(exc)) from None
        except requests.exceptions.Timeout as exc:
            raise DeliveryError(self.url, "timeout", _first_line(exc)) from None
        except requests.exceptions.ConnectionError as exc:
            raise DeliveryError(self.url, "unreachable", _first_line(exc)) from None
        except requests.exceptions.RequestException as exc:
            raise DeliveryError(self.url, "endpoint", _first_line(exc)) from None
        return self._interpret(reply)

    def _interpret(self, reply: requests.Response) -> DeliveryResult:
        code = reply.status_code
        if code == 200:
            try:
                return DeliveryResult.model_validate_json(reply.content)
            except ValueError:
                raise DeliveryError(self.url, "endpoint", "200 reply is not {accepted, duplicates} JSON",
                                    code) from None
        excerpt = " ".join(reply.text[:_REPLY_EXCERPT_CHARS].split())
        if code == 413:
            raise DeliveryError(self.url, "too_large", f"HTTP 413 {excerpt}", code)
        if code in (400, 422):
            raise DeliveryError(self.url, "rejected", f"HTTP {code} {excerpt}", code)
        if code in (401, 403):
            raise DeliveryError(self.url, "auth", f"HTTP {code} (check the token file and the hub's host "
                                                  f"registration) {excerpt}", code)
        if code == 429 or code >= 500:
            raise DeliveryError(self.url, "server", f"HTTP {code} {excerpt}", code)
        raise DeliveryError(self.url, "endpoint", f"HTTP {code} {excerpt}", code)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:500]
