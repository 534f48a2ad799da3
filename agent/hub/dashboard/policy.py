"""The dashboard's policy HTML (pure): the overview's policy section, the /ui/policy page (bundles, hosts behind,
hosts that refused a bundle and why, the audit trail), and a host's policy rows. Every value goes through ``e()``."""

from __future__ import annotations

import datetime as dt
from typing import List, Optional, Sequence, Tuple

from agent.hub.bundles import HostPolicy, PolicyRollout, scope_text
from agent.hub.dashboard.render import e, host_url, page, when
from agent.hub.describe import ATTENTION_MEANINGS
from agent.hub.rows import AuditEntry, BundleSummary

OVERVIEW_ROWS = 10


def _serial(value: Optional[int]) -> str:
    return e(value) if value is not None else '<span class="muted">none</span>'


def _refused_table(rows: Sequence[HostPolicy], limit: Optional[int] = None) -> str:
    refused = [r for r in rows if r.refused]
    body = "".join(
        f'<tr class="refused" data-host-id="{e(r.host_id)}" data-kind="{e(r.refused_kind)}"><td>'
        f'<a href="{e(host_url(r.host_id))}">{e(r.host_id)}</a></td><td>{_serial(r.refused_serial)}</td>'
        f"<td>{e(r.refused_kind)}</td><td>{e(r.refused_reason)}</td><td>{_serial(r.policy_serial)}</td></tr>"
        for r in refused[:limit])
    return ('<table id="policy-refused"><thead><tr><th>Host</th><th>Refused serial</th><th>Kind</th><th>Why</th>'
            "<th>Enforces</th></tr></thead><tbody>"
            + (body or '<tr><td colspan="5" class="muted">no host refused a bundle</td></tr>') + "</tbody></table>")


def _behind_table(rows: Sequence[HostPolicy], limit: Optional[int] = None) -> str:
    behind = [r for r in rows if r.behind]
    body = "".join(
        f'<tr class="behind" data-host-id="{e(r.host_id)}"><td><a href="{e(host_url(r.host_id))}">{e(r.host_id)}</a>'
        f"</td><td>{_serial(r.policy_serial)}</td><td>{e(r.offered_serial)}</td><td>{e(r.policy_source)}</td></tr>"
        for r in behind[:limit])
    return ('<table id="policy-behind"><thead><tr><th>Host</th><th>Enforces</th><th>Offered</th><th>Source</th>'
            "</tr></thead><tbody>"
            + (body or '<tr><td colspan="4" class="muted">every host enforces the newest bundle in its scope</td>'
                       "</tr>") + "</tbody></table>")


def _attention_badges(words: Sequence[str]) -> str:
    return " ".join(f'<span class="badge bad attention" data-word="{e(w)}" title="{e(ATTENTION_MEANINGS.get(w))}">'
                    f"{e(w)}</span>" for w in words)


def _attention_table(rows: Sequence[HostPolicy], limit: Optional[int] = None) -> str:
    flagged = [r for r in rows if r.attention]
    body = "".join(
        f'<tr class="attention" data-host-id="{e(r.host_id)}" data-words="{e(" ".join(r.attention))}"><td>'
        f'<a href="{e(host_url(r.host_id))}">{e(r.host_id)}</a></td><td>{_attention_badges(r.attention)}</td>'
        f"<td>{e('; '.join(ATTENTION_MEANINGS.get(w, w) for w in r.attention))}</td><td>{_serial(r.policy_serial)}"
        "</td></tr>" for r in flagged[:limit])
    return ('<table id="policy-attention"><thead><tr><th>Host</th><th>Attention</th><th>What it means</th>'
            "<th>Enforces</th></tr></thead><tbody>"
            + (body or '<tr><td colspan="4" class="muted">no host reports policy attention</td></tr>')
            + "</tbody></table>")


def _summary(rollout: PolicyRollout) -> str:
    return (f'<p id="policy-summary">Newest bundle: serial <span id="policy-newest">{_serial(rollout.newest_serial)}'
            f'</span>; <span id="policy-behind-count">{rollout.behind_count}</span> host(s) on an older serial than '
            f'offered; <span id="policy-refused-count">{rollout.refused_count}</span> host(s) refused a bundle; '
            f'<span id="policy-ahead-count">{rollout.ahead_count}</span> host(s) above every serial offered; '
            + "; ".join(f'<span id="policy-attention-{e(word)}-count">{count}</span> host(s) reporting {e(word)}'
                        for word, count in sorted(rollout.attention_by_word.items()))
            + ".</p>")


def policy_section(rollout: PolicyRollout) -> str:
    """The overview's policy section: the newest serial, and the first hosts behind and refusing, with why."""
    return (f"<h2>Policy</h2>{_summary(rollout)}<h3>Refused</h3>{_refused_table(rollout.hosts, OVERVIEW_ROWS)}"
            f"<h3>Attention</h3>{_attention_table(rollout.hosts, OVERVIEW_ROWS)}"
            f"<h3>On an older serial</h3>{_behind_table(rollout.hosts, OVERVIEW_ROWS)}"
            '<p><a href="/ui/policy">all bundles and hosts</a></p>')


def policy_page(rollout: PolicyRollout, bundles: Sequence[BundleSummary], audit: Sequence[AuditEntry],
                now: dt.datetime, reader: Optional[str]) -> str:
    """/ui/policy: every bundle, every host behind or refusing, and the newest audit entries."""
    bundle_rows = "".join(
        f'<tr class="bundle" data-serial="{b.serial}"><td>{b.serial}</td>'
        f'<td>{"withdrawn " + when(b.withdrawn_at, now) + " by " + e(b.withdrawn_by) if b.withdrawn_at else "offered"}'
        f"</td><td>{e(scope_text(b.scope))}</td><td>{e(b.created_by)}</td><td>{when(b.pushed_at, now)} by "
        f"{e(b.pushed_by)}</td><td><code>{e(b.sha256[:16])}</code></td></tr>" for b in bundles)
    audit_rows = "".join(
        f'<tr class="audit"><td>{when(a.at, now)}</td><td>{e(a.actor)} ({e(a.role)})</td><td>{e(a.action)}</td>'
        f"<td>{e(a.serial)}</td><td>{e(a.detail)}</td></tr>" for a in audit)
    body = (f"<h1>Policy bundles</h1>{_summary(rollout)}"
            '<table id="bundles"><thead><tr><th>Serial</th><th>State</th><th>Scope</th><th>Made by</th>'
            "<th>Pushed</th><th>sha256</th></tr></thead><tbody>"
            + (bundle_rows or '<tr><td colspan="6" class="muted">no bundle pushed yet</td></tr>') + "</tbody></table>"
            f"<h2>Hosts that refused a bundle</h2>{_refused_table(rollout.hosts)}"
            f"<h2>Hosts reporting policy attention</h2>{_attention_table(rollout.hosts)}"
            f"<h2>Hosts on an older serial than offered</h2>{_behind_table(rollout.hosts)}"
            '<h2>Audit</h2><table id="audit"><thead><tr><th>When</th><th>Who</th><th>What</th><th>Serial</th>'
            "<th>Detail</th></tr></thead><tbody>"
            + (audit_rows or '<tr><td colspan="5" class="muted">nothing yet</td></tr>') + "</tbody></table>")
    return page("Policy", body, reader, "policy")


def host_policy_facts(p: HostPolicy) -> List[Tuple[str, str]]:
    """A host page's policy rows (label, HTML)."""
    state = ('<span class="badge bad" id="policy-ahead">above every serial offered</span>' if p.ahead
             else '<span class="badge warn" id="policy-behind">behind</span>' if p.behind
             else '<span class="badge ok">current</span>' if p.offered_serial is not None else "")
    refused = (f'<span class="badge bad" id="policy-refused">{e(p.refused_kind or "refused")}</span> '
               f'<span id="policy-refused-serial">{_serial(p.refused_serial)}</span> {e(p.refused_reason)}'
               if p.refused else e(None))
    return [("Policy source", e(p.policy_source)), ("Policy serial", f"{_serial(p.policy_serial)} {state}"),
            ("Offered serial", _serial(p.offered_serial)), ("Refused bundle", refused),
            ("Policy attention", f'<span id="policy-attention">{_attention_badges(p.attention)} '
                                 f"{e('; '.join(ATTENTION_MEANINGS.get(w, w) for w in p.attention))}</span>"
             if p.attention else e(None))]
