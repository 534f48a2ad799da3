"""Alert webhooks: critical events, POSTed to the configured webhooks at least once, from a queue in the database.

    ingest -> enqueue (before the agent hears 200) -> alert_deliveries (pending) -> delivery thread -> POST
                                                                 |  2xx: delivered
                                                                 |  error, non-2xx, timeout: retried with backoff
                                                                 `  alert_max_attempts failures: dead (kept)

An event is queued once per webhook that wants it (its kind in the webhook's ``kinds``, its severity at least
``min_severity``), keyed by (webhook, host_id, event_id): the agent resending a batch queues nothing twice. The
queue is written before the ingest request is answered; if that write fails the request gets 503, the agent
resends, and the events (now duplicates) are queued again. So an acknowledged alertable event is never lost, and a
hub restart resumes the queue. A receiver may see one alert more than once (a delivery whose answer was lost is
sent again): ``X-Gpuguard-Delivery`` carries a stable id to drop repeats by.

Several hub processes may share the queue: a row is leased (``lease_until``) by the process that sends it.

The hub raises alerts of its own too (``enqueue_hub_alert``: a staged rollout halted, agent/hub/rollouts.py): queued
for every webhook, whatever its ``kinds``, inside the transaction that made the decision, keyed by the decision so
that it is queued once; the body is ``{"hub_alert": {kind, severity, summary, ...}}`` instead of an event. A host
whose heartbeat starts reporting a policy attention word ("expired", "freshness", "denied": ``attention_alerts``)
raises one ``policy_attention`` alert per host, word and serial in force, queued before the batch is answered.
"""

from __future__ import annotations

import datetime as dt
import json
import random
import threading
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple

import requests

from agent import __version__
from agent.hub.alert_settings import AlertWebhook
from agent.hub.describe import ATTENTION_MEANINGS, describe_event
from agent.hub.host_updates import order_within_receipt
from agent.hub.rows import utc_now
from agent.hub.settings import HubSettings
from agent.hub.store import SqlStore
from agent.log import get_logger
from agent.report.events import Event

log = get_logger("hub.alerts")

STATES = ("pending", "delivered", "dead")
_CLAIM_BATCH = 20
_LEASE_MARGIN_SECONDS = 30.0
_ERROR_CHARS = 500
# One delivery queued once per (webhook, host_id, event_id); a hub alert's host_id is "-".
_INSERT_DELIVERY = ("INSERT INTO alert_deliveries (webhook, host_id, event_id, kind, severity, body, state, attempts, "
                    "next_attempt_at, created_at) VALUES (?, ?, ?, ?, ?, ?, 'pending', 0, ?, ?) "
                    "ON CONFLICT (webhook, host_id, event_id) DO NOTHING")


def _tables(timestamp_type: str) -> List[str]:
    return [
        f"""CREATE TABLE IF NOT EXISTS alert_deliveries (
            webhook TEXT NOT NULL,
            host_id TEXT NOT NULL,
            event_id TEXT NOT NULL,
            kind TEXT NOT NULL,
            severity TEXT NOT NULL,
            body TEXT NOT NULL,
            state TEXT NOT NULL,
            attempts INTEGER NOT NULL,
            next_attempt_at {timestamp_type} NOT NULL,
            lease_until {timestamp_type},
            created_at {timestamp_type} NOT NULL,
            finished_at {timestamp_type},
            last_error TEXT,
            PRIMARY KEY (webhook, host_id, event_id))""",
        "CREATE INDEX IF NOT EXISTS alert_deliveries_due ON alert_deliveries (state, next_attempt_at)",
    ]


class Delivery(NamedTuple):
    webhook: str
    host_id: str
    event_id: str
    attempts: int
    body: str

    @property
    def delivery_id(self) -> str:
        return f"{self.webhook}:{self.host_id}:{self.event_id}"


def _plain(value: Any) -> str:
    return "-" if value is None else str(value)


def _slack_escape(value: Any) -> str:
    # Slack's mrkdwn: &, < and > are control characters; untrusted text must not make links or mentions.
    return _plain(value).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def message(webhook: AlertWebhook, delivery: Delivery) -> bytes:
    """The POST body: the generic JSON envelope, or a Slack-compatible ``{"text": ...}``."""
    event = json.loads(delivery.body)
    if "hub_alert" in event:
        alert = event["hub_alert"]
        if webhook.format == "slack":
            e = _slack_escape
            return json.dumps({"text": f"*[{e(alert['severity'])}] {e(alert['kind'])}* from the gpuguard hub\n"
                                       f"{e(alert['summary'])}"}).encode()
        return json.dumps({"version": 1, "source": "gpuguard-hub", "delivery_id": delivery.delivery_id,
                           "webhook": webhook.name, "attempt": delivery.attempts + 1, "kind": alert["kind"],
                           "severity": alert["severity"], "host_id": None, "hostname": None,
                           "summary": alert["summary"], "hub_alert": alert}).encode()
    kind = event["payload"]["kind"]
    if webhook.format == "slack":
        e = _slack_escape
        text = (f"*[{e(event['severity'])}] {e(kind)}* on `{e(event['host_id'])}` ({e(event['hostname'])}) at "
                f"{e(event['occurred_at'])}\n{describe_event(event, e)}")
        return json.dumps({"text": text}).encode()
    return json.dumps({"version": 1, "source": "gpuguard-hub", "delivery_id": delivery.delivery_id,
                       "webhook": webhook.name, "attempt": delivery.attempts + 1, "kind": kind,
                       "severity": event["severity"], "host_id": event["host_id"], "hostname": event["hostname"],
                       "summary": describe_event(event, _plain), "event": event}).encode()


def attention_alerts(events: Sequence[Event]) -> List[Tuple[str, Dict[str, Any]]]:
    """The hub alerts (key, alert) that ``events`` raise for policy attention: for each host's newest heartbeat
    among them, one per attention word it reports, keyed by host, word and the serial in force, so a host that
    keeps reporting (or resends) is alerted once, and again when a newer bundle it installs runs into it too; pure."""
    newest: Dict[str, Event] = {}
    for ev in events:  # received together: the agent's sequence orders them, never its clock alone
        if ev.payload.kind == "heartbeat" and (
                ev.host_id not in newest or order_within_receipt(ev) >= order_within_receipt(newest[ev.host_id])):
            newest[ev.host_id] = ev
    out = []
    for host_id, ev in sorted(newest.items()):
        payload = ev.payload
        serial = getattr(payload, "policy_serial", None)
        for word in getattr(payload, "policy_attention", None) or ():
            out.append((f"policy-attention-{host_id}-{word}-{serial if serial is not None else 'none'}", {
                "kind": "policy_attention", "severity": "warning", "host_id": host_id, "hostname": ev.hostname,
                "word": word, "policy_serial": serial,
                "summary": f"host {host_id} ({ev.hostname}) reports policy attention {word!r}"
                           f"{f' on serial {serial}' if serial is not None else ''}: {ATTENTION_MEANINGS[word]}"}))
    return out


def backoff_seconds(attempts: int, initial: float, maximum: float, rand: Callable[[], float] = random.random) -> float:
    """Wait after the ``attempts``-th failure: doubling from ``initial``, capped at ``maximum``, with jitter (the
    wait is between half and all of it, so many hubs retrying one receiver spread out)."""
    base = min(maximum, initial * (2 ** min(attempts - 1, 30)))
    return base * (0.5 + 0.5 * rand())


class AlertQueue:
    """The queue table: enqueue from ingest, claim and settle from the delivery thread, counts for /metrics."""

    def __init__(self, store: SqlStore, webhooks: Sequence[AlertWebhook]) -> None:
        self._store = store
        self.webhooks = {w.name: w for w in webhooks}

    def open(self) -> None:
        """Create the queue table; nothing to do (and no table) without webhooks."""
        if self.webhooks:
            self._store.create_tables(_tables(self._store.dialect.timestamp_type))

    def _t(self, value: dt.datetime) -> Any:
        return self._store.dialect.to_db_time(value)

    def wanted(self, events: Sequence[Event]) -> List[tuple]:
        return [(w, ev) for ev in events for w in self.webhooks.values() if w.wants(ev.payload.kind, ev.severity)]

    def enqueue(self, events: Sequence[Event], now: dt.datetime) -> int:
        """Queue each wanted (webhook, event) not queued before; how many pairs were wanted."""
        pairs = self.wanted(events)
        if not pairs:
            return 0
        sql = self._store.dialect.sql(_INSERT_DELIVERY)
        stamp = self._t(now)

        def work(cur: Any) -> None:
            for webhook, ev in pairs:
                cur.execute(sql, (webhook.name, ev.host_id, ev.event_id, ev.payload.kind, ev.severity,
                                  ev.model_dump_json(), stamp, stamp))

        self._store.write("alert_enqueue", work)
        return len(pairs)

    def enqueue_hub_alert(self, cur: Any, key: str, alert: Dict[str, Any], now: dt.datetime) -> int:
        """Queue the hub's own ``alert`` (kind, severity, summary, ...) for every webhook, in the caller's
        transaction ``cur``, once per ``key``; how many webhooks it was queued for."""
        if not self.webhooks:
            return 0
        sql = self._store.dialect.sql(_INSERT_DELIVERY)
        stamp = self._t(now)
        for name in self.webhooks:
            cur.execute(sql, (name, "-", key, alert["kind"], alert["severity"], json.dumps({"hub_alert": alert}), stamp,
                              stamp))
        return len(self.webhooks)

    def enqueue_attention(self, events: Sequence[Event], now: dt.datetime) -> int:
        """Queue the policy attention alerts ``events`` raise (:func:`attention_alerts`) for every webhook, each
        once; how many (alert, webhook) pairs were wanted."""
        alerts = attention_alerts(events) if self.webhooks else []
        if not alerts:
            return 0

        def work(cur: Any) -> int:
            return sum(self.enqueue_hub_alert(cur, key, alert, now) for key, alert in alerts)

        return self._store.write("alert_enqueue", work)

    def claim(self, now: dt.datetime, lease_seconds: float, limit: int = _CLAIM_BATCH) -> List[Delivery]:
        """Lease up to ``limit`` due deliveries to this process."""
        sql = self._store.dialect.sql
        stamp, lease = self._t(now), self._t(now + dt.timedelta(seconds=lease_seconds))
        names = list(self.webhooks)
        if not names:
            return []

        def work(cur: Any) -> List[Delivery]:
            cur.execute(sql("SELECT webhook, host_id, event_id, attempts, body FROM alert_deliveries "
                            "WHERE state = 'pending' AND next_attempt_at <= ? AND (lease_until IS NULL OR "
                            f"lease_until < ?) AND webhook IN ({', '.join('?' * len(names))}) "
                            "ORDER BY next_attempt_at LIMIT ?"), (stamp, stamp, *names, limit))
            claimed = []
            for row in cur.fetchall():
                cur.execute(sql("UPDATE alert_deliveries SET lease_until = ? WHERE webhook = ? AND host_id = ? AND "
                                "event_id = ? AND state = 'pending' AND (lease_until IS NULL OR lease_until < ?)"),
                            (lease, row[0], row[1], row[2], stamp))
                if cur.rowcount == 1:
                    claimed.append(Delivery(*row))
            return claimed

        return self._store.write("alert_claim", work)

    def settle(self, delivery: Delivery, now: dt.datetime, error: Optional[str], max_attempts: int,
               retry_in_seconds: float) -> str:
        """Record one attempt's outcome; the delivery's new state."""
        attempts = delivery.attempts + 1
        if error is None:
            state, next_at, finished = "delivered", now, now
        elif attempts >= max_attempts:
            state, next_at, finished = "dead", now, now
        else:
            state, next_at, finished = "pending", now + dt.timedelta(seconds=retry_in_seconds), None
        sql = self._store.dialect.sql(
            "UPDATE alert_deliveries SET state = ?, attempts = ?, next_attempt_at = ?, lease_until = NULL, "
            "finished_at = ?, last_error = ? WHERE webhook = ? AND host_id = ? AND event_id = ?")
        self._store.write("alert_settle", lambda cur: cur.execute(sql, (
            state, attempts, self._t(next_at), None if finished is None else self._t(finished),
            None if error is None else error[:_ERROR_CHARS], delivery.webhook, delivery.host_id, delivery.event_id)))
        return state

    def counts(self) -> Dict[tuple, int]:
        """Deliveries by (webhook, state)."""
        if not self.webhooks:
            return {}
        rows = self._store.query("alert_counts", "SELECT webhook, state, COUNT(*) FROM alert_deliveries "
                                                 "GROUP BY webhook, state")
        return {(r[0], r[1]): int(r[2]) for r in rows}

    def rows(self, state: Optional[str] = None) -> List[Dict[str, Any]]:
        """Deliveries (oldest first) with their state, attempts and last error; for tests and inspection."""
        where, params = ("WHERE state = ?", [state]) if state else ("", [])
        rows = self._store.query("alert_rows", "SELECT webhook, host_id, event_id, kind, severity, state, attempts, "
                                               f"last_error FROM alert_deliveries {where} ORDER BY created_at, "
                                               "event_id", params)
        keys = ("webhook", "host_id", "event_id", "kind", "severity", "state", "attempts", "last_error")
        return [dict(zip(keys, r)) for r in rows]


def post(webhook: AlertWebhook, delivery: Delivery, timeout_seconds: float,
         session: Optional[requests.Session] = None) -> Optional[str]:
    """One attempt; None when the receiver answered 2xx, else what went wrong (one line)."""
    headers = {"Content-Type": "application/json", "User-Agent": f"gpuguard-hub/{__version__}",
               "X-Gpuguard-Delivery": delivery.delivery_id}
    try:
        answer = (session or requests).post(webhook.url, data=message(webhook, delivery), headers=headers,
                                            timeout=(timeout_seconds, timeout_seconds), allow_redirects=False)
    except requests.RequestException as exc:
        return f"{type(exc).__name__}: {exc}"
    answer.close()
    if 200 <= answer.status_code < 300:
        return None
    return f"HTTP {answer.status_code}"


class AlertDeliverer:
    """The delivery thread: claims due deliveries, POSTs them, records the outcome; idle, it polls."""

    def __init__(self, settings: HubSettings, queue: AlertQueue,
                 clock: Callable[[], dt.datetime] = utc_now) -> None:
        self._settings = settings
        self._queue = queue
        self._clock = clock
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._session = requests.Session()

    def start(self) -> None:
        if self._thread is not None or not self._queue.webhooks:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="hub-alerts", daemon=True)
        self._thread.start()
        log.info("hub_alerts_started", webhook_count=len(self._queue.webhooks))

    def stop(self, timeout_seconds: float = 10.0) -> None:
        thread = self._thread
        if thread is None:
            return
        self._stop.set()
        thread.join(timeout_seconds)
        self._thread = None
        self._session.close()

    def run_once(self) -> int:
        """Deliver what is due now; how many attempts were made."""
        s = self._settings
        claimed = self._queue.claim(self._clock(), s.alert_timeout_seconds * 2 + _LEASE_MARGIN_SECONDS)
        for delivery in claimed:
            if self._stop.is_set():
                break
            webhook = self._queue.webhooks[delivery.webhook]
            error = post(webhook, delivery, s.alert_timeout_seconds, self._session)
            retry = backoff_seconds(delivery.attempts + 1, s.alert_retry_initial_seconds, s.alert_retry_max_seconds)
            state = self._queue.settle(delivery, self._clock(), error, s.alert_max_attempts, retry)
            fields = dict(webhook=delivery.webhook, host_id=delivery.host_id, event_id=delivery.event_id,
                          attempt=delivery.attempts + 1)
            if state == "delivered":
                log.info("hub_alert_delivered", **fields)
            elif state == "dead":
                log.error("hub_alert_dead_lettered", error=error, **fields)
            else:
                log.warning("hub_alert_delivery_failed", error=error, retry_in_seconds=round(retry, 3), **fields)
        return len(claimed)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                busy = self.run_once() > 0
            except Exception as exc:  # noqa: BLE001 - a database hiccup must not end deliveries; retried next poll
                log.error("hub_alerts_failed", error=str(exc))
                busy = False
            if not busy:
                self._stop.wait(self._settings.alert_poll_seconds)
