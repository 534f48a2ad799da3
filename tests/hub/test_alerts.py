"""Alert webhooks: against a real receiver on 127.0.0.1 and a real hub process, every alertable event reaches the
receiver at least once through refusals, 500s, a hang and a hub restart; past the attempt limit it is dead-lettered."""

from __future__ import annotations

import datetime as dt
import json
import re
from pathlib import Path
from typing import Any, Dict, Iterator, List

import pytest
import requests

from agent.errors import ConfigError
from agent.hub.alert_settings import AlertWebhook
from agent.hub.alerts import AlertQueue, Delivery, backoff_seconds, message
from agent.hub.settings import HubSettings, parse_hub_settings
from agent.hub.store import make_store
from agent.hub.tokens import add_token
from tests.hub.factories import batch_json, event
from tests.hub.process import HubProcess, wait_until
from tests.hub.webhook_receiver import Receiver

pytestmark = pytest.mark.slow

HOST = "gpu-node-07"


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    made = Receiver()
    yield made
    made.stop()


def hub_config(tmp_path: Path, receiver: Receiver, max_attempts: int, formats: Dict[str, str]) -> Path:
    hooks = "".join(f'[[alert_webhooks]]\nname = "{name}"\nurl = "http://127.0.0.1:{receiver.port}/{name}"\n'
                    f'format = "{fmt}"\n\n' for name, fmt in formats.items())
    config = tmp_path / "hub.toml"
    config.write_text(f'listen_port = 0\ndatabase_url = "sqlite:///{tmp_path}/hub.db"\n'
                      f'tokens_file = "{tmp_path}/tokens.json"\ntokens_reload_seconds = 0\n'
                      f"alert_max_attempts = {max_attempts}\nalert_retry_initial_seconds = 0.2\n"
                      "alert_retry_max_seconds = 0.5\nalert_timeout_seconds = 1\nalert_poll_seconds = 0.1\n\n"
                      + hooks)
    return config


def post(hub: HubProcess, token: str, events: List[Any]) -> Dict[str, Any]:
    answer = requests.post(f"{hub.url}/v1/events", data=batch_json(events), timeout=10,
                           headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    assert answer.status_code == 200, answer.text
    return dict(answer.json())


def queue_rows(tmp_path: Path, names: List[str]) -> List[Dict[str, Any]]:
    store = make_store(f"sqlite:///{tmp_path}/hub.db")
    try:
        return AlertQueue(store, [AlertWebhook(name=n, url="http://x/") for n in names]).rows()
    finally:
        store.close()


def alertable_events() -> List[Any]:
    violation = event(HOST, "policy_violation", hostname="node<7>&co").model_copy(update={"severity": "critical"})
    fallback = event(HOST, "cpu_fallback").model_copy(update={"severity": "critical"})
    quiet = event(HOST, "heartbeat")  # not an alert kind: never sent
    note = event(HOST, "health_regression").model_copy(update={"severity": "info"})  # below min_severity
    return [violation, fallback, quiet, note]


def test_alerts_survive_refusals_500s_a_hang_and_a_hub_restart(tmp_path: Path, receiver: Receiver) -> None:
    """Receiver down (hub restarted meanwhile), then 500, 500, a hang, then up: each alert arrives, none is lost."""
    config = hub_config(tmp_path, receiver, max_attempts=50, formats={"hook": "json", "chat": "slack"})
    token = add_token(str(tmp_path / "tokens.json"), "host", HOST)
    events = alertable_events()
    hub = HubProcess(config).start()
    try:
        assert post(hub, token, events)["accepted"] == [e.event_id for e in events]
        assert post(hub, token, events)["duplicates"] == [e.event_id for e in events]  # resent: queued once
        assert wait_until(lambda: len(hub.events("hub_alert_delivery_failed")) >= 4), hub.log_text()
        assert hub.stop() == 0
        pending = queue_rows(tmp_path, ["hook", "chat"])
        assert len(pending) == 4 and {r["state"] for r in pending} == {"pending"}
        hub.start()  # the queue lives in the database: the new process carries on
        receiver.up(["500", "500", "hang"])
        assert wait_until(lambda: {r["state"] for r in queue_rows(tmp_path, ["hook", "chat"])} == {"delivered"}), \
            hub.log_text()
    finally:
        hub.stop()
    wanted = {(name, e.event_id) for name in ("hook", "chat") for e in events[:2]}
    got = {(r["path"].strip("/"), r["delivery"].split(":")[2]) for r in receiver.delivered("/hook")
           + receiver.delivered("/chat")}
    assert got == wanted
    errors = " ".join(str(r["error"]) for r in hub.events("hub_alert_delivery_failed"))
    assert "ConnectionError" in errors and "HTTP 500" in errors and "ReadTimeout" in errors
    generic = next(r["body"] for r in receiver.delivered("/hook") if r["body"]["kind"] == "policy_violation")
    assert generic["severity"] == "critical" and generic["host_id"] == HOST and generic["event"]["payload"]["rule"]
    slack = next(r["body"] for r in receiver.delivered("/chat") if "policy_violation" in r["body"]["text"])
    assert set(slack) == {"text"} and "node&lt;7&gt;&amp;co" in slack["text"] and "<7>" not in slack["text"]


def test_an_alert_is_dead_lettered_after_the_attempt_limit(tmp_path: Path, receiver: Receiver) -> None:
    """A receiver that always answers 500 gets exactly alert_max_attempts tries; the row stays, marked dead."""
    config = hub_config(tmp_path, receiver, max_attempts=3, formats={"hook": "json"})
    token = add_token(str(tmp_path / "tokens.json"), "host", HOST)
    reader = add_token(str(tmp_path / "tokens.json"), "reader", "prometheus")
    receiver.up(["500"] * 100)
    violation = alertable_events()[0]
    hub = HubProcess(config).start()
    try:
        post(hub, token, [violation])
        assert wait_until(lambda: bool(hub.events("hub_alert_dead_lettered"))), hub.log_text()
        metrics = requests.get(f"{hub.url}/metrics", headers={"Authorization": f"Bearer {reader}"}, timeout=10).text
    finally:
        hub.stop()
    rows = queue_rows(tmp_path, ["hook"])
    assert [(r["event_id"], r["state"], r["attempts"], r["last_error"]) for r in rows] == [
        (violation.event_id, "dead", 3, "HTTP 500")]
    assert len(receiver.requests) == 3
    assert 'gpuguard_hub_alert_deliveries{state="dead",webhook="hook"} 1.0' in metrics


def test_backoff_doubles_up_to_the_cap_with_jitter() -> None:
    """Waits double from the initial one, never pass the cap, and jitter keeps them in [half, all]."""
    assert [backoff_seconds(n, 5, 60, rand=lambda: 1.0) for n in range(1, 7)] == [5, 10, 20, 40, 60, 60]
    assert backoff_seconds(3, 5, 60, rand=lambda: 0.0) == 10
    assert backoff_seconds(500, 5, 60, rand=lambda: 1.0) == 60


def test_messages_carry_the_event_in_both_formats() -> None:
    """The generic envelope has the event and a stable delivery id; Slack's text escapes the agent's text."""
    ev = event(HOST, "rollback", hostname="a<b>")
    delivery = Delivery("ops", HOST, ev.event_id, 2, ev.model_dump_json())
    generic = json.loads(message(AlertWebhook(name="ops", url="https://h/"), delivery))
    assert generic["delivery_id"] == f"ops:{HOST}:{ev.event_id}" and generic["attempt"] == 3
    assert generic["event"]["payload"]["kind"] == "rollback" and "rocm-core 6.3.1" in generic["summary"]
    slack = json.loads(message(AlertWebhook(name="ops", url="https://h/", format="slack"), delivery))
    assert "a&lt;b&gt;" in slack["text"] and "rolled back" in slack["text"]


def test_webhook_config_errors_are_one_line_each() -> None:
    """An unknown kind, a non-http URL and a bad format are all reported at once, naming the field."""
    text = ('[[alert_webhooks]]\nname = "x"\nurl = "ftp://h/"\nformat = "teams"\nkinds = ["policy_violation", '
            '"nope"]\n')
    with pytest.raises(ConfigError) as caught:
        parse_hub_settings(text, "hub.toml")
    problems = str(caught.value)
    assert "alert_webhooks -> 1 -> url" in problems and "alert_webhooks -> 1 -> format" in problems
    assert "unknown event kind(s) nope" in problems
    parsed = parse_hub_settings('[[alert_webhooks]]\nname = "ops"\nurl = "https://hooks.example/x"\n', "hub.toml")
    assert parsed.alert_webhooks[0].wants("cpu_fallback", "critical")
    assert not parsed.alert_webhooks[0].wants("heartbeat", "critical")
    assert not parsed.alert_webhooks[0].wants("policy_violation", "info")


def test_the_shipped_hub_toml_examples_parse_and_show_the_defaults() -> None:
    """packaging/config/hub.toml with its examples uncommented is valid; its commented values are the defaults."""
    text = (Path(__file__).resolve().parents[2] / "packaging" / "config" / "hub.toml").read_text()
    assert parse_hub_settings(text, "hub.toml").alert_webhooks == []
    active = "\n".join(line[2:] if re.match(r"^# ([a-z_]+ = |\[\[)", line) else line for line in text.splitlines())
    parsed = parse_hub_settings(active, "hub.toml")
    assert [(w.name, w.format, w.min_severity) for w in parsed.alert_webhooks] == [
        ("ops-chat", "slack", "warning"), ("pager", "json", "critical")]
    defaults = HubSettings()
    for key in ("stale_after_seconds", "dashboard_session_seconds", "alert_max_attempts", "alert_retry_initial_seconds",
                "alert_retry_max_seconds", "alert_timeout_seconds", "alert_poll_seconds"):
        assert getattr(parsed, key) == getattr(defaults, key), key



def test_an_alert_queued_by_ingest_is_stamped_with_the_hubs_clock(settings: HubSettings,
                                                                  tokens: Dict[str, str]) -> None:
    """A critical event posted to /v1/events is queued at the app's clock (here 2020), not the wall clock: a
    claim one second after the hub's time finds it due."""
    from fastapi.testclient import TestClient

    from agent.hub.app import create_app
    from tests.hub.conftest import bearer

    hook = AlertWebhook(name="ops", url="http://127.0.0.1:9/")
    hooked = settings.model_copy(update={"alert_webhooks": [hook]})
    hub_now = dt.datetime(2020, 1, 2, 3, 4, 5, tzinfo=dt.timezone.utc)
    bad = event("host-a", "cpu_fallback").model_copy(update={"severity": "critical"})
    with TestClient(create_app(hooked, make_store(hooked.database_url), clock=lambda: hub_now)) as client:
        assert client.post("/v1/events", content=batch_json([bad]), headers=bearer(tokens["host-a"])).status_code == 200
    store = make_store(hooked.database_url)
    store.open()
    try:
        queue = AlertQueue(store, [hook])
        queue.open()
        due = queue.claim(hub_now + dt.timedelta(seconds=1), 60)
    finally:
        store.close()
    assert [(d.host_id, d.event_id) for d in due] == [("host-a", bad.event_id)]
