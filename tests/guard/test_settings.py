"""[guard] settings: package_tool_timeout_seconds, and apt_timeout_seconds still read under its old name."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path
from typing import Iterator

import pytest

from agent.config import load_settings, parse_settings
from agent.errors import ConfigError
from agent.guard.manager import apt_tool_for, dnf_tool_for
from agent.host import Host
from agent.log import configure
from agent.statepaths import StatePaths


@pytest.fixture
def logged() -> Iterator[io.StringIO]:
    """Warnings logged during the test, as JSON lines."""
    stream = io.StringIO()
    configure(level="warning", json_output=True, stream=stream)
    yield stream
    configure(level="warning", json_output=True, stream=sys.stderr)


def warnings_of(stream: io.StringIO) -> list:
    return [json.loads(line) for line in stream.getvalue().splitlines() if line.startswith("{")]


def test_the_timeout_defaults_to_900_seconds_for_both_tools(tmp_path: Path) -> None:
    """Without the key both apt-get/dpkg and dnf/rpm commands may take 900 s."""
    guard = parse_settings("").guard
    host = Host.for_root(str(tmp_path))
    assert guard.package_tool_timeout_seconds == 900.0
    assert apt_tool_for(host, guard).timeout_seconds == 900.0
    assert dnf_tool_for(host, guard, StatePaths()).timeout_seconds == 900.0


def test_the_new_key_times_apt_and_dnf_without_a_warning(tmp_path: Path, logged: io.StringIO) -> None:
    """package_tool_timeout_seconds reaches the AptTool and the DnfTool; nothing is logged."""
    config = tmp_path / "agent.toml"
    config.write_text("[guard]\npackage_tool_timeout_seconds = 30\n")
    guard = load_settings(str(config)).guard
    host = Host.for_root(str(tmp_path))
    assert (apt_tool_for(host, guard).timeout_seconds, dnf_tool_for(host, guard, StatePaths()).timeout_seconds) == (
        30.0, 30.0)
    assert warnings_of(logged) == []


def test_the_old_key_is_read_with_a_warning_naming_the_file_and_both_keys(tmp_path: Path,
                                                                          logged: io.StringIO) -> None:
    """apt_timeout_seconds = 45 sets the new key; one config_key_renamed warning names the file and both keys."""
    config = tmp_path / "agent.toml"
    config.write_text("[guard]\napt_timeout_seconds = 45\n")
    assert load_settings(str(config)).guard.package_tool_timeout_seconds == 45.0
    (line,) = warnings_of(logged)
    assert (line["event"], line["level"], line["path"], line["key"], line["replaced_by"]) == (
        "config_key_renamed", "warning", str(config), "guard.apt_timeout_seconds", "guard.package_tool_timeout_seconds")


def test_both_keys_at_once_are_one_config_error(tmp_path: Path) -> None:
    """The old and the new key together are refused in one line naming the file and both keys."""
    config = tmp_path / "agent.toml"
    config.write_text("[guard]\napt_timeout_seconds = 45\npackage_tool_timeout_seconds = 30\n")
    with pytest.raises(ConfigError) as caught:
        load_settings(str(config))
    assert str(config) in str(caught.value)
    assert list(caught.value.problems) == [
        "guard: apt_timeout_seconds is the old name of package_tool_timeout_seconds: give only "
        "package_tool_timeout_seconds"]


def test_the_old_key_is_checked_like_the_new_one() -> None:
    """A bad value under the old name is reported as the new key's problem, like any other bad number."""
    with pytest.raises(ConfigError) as caught:
        parse_settings("[guard]\napt_timeout_seconds = 0\n", "agent.toml")
    assert list(caught.value.problems) == ["guard -> package_tool_timeout_seconds: Input should be greater than 0"]
