"""Hub settings: defaults, TOML loading, every problem reported at once."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from agent.errors import ConfigError
from agent.hub.settings import HubSettings, load_hub_settings, parse_hub_settings


def test_defaults_listen_on_loopback_with_sqlite_and_a_1_mib_limit() -> None:
    """The hub's defaults: loopback port 8470, SQLite under /var/lib/gpuguard, a 1 MiB body limit, a token for the
    fleet API."""
    settings = HubSettings()
    assert (settings.listen_host, settings.listen_port) == ("127.0.0.1", 8470)
    assert settings.database_url == "sqlite:////var/lib/gpuguard/hub.db"
    assert settings.max_body_bytes == 1024 * 1024
    assert settings.fleet_api_requires_token is True


def test_toml_keys_override_defaults() -> None:
    """Keys in hub.toml override the defaults."""
    settings = parse_hub_settings('listen_port = 9000\ndatabase_url = "postgresql://hub@db/hub"\n')
    assert settings.listen_port == 9000 and settings.database_url.startswith("postgresql://")


def test_every_problem_is_reported_at_once() -> None:
    """Every invalid or unknown key of hub.toml is reported in one ConfigError under the file's name."""
    with pytest.raises(ConfigError) as caught:
        parse_hub_settings('listen_port = 70000\ndatabase_url = "mysql://x"\nmax_body_bytes = 1\nbogus = 1\n',
                           "hub.toml")
    problems = " ".join(caught.value.problems)
    assert len(caught.value.problems) == 4
    for field in ("listen_port", "database_url", "max_body_bytes", "bogus"):
        assert field in problems
    assert str(caught.value).startswith("hub.toml: ")


def test_broken_toml_is_one_problem() -> None:
    """hub.toml that is not TOML is one ConfigError saying so."""
    with pytest.raises(ConfigError, match="not valid TOML"):
        parse_hub_settings("listen_port = ")


def test_a_missing_file_means_defaults_unless_required(tmp_path: Path) -> None:
    """A missing hub.toml gives the defaults, unless the file is required, then it is a ConfigError."""
    assert load_hub_settings(str(tmp_path / "absent.toml")) == HubSettings()
    with pytest.raises(ConfigError, match="no such file"):
        load_hub_settings(str(tmp_path / "absent.toml"), required=True)


def test_settings_are_frozen() -> None:
    """Hub settings cannot be assigned to after they are made."""
    with pytest.raises(ValidationError, match="frozen"):
        HubSettings().listen_port = 1  # type: ignore[misc]
