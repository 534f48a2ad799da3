"""Hub settings: defaults, TOML loading, every problem reported at once."""

from __future__ import annotations

import json
from pathlib import Path
from typing import List

import pytest
from pydantic import ValidationError

from agent.errors import ConfigError
from agent.hub.settings import HubSettings, load_hub_settings, parse_hub_settings
from tests.conftest import run_fresh_python

_LOAD = """
import json, sys
sys.path.insert(0, sys.argv[1])
import agent.hub.app, agent.hub.server
from agent.hub.settings import load_hub_settings
load_hub_settings(sys.argv[2], required=True)
print(json.dumps(sorted(sys.modules)))
"""


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


def agent_settings_modules(modules: List[str]) -> List[str]:
    """The agent's settings modules among ``modules``: agent/config.py and any area's ``settings`` module but the hub's
    own (``agent.hub.settings``, ``agent.hub.alert_settings``)."""
    return sorted(m for m in modules if m == "agent.config" or (
        m.startswith("agent.") and m.rsplit(".", 1)[-1].endswith("settings") and not m.startswith("agent.hub.")))


def test_the_settings_module_filter_finds_agent_settings() -> None:
    """The filter itself: agent/config.py and guard's settings are found, the hub's own and other modules are not."""
    assert agent_settings_modules(["agent.config", "agent.guard.settings", "agent.hub.settings",
                                   "agent.hub.alert_settings", "agent.configfile", "agent.report.events"]) == [
        "agent.config", "agent.guard.settings"]


def test_the_hub_loads_only_its_own_settings(tmp_path: Path) -> None:
    """Loading hub.toml with the app and the server imported loads no agent settings model, nor agent/config.py."""
    config = tmp_path / "hub.toml"
    config.write_text("listen_port = 9000\n")
    modules = json.loads(run_fresh_python(_LOAD, str(config)).strip().splitlines()[-1])
    assert "agent.hub.settings" in modules and "agent.configfile" in modules
    assert agent_settings_modules(modules) == []
