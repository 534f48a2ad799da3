"""The sender: POSTs event batches to the endpoint over HTTPS.

TLS verification is always on: against ``ca_bundle`` when set, else requests' default trust store. Every call has
a connect and a read timeout; redirects are not followed (they could carry the token elsewhere). The bearer token
comes from a file that only its owner (root or the agent's user) may read or write (agent/report/credentials.py); the
token is held by the Sender alone and never logged or put into an error message. requests' exceptions are mapped to
DeliveryError here. The resident daemon never imports this module: delivery runs in a job child (issue #17).
"""

from __future__ import annotations

from typing import List, Optional

import requests

from agent import __version__
from agent.errors import DeliveryError
from agent.models import FrozenModel
from agent.report.credentials import read_credentials
from agent.report.events import EventBatch
from agent.report.settings import ReportSettings

# How much of an error reply goes into a log line: enough to see what the receiver said.
_REPLY_EXCERPT_CHARS = 300
USER_AGENT = f"gpuguard-agent/{__version__}"


class DeliveryResult(FrozenModel):
    """What the receiver said about a batch: taken now, or already had (both mean: forget them)."""

    accepted: List[str] = []
    duplicates: List[str] = []

    @property
    def acknowledged(self) -> List[str]:
        return [*self.accepted, *self.duplicates]


def sender_for(report: ReportSettings) -> Optional["Sender"]:
    """The Sender for the configured endpoint (token read and checked now), or None without an endpoint."""
    if report.endpoint_url is None:
        return None
    return Sender(report, read_credentials(report))


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
        headers = {"Content-Type": "application/json", "User-Agent": USER_AGENT}
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
