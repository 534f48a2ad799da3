"""One line saying what a stored event reports, for the dashboard and the alert webhooks alike.

Each value of the event goes through the escaping the caller hands in (HTML for the dashboard, agent/hub/dashboard/
render.py; plain text or Slack's for the webhooks, agent/hub/alerts.py), so the wording lives here once and alerts
need nothing of the dashboard.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

DASH = "\u2014"  # what an empty value shows as

# What each policy attention word of a heartbeat (agent/wire.py's POLICY_ATTENTION) means, for people (the
# dashboard and the hub's attention alerts); decisions match the word.
ATTENTION_MEANINGS = {
    "expired": "the policy bundle in force is past its expiry (the host keeps enforcing it)",
    "freshness": "the hub's freshness statement is stale or names a serial (a bundle's or the deny list's) this host "
                 "does not have (a freeze?)",
    "denied": "a package installed on the host is at a version the deny list in force names as known-bad",
}


def _versions(versions: Mapping[str, str], e: Callable[[Any], str]) -> str:
    return ", ".join(f"{e(k)} {e(v)}" for k, v in sorted(versions.items())) or DASH


# The kinds whose line is some of their payload's fields set in a sentence, each field escaped.
_TEMPLATES = {
    "policy_violation": "policy violation ({action}) {rule}: {message}",
    "cpu_fallback": "CPU fallback: {reason}",
    "health_failed": "health check {status}: {summary}",
    "override_used": "override {window_id} used by {opened_by}: {reason}",
    "heartbeat": "heartbeat: agent {agent_version}, health {last_health_status}, outbox {outbox_depth}",
    "state_file_damaged": "state file damaged: {path}: {problem}",
    "dependencies_broken": "package dependencies broken ({action}): {message}",
}


class _Escaped:
    """A payload's fields as a template reads them: each one escaped (None when the payload lacks it)."""

    def __init__(self, payload: Mapping[str, Any], e: Callable[[Any], str]) -> None:
        self.payload, self.e = payload, e

    def __getitem__(self, key: str) -> str:
        return self.e(self.payload.get(key))


def describe_event(event: Mapping[str, Any], e: Callable[[Any], str]) -> str:
    """One line saying what an event reports, each value passed through ``e`` (the dashboard's HTML escaping, the
    alert webhooks' plain or Slack escaping)."""
    p = event.get("payload", {})
    kind = p.get("kind")
    if kind in _TEMPLATES:
        return _TEMPLATES[kind].format_map(_Escaped(p, e))
    if kind == "snapshot_changed":
        changes = p.get("changes") or []
        moved = "; ".join(f"{e(c.get('section'))}/{e(c.get('path'))}: {e(c.get('old'))} \u2192 {e(c.get('new'))}"
                          for c in changes[:8] if isinstance(c, dict))
        return f"snapshot changed{': ' + moved if moved else ''} (hash {e(str(p.get('new_hash'))[:12])})"
    if kind == "transaction_blocked":
        return (f"{e(p.get('tool'))} transaction blocked by {e(p.get('rule'))}: {e(p.get('message'))} "
                f"({_versions(p.get('packages') or {}, e)})")
    if kind == "rollback":
        outcome = "rolled back" if p.get("succeeded") else "rollback FAILED"
        reason = e(p.get("reason")) + (f": {e(p.get('health_status'))}" if p.get("health_status") else "")
        return (f"{outcome} ({reason}): {_versions(p.get('from_versions') or {}, e)} \u2192 "
                f"{_versions(p.get('to_versions') or {}, e)}")
    if kind == "health_regression":
        return (f"health regression: {e(p.get('metric'))} {e(p.get('current_value'))} vs baseline "
                f"{e(p.get('baseline_value'))} (\u2212{float(p.get('drop_fraction') or 0) * 100:.1f}%)")
    if kind == "health_deferred":
        tenants = "; ".join(str(t) for t in p.get("tenants") or []) or "no tenant named"
        return (f"health check deferred: GPUs busy for {float(p.get('window_seconds') or 0) / 3600:g} h, "
                f"{e(p.get('attempts'))} attempts ({e(tenants)})")
    return e(kind)
