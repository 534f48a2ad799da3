"""The hub's policy API as an operator's command calls it: push, list, show and withdraw policy bundles, start and
steer staged rollouts, and how their answers print.

Every call sends the admin's (or, to read, a reader's) bearer token; TLS is verified against ``ca_bundle`` when
set, else requests' default trust store. Whatever goes wrong is one HubClientError line: the hub's own refusal
(``HTTP 409 serial_not_newer: serial 5 is not above 5, ...``), or why it could not be reached. The token is never
in a message or a log.
"""

from __future__ import annotations

import base64
from typing import Any, Dict, Mapping, Optional, Sequence

import requests

from agent import __version__
from agent.errors import HubError, UsageError
from agent.hub.bundles import scope_text
from agent.report.credentials import load_token
from agent.wire import DENY_PATH

ENV_URL = "GPUGUARD_HUB_URL"
ENV_TOKEN = "GPUGUARD_HUB_TOKEN"
ENV_TOKEN_FILE = "GPUGUARD_HUB_TOKEN_FILE"
_EXCERPT_CHARS = 300


class HubClientError(HubError):
    """The hub refused a `gpuguard hub policy` request, or could not be reached; one line naming the URL."""

    def __init__(self, url: str, reason: str, status: Optional[int] = None) -> None:
        self.url = url
        self.reason = reason
        self.status = status
        super().__init__(f"{url}: {reason}")


def hub_token(token_file: Optional[str], environ: Mapping[str, str]) -> str:
    """The bearer token: ``token_file`` (or $GPUGUARD_HUB_TOKEN_FILE), else $GPUGUARD_HUB_TOKEN; UsageError without
    either, ConfigError for a token file that is missing, empty or open to others."""
    path = token_file or environ.get(ENV_TOKEN_FILE)
    if path:
        return load_token(path)
    token = environ.get(ENV_TOKEN, "").strip()
    if not token:
        raise UsageError(f"no hub token: pass --token-file PATH, or set {ENV_TOKEN_FILE} or {ENV_TOKEN} "
                         "(an admin token to push or withdraw: gpuguard hub add-admin NAME)")
    return token


def hub_url(url: Optional[str], environ: Mapping[str, str]) -> str:
    """The hub's base URL: ``url`` (--hub) or $GPUGUARD_HUB_URL; UsageError without either or for a non-http one."""
    chosen = (url or environ.get(ENV_URL, "")).strip().rstrip("/")
    if not chosen:
        raise UsageError(f"no hub URL: pass --hub URL or set {ENV_URL} (for example https://hub.example:8470)")
    if not chosen.startswith(("http://", "https://")):
        raise UsageError(f"hub URL {chosen!r} must start with http:// or https://")
    return chosen


class HubClient:
    """Calls the hub's policy API; every answer but a 2xx is a HubClientError."""

    def __init__(self, url: str, token: str, ca_bundle: Optional[str] = None, timeout_seconds: float = 30.0,
                 session: Optional[requests.Session] = None) -> None:
        self.url = url.rstrip("/")
        self._token = token
        self._verify: Any = ca_bundle if ca_bundle else True
        self._timeout_seconds = timeout_seconds
        self._session = session or requests.Session()

    def __repr__(self) -> str:
        return f"HubClient(url={self.url!r})"

    def close(self) -> None:
        self._session.close()

    def _call(self, method: str, path: str, body: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
        url = self.url + path
        headers = {"Authorization": f"Bearer {self._token}", "User-Agent": f"gpuguard-cli/{__version__}",
                   "Accept": "application/json"}
        try:
            reply = self._session.request(method, url, json=body, headers=headers, timeout=self._timeout_seconds,
                                          verify=self._verify, allow_redirects=False)
        except requests.exceptions.SSLError as exc:
            raise HubClientError(url, f"TLS failed: {_first_line(exc)}") from None
        except requests.exceptions.Timeout:
            raise HubClientError(url, f"no answer within {self._timeout_seconds:g} s") from None
        except requests.exceptions.RequestException as exc:
            raise HubClientError(url, f"unreachable: {_first_line(exc)}") from None
        if 200 <= reply.status_code < 300:
            try:
                answer = reply.json()
            except ValueError:
                raise HubClientError(url, f"HTTP {reply.status_code} answer is not JSON", reply.status_code) \
                    from None
            if not isinstance(answer, dict):
                raise HubClientError(url, f"HTTP {reply.status_code} answer is not a JSON object", reply.status_code)
            return answer
        raise HubClientError(url, _refusal(reply), reply.status_code)

    def push(self, bundle: bytes, signature: bytes, staged: bool = False) -> Dict[str, Any]:
        """Store a signed bundle (admin); the stored bundle's summary."""
        return self._call("POST", "/v1/policy/bundles", {"bundle": base64.b64encode(bundle).decode("ascii"),
                                                         "signature": base64.b64encode(signature).decode("ascii"),
                                                         "staged": staged})

    def push_deny(self, deny: bytes, signature: bytes) -> Dict[str, Any]:
        """Put a signed deny list in place (admin); its summary."""
        return self._call("POST", DENY_PATH, {"deny": base64.b64encode(deny).decode("ascii"),
                                              "signature": base64.b64encode(signature).decode("ascii")})

    def list(self) -> Dict[str, Any]:
        """Every stored bundle, newest first."""
        return self._call("GET", "/v1/policy/bundles")

    def show(self, serial: int) -> Dict[str, Any]:
        """One bundle: its summary, policy file names, bytes and signature (base64)."""
        return self._call("GET", f"/v1/policy/bundles/{serial}")

    def withdraw(self, serial: int) -> Dict[str, Any]:
        """Stop offering a bundle (admin); its summary."""
        return self._call("POST", f"/v1/policy/bundles/{serial}/withdraw")

    def rollout_start(self, spec: Dict[str, Any]) -> Dict[str, Any]:
        """Start a staged rollout (admin); its status."""
        return self._call("POST", "/v1/rollouts", spec)

    def rollout_status(self, rollout_id: Optional[str]) -> Dict[str, Any]:
        """One rollout with its hosts, or (None) every rollout."""
        return self._call("GET", f"/v1/rollouts/{rollout_id}" if rollout_id else "/v1/rollouts")

    def rollout_action(self, rollout_id: str, action: str) -> Dict[str, Any]:
        """Pause, resume or abort a rollout (admin); the rollout."""
        return self._call("POST", f"/v1/rollouts/{rollout_id}/{action}")


def bundles_table(bundles: Sequence[Mapping[str, Any]]) -> str:
    """``hub policy list``: one line per bundle, newest first (serial, state, pushed when and by whom, scope)."""
    lines = [f"{'SERIAL':>8}  {'STATE':<9}  {'PUSHED_AT':<20}  {'PUSHED_BY':<16}  SCOPE"]
    for b in bundles:
        state = "withdrawn" if b.get("withdrawn_at") else "offered"
        lines.append(f"{b.get('serial', '?'):>8}  {state:<9}  {str(b.get('pushed_at', ''))[:19]:<20}  "
                     f"{str(b.get('pushed_by', '')):<16}  {scope_text(b.get('scope') or {})}")
    if not bundles:
        lines.append("(no bundles)")
    return "\n".join(lines) + "\n"


def bundle_lines(summary: Mapping[str, Any], policy_files: Sequence[str]) -> str:
    """``hub policy show``: the bundle's summary, one field a line."""
    withdrawn = (f"withdrawn {summary.get('withdrawn_at')} by {summary.get('withdrawn_by')}"
                 if summary.get("withdrawn_at") else "offered to hosts in scope")
    rows = [("serial", summary.get("serial")), ("state", withdrawn), ("scope", scope_text(summary.get("scope") or {})),
            ("created", f"{summary.get('created_at')} by {summary.get('created_by')}"),
            ("pushed", f"{summary.get('pushed_at')} by {summary.get('pushed_by')}"),
            ("matrix_version", summary.get("matrix_version") or "-"),
            ("sha256", summary.get("sha256")), ("bytes", summary.get("bundle_bytes")),
            ("policy_files", ", ".join(policy_files) or "-")]
    return "".join(f"{name + ':':<16}{value}\n" for name, value in rows)


def rollout_lines(status: Mapping[str, Any]) -> str:
    """``hub rollout status ID``: the rollout, hosts per stage, then one line per host (stage, evidence)."""
    r = status.get("rollout", {})
    spec = r.get("spec", {})
    stages = ", ".join(f"{k}: {v}" for k, v in sorted((status.get("hosts_by_stage") or {}).items()))
    rows = [("rollout", r.get("rollout_id")), ("state", r.get("state")), ("why", r.get("reason")),
            ("target", f"serial {r.get('target_serial')} (previous {r.get('previous_serial')}"
                       + (f", revert {spec['revert_serial']}" if spec.get("revert_serial") is not None else "")
                       + ")"),
            ("stage", f"{r.get('stage')} of {len(spec.get('batches', []))}, opened {r.get('stage_started_at')}"),
            ("plan", f"{spec.get('canaries')} canaries per cohort, then {spec.get('batches')}%, soak "
                     f"{spec.get('soak_seconds')} s, judged by {spec.get('judge', 'control')} (absolute rule: halt "
                     f"above {spec.get('halt_percent')}%), report deadline "
                     f"{spec.get('report_deadline_seconds')} s"),
            ("hosts by stage", stages)]
    lines = [f"{name + ':':<16}{value}" for name, value in rows]
    lines.append(f"{'HOST':<24}  {'STAGE':<7}  {'RESULT':<6}  DETAIL")
    for h in status.get("hosts", []):
        evidence = h.get("evidence") or {}
        stage = "-" if h.get("stage") is None else str(h.get("stage"))
        lines.append(f"{h.get('host_id', ''):<24}  {stage:<7}  {evidence.get('result', '-'):<6}  "
                     f"{evidence.get('detail', '')}")
    return "\n".join(lines) + "\n"


def rollouts_table(rollouts: Sequence[Mapping[str, Any]]) -> str:
    """``hub rollout status``: one line per rollout, newest first."""
    lines = [f"{'ROLLOUT':<16}  {'STATE':<8}  {'TARGET':>6}  {'STAGE':>5}  WHY"]
    lines += [f"{r.get('rollout_id', ''):<16}  {r.get('state', ''):<8}  {r.get('target_serial', ''):>6}  "
              f"{r.get('stage', ''):>5}  {r.get('reason', '')}" for r in rollouts]
    if not rollouts:
        lines.append("(no rollouts)")
    return "\n".join(lines) + "\n"


def _refusal(reply: requests.Response) -> str:
    """``HTTP 409 serial_not_newer: <detail>`` from the hub's JSON error body, else an excerpt of the body."""
    try:
        body = reply.json()
    except ValueError:
        body = None
    if isinstance(body, dict) and isinstance(body.get("detail"), str):
        return f"HTTP {reply.status_code} {body.get('error', 'error')}: {body['detail']}"
    excerpt = " ".join(reply.text[:_EXCERPT_CHARS].split())
    return f"HTTP {reply.status_code} {excerpt}".strip()


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0] if lines else ''}"[:500]
