"""One line saying what a stored event reports, for the dashboard and the alert webhooks alike.

Each value of the event goes through the escaping the caller hands in (HTML for the dashboard, agent/hub/dashboard/
render.py; plain text or Slack's for the webhooks, agent/hub/alerts.py), so the wording lives here once and alerts
need nothing of the dashboard.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

DASH = "\u2014"  # what an empty value shows as


def _versions(versions: Mapping[str, str], e: Callable[[Any], str]) -> str:
    return ", ".join(f"{e(k)} {e(v)}" for k, v in sorted(versions.items())) or DASH


def describe_event(event: Mapping[str, Any], e: Callable[[Any], str]) -> str:
    """One line saying what an event reports, each value passed through ``e`` (the dashboard's HTML escaping, the
    alert webhooks' plain or Slack escaping)."""
    p = event.get("payload", {})
    kind = p.get("kind")
    if kind == "snapshot_changed":
        changes = p.get("changes") or []
        moved = "; ".join(f"{e(c.get('section'))}/{e(c.get('path'))}: {e(c.get('old'))} \u2192 {e(c.get('new'))}"
                          for c in changes[:8] if isinstance(c, dict))
        return f"snapshot changed{': ' + moved if moved else ''} (hash {e(str(p.get('new_hash'))[:12])})"
    if kind == "policy_violation":
        return f"policy violation ({e(p.get('action'))}) {e(p.get('rule'))}: {e(p.get('message'))}"
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
    if kind == "cpu_fallback":
        return f"CPU fallback: {e(p.get('reason'))}"
    if kind == "health_deferred":
        tenants = "; ".join(str(t) for t in p.get("tenants") or []) or "no tenant named"
        return (f"health check deferred: GPUs busy for {float(p.get('window_seconds') or 0) / 3600:g} h, "
                f"{e(p.get('attempts'))} attempts ({e(tenants)})")
    if kind == "override_used":
        return f"override {e(p.get('window_id'))} used by {e(p.get('opened_by'))}: {e(p.get('reason'))}"
    if kind == "heartbeat":
        return (f"heartbeat: agent {e(p.get('agent_version'))}, health {e(p.get('last_health_status'))}, "
                f"outbox {e(p.get('outbox_depth'))}")
    if kind == "state_file_damaged":
        return f"state file damaged: {e(p.get('path'))}: {e(p.get('problem'))}"
    return e(kind)
