"""The [report] and [daemon] settings: defaults, and every problem reported at once."""

from __future__ import annotations

import pytest

from agent.config import Settings, parse_settings
from agent.errors import ConfigError


def test_defaults_keep_events_queued_without_an_endpoint() -> None:
    """No endpoint by default; TLS verification on; metrics under the state directory."""
    report = Settings().report
    assert report.endpoint_url is None and report.ingest_url is None and report.ca_bundle is None
    assert report.metrics_path("/var/lib/gpuguard") == "/var/lib/gpuguard/metrics/gpuguard.prom"


def test_ingest_url_is_the_endpoint_plus_the_events_path() -> None:
    """A trailing slash does not double up."""
    settings = parse_settings('[report]\nendpoint_url = "https://hub.example:8443/gpuguard/"\n')
    assert settings.report.ingest_url == "https://hub.example:8443/gpuguard/v1/events"


@pytest.mark.parametrize("url", ["http://127.0.0.1:9000", "http://localhost", "http://[::1]:80"])
def test_plain_http_is_allowed_to_loopback(url: str) -> None:
    """The token never leaves the machine over loopback."""
    assert parse_settings(f'[report]\nendpoint_url = "{url}"\n').report.endpoint_url == url


def test_plain_http_to_a_remote_host_needs_an_explicit_opt_in() -> None:
    """Sending the bearer token in the clear is refused unless allow_plain_http is set."""
    with pytest.raises(ConfigError, match="plain http"):
        parse_settings('[report]\nendpoint_url = "http://hub.example"\n')
    ok = parse_settings('[report]\nendpoint_url = "http://hub.example"\nallow_plain_http = true\n')
    assert ok.report.endpoint_url == "http://hub.example"


def test_every_problem_is_reported_at_once() -> None:
    """Bad URL, bad batch size, bad timeout and a bad daemon interval all show in one error."""
    text = ('[report]\nendpoint_url = "ftp://x"\nbatch_size = 0\nread_timeout_seconds = -1\n'
            '[daemon]\npackage_watch_interval_seconds = 0\n')
    with pytest.raises(ConfigError) as caught:
        parse_settings(text, "agent.toml")
    problems = caught.value.problems
    assert len(problems) == 4
    assert any(p.startswith("report -> endpoint_url:") for p in problems)
    assert any(p.startswith("report -> batch_size:") for p in problems)
    assert any(p.startswith("daemon -> package_watch_interval_seconds:") for p in problems)


def test_backoff_cap_below_base_is_refused() -> None:
    """The cap bounds the base, not the other way round."""
    with pytest.raises(ConfigError, match="backoff_cap_seconds"):
        parse_settings("[report]\nbackoff_base_seconds = 10\nbackoff_cap_seconds = 1\n")


@pytest.mark.parametrize("url", ["https://hub.example:8443/v1/events", "https://hub.example:8443/v1/events/",
                                 "https://hub.example:8443"])
def test_the_full_ingest_url_means_the_same_hub(url: str) -> None:
    """On the H200 an endpoint_url ending in /v1/events was POSTed to .../v1/events/v1/events (HTTP 404)."""
    settings = parse_settings(f'[report]\nendpoint_url = "{url}"\n')
    assert settings.report.ingest_url == "https://hub.example:8443/v1/events"


def test_a_hub_behind_a_path_prefix_keeps_its_prefix() -> None:
    """An endpoint URL behind a path prefix is used as given, prefix kept."""
    settings = parse_settings('[report]\nendpoint_url = "https://proxy.example/gpuguard/v1/events"\n')
    assert settings.report.ingest_url == "https://proxy.example/gpuguard/v1/events"
