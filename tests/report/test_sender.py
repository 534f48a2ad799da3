"""The sender against a real HTTP(S) receiver on 127.0.0.1: outcomes, timeouts, TLS."""

from __future__ import annotations

import socket
import time

import pytest

from agent.errors import DeliveryError
from agent.report.events import EventBatch
from agent.report.sender import Sender
from agent.report.settings import ReportSettings
from tests.report.events import event
from tests.report.receiver import Receiver

TOKEN = "test-token-0123456789"


def sender_for(url: str, token: str = TOKEN, **settings: object) -> Sender:
    report = ReportSettings(endpoint_url=url, connect_timeout_seconds=1.0, read_timeout_seconds=0.5, **settings)
    return Sender(report, token)


def batch(n: int = 2) -> EventBatch:
    return EventBatch(events=[event() for _ in range(n)])


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_accepted_then_duplicate_on_resend(receiver: Receiver) -> None:
    """The receiver takes a batch once; sending it again is acknowledged as duplicates."""
    sender, sent = sender_for(receiver.url), batch(3)
    first = sender.send(sent)
    assert first.accepted == [e.event_id for e in sent.events] and first.duplicates == []
    second = sender.send(sent)
    assert second.accepted == [] and second.acknowledged == [e.event_id for e in sent.events]


@pytest.mark.parametrize("mode, category, retryable", [
    ("error500", "server", True),
    ("too_large_over:1", "too_large", False),
])
def test_error_statuses_map_to_categories(receiver: Receiver, mode: str, category: str, retryable: bool) -> None:
    """5xx is retryable, 413 is not (the batch must be split)."""
    receiver.mode = mode
    with pytest.raises(DeliveryError) as caught:
        sender_for(receiver.url).send(batch())
    assert (caught.value.category, caught.value.retryable) == (category, retryable)


def test_invalid_events_are_rejected_not_retried(receiver: Receiver) -> None:
    """A 422 for a batch says the events themselves are refused."""
    target = event()
    receiver.mode = f"reject:{target.event_id}"
    with pytest.raises(DeliveryError) as caught:
        sender_for(receiver.url).send(EventBatch(events=[target]))
    assert caught.value.category == "rejected" and not caught.value.retryable


def test_wrong_token_is_an_auth_failure_and_never_shows_the_token(receiver: Receiver) -> None:
    """401 is retryable (the token may be fixed) and the message does not carry the token."""
    sender = sender_for(receiver.url, token="wrong-secret-token-value")
    with pytest.raises(DeliveryError) as caught:
        sender.send(batch())
    assert caught.value.category == "auth" and caught.value.status_code == 401
    assert "wrong-secret-token-value" not in str(caught.value) + repr(sender)


def test_hanging_endpoint_times_out(receiver: Receiver) -> None:
    """A reply that never comes ends at the read timeout as a retryable timeout."""
    receiver.mode = "hang"
    started = time.monotonic()
    with pytest.raises(DeliveryError) as caught:
        sender_for(receiver.url).send(batch())
    assert caught.value.category == "timeout" and caught.value.retryable
    assert time.monotonic() - started < 30  # the 0.5 s read timeout, not the receiver's 60 s hang: load-proof


def test_endpoint_down_is_unreachable() -> None:
    """Nothing listening is a retryable 'unreachable'."""
    with pytest.raises(DeliveryError) as caught:
        sender_for(f"http://127.0.0.1:{free_port()}").send(batch())
    assert caught.value.category == "unreachable" and caught.value.retryable


def test_self_signed_certificate_is_refused_by_default(certificates) -> None:  # type: ignore[no-untyped-def]
    """TLS verification is on: an unknown CA is a 'tls' failure and nothing is stored."""
    tls_receiver = Receiver(tls=certificates[0]).start()
    try:
        with pytest.raises(DeliveryError) as caught:
            sender_for(tls_receiver.url).send(batch())
        assert caught.value.category == "tls"
        assert tls_receiver.stored == {}
    finally:
        tls_receiver.stop()


def test_certificate_is_accepted_with_the_right_ca_bundle(certificates) -> None:  # type: ignore[no-untyped-def]
    """With ca_bundle naming the issuing CA, the same endpoint is trusted."""
    tls_receiver = Receiver(tls=certificates[0]).start()
    try:
        result = sender_for(tls_receiver.url, ca_bundle=certificates[0][0]).send(batch(1))
        assert len(result.accepted) == 1
    finally:
        tls_receiver.stop()


def test_certificate_for_another_name_is_refused(certificates) -> None:  # type: ignore[no-untyped-def]
    """A trusted certificate issued for another host name does not do for 127.0.0.1."""
    tls_receiver = Receiver(tls=certificates[1]).start()
    try:
        with pytest.raises(DeliveryError) as caught:
            sender_for(tls_receiver.url, ca_bundle=certificates[1][0]).send(batch(1))
        assert caught.value.category == "tls"
    finally:
        tls_receiver.stop()
