"""The sender against a real HTTP(S) receiver on 127.0.0.1: outcomes, timeouts, TLS, the token file, backoff."""

from __future__ import annotations

import os
import random
import socket
import time
from pathlib import Path

import pytest

from agent.errors import ConfigError, DeliveryError
from agent.report.events import EventBatch
from agent.report.sender import Backoff, Sender, check_ca_bundle, load_token
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
    assert time.monotonic() - started < 5


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


def test_token_file_is_read_and_stripped(token_file: Path) -> None:
    """A 0600 file owned by us gives its one word."""
    assert load_token(str(token_file)) == TOKEN


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o660])
def test_token_file_open_to_group_or_others_is_refused(token_file: Path, mode: int) -> None:
    """Group- or world-accessible token files are a config error naming the mode and the fix."""
    os.chmod(token_file, mode)
    with pytest.raises(ConfigError) as caught:
        load_token(str(token_file))
    assert f"mode {mode:04o}" in str(caught.value) and "chmod 600" in str(caught.value)
    assert TOKEN not in str(caught.value)


def test_missing_or_empty_token_file_is_refused(tmp_path: Path) -> None:
    """Both are config errors that name the file."""
    with pytest.raises(ConfigError, match="does not exist"):
        load_token(str(tmp_path / "nope"))
    empty = tmp_path / "empty"
    empty.write_text("\n")
    os.chmod(empty, 0o600)
    with pytest.raises(ConfigError, match="empty"):
        load_token(str(empty))


def test_backoff_is_exponential_with_full_jitter_and_a_cap() -> None:
    """Each delay lies in [0, min(cap, base * 2**n)], spreads over that range, and reset starts again."""
    backoff = Backoff(0.5, 8.0, random.Random(7))
    ceilings = [0.5, 1.0, 2.0, 4.0, 8.0, 8.0, 8.0]
    for ceiling in ceilings:
        assert 0.0 <= backoff.next_delay_seconds() <= ceiling
    samples = [Backoff(1.0, 64.0, random.Random(seed)) for seed in range(200)]
    for b in samples:
        for _ in range(4):
            b.next_delay_seconds()
    fifth = [b.next_delay_seconds() for b in samples]
    assert max(fifth) <= 16.0 and min(fifth) < 2.0 and max(fifth) > 14.0
    backoff.reset()
    assert backoff.failures == 0 and backoff.next_delay_seconds() <= 0.5


def test_ca_bundle_must_be_a_readable_pem_file(tmp_path: Path, certificates) -> None:  # type: ignore[no-untyped-def]
    """A missing or non-PEM bundle is a config error at start, not a TLS failure at every delivery."""
    check_ca_bundle(certificates[0][0])
    check_ca_bundle(str(tmp_path))  # a c_rehash'ed directory
    with pytest.raises(ConfigError, match="cannot be read"):
        check_ca_bundle(str(tmp_path / "missing.pem"))
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate\n")
    with pytest.raises(ConfigError, match="no PEM certificate"):
        check_ca_bundle(str(junk))
