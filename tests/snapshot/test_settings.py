"""`[snapshot]`: one declaration, one rule set, read alike by `gpuguard snapshot` (no pydantic) and the daemon."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent.config import parse_settings
from agent.defaults import DEFAULT_WATCHED_PATTERNS
from agent.errors import ConfigError
from agent.snapshot.settings import SnapshotSettings, load_snapshot_settings
from tests.conftest import run_fresh_python


def _both(tmp_path: Path, text: str):
    """(what the snapshot command reads, what the daemon reads) from the same file; a ConfigError stands for itself."""
    path = tmp_path / "agent.toml"
    path.write_text(text)
    results = []
    for read in (lambda: load_snapshot_settings(str(path)), lambda: parse_settings(text, str(path)).snapshot):
        try:
            results.append(read())
        except ConfigError as exc:
            results.append(exc)
    return results


def test_defaults_without_a_file(tmp_path: Path) -> None:
    """No file: the defaults, the watched patterns first."""
    settings = load_snapshot_settings(str(tmp_path / "absent.toml"))
    assert settings == SnapshotSettings() == parse_settings("").snapshot
    assert settings.interval_seconds == 300.0
    assert settings.all_watched_packages == list(DEFAULT_WATCHED_PATTERNS)


def test_both_readers_take_the_same_values(tmp_path: Path) -> None:
    """An integer interval becomes a float; extra patterns follow the watched ones, in both readers."""
    command, daemon = _both(tmp_path, '[snapshot]\ninterval_seconds = 60\nwatched_packages = ["linux-image-*"]\n'
                                      'extra_watched_packages = ["python3"]\n[daemon]\nhealth_enabled = false\n')
    assert command == daemon == SnapshotSettings(interval_seconds=60.0, watched_packages=["linux-image-*"],
                                                 extra_watched_packages=["python3"])
    assert isinstance(command.interval_seconds, float)
    assert command.all_watched_packages == ["linux-image-*", "python3"]


@pytest.mark.parametrize("section, problems", [
    ("interval_seconds = 0", ["snapshot -> interval_seconds: Input should be greater than 0"]),
    ("interval_seconds = -5\nbogus = 1", ["snapshot -> bogus: Extra inputs are not permitted",
                                          "snapshot -> interval_seconds: Input should be greater than 0"]),
    ('interval_seconds = "300"', ["snapshot -> interval_seconds: Input should be a valid number"]),
    ("interval_seconds = true", ["snapshot -> interval_seconds: Input should be a valid number"]),
    ("interval_seconds = inf", ["snapshot -> interval_seconds: Input should be a finite number"]),
    ('watched_packages = "nvidia-*"', ["snapshot -> watched_packages: Input should be a valid list"]),
    ('extra_watched_packages = ["a", 2, "c", 4]', ["snapshot -> extra_watched_packages -> 2: Input should be a "
                                                   "valid string", "snapshot -> extra_watched_packages -> 4: "
                                                   "Input should be a valid string"]),
])
def test_both_readers_report_the_same_problems(tmp_path: Path, section: str, problems: list) -> None:
    """A bad [snapshot] gives every problem, as ``file: snapshot -> field: message``, from both readers."""
    command, daemon = _both(tmp_path, f"[snapshot]\n{section}\n")
    assert isinstance(command, ConfigError) and isinstance(daemon, ConfigError)
    assert command.problems == daemon.problems == tuple(problems)
    assert str(command) == str(daemon) and str(command).startswith(f"{tmp_path / 'agent.toml'}: snapshot -> ")


def test_the_daemon_also_reports_other_sections(tmp_path: Path) -> None:
    """The daemon lists the [snapshot] problem beside another section's; the snapshot command only its own."""
    command, daemon = _both(tmp_path, "[snapshot]\ninterval_seconds = 0\n[daemon]\nhealth_enabled = 3\n")
    assert command.problems == ("snapshot -> interval_seconds: Input should be greater than 0",)
    assert "snapshot -> interval_seconds: Input should be greater than 0" in daemon.problems
    assert any(p.startswith("daemon -> health_enabled") for p in daemon.problems)


def test_a_snapshot_key_that_is_not_a_table(tmp_path: Path) -> None:
    """``snapshot = 5`` is one problem naming the section."""
    command, daemon = _both(tmp_path, "snapshot = 5\n")
    assert command.problems == daemon.problems == ("snapshot: Input should be a valid dictionary or instance of "
                                                   "SnapshotSettings",)


def test_the_daemons_settings_round_trip_through_json() -> None:
    """Settings dumped to JSON (what a job child is handed) validate back to equal [snapshot] settings."""
    settings = parse_settings('[snapshot]\ninterval_seconds = 60\nextra_watched_packages = ["python3"]\n')
    dumped = json.loads(json.dumps(settings.model_dump(mode="json")))
    assert dumped["snapshot"]["interval_seconds"] == 60.0
    assert type(settings).model_validate(dumped).snapshot == settings.snapshot


def test_settings_dump_in_a_fresh_process() -> None:
    """A new process (the daemon handing settings to a job child) dumps [snapshot] before any snapshot was read
    back, that is before the records are also dataclasses pydantic knows (agent/frozen.py as_dataclasses)."""
    code = ("import json, sys; sys.path.insert(0, sys.argv[1]); from agent.config import Settings; "
            "import agent.frozen as f; assert not f._as_dataclasses; "
            "print(json.dumps(Settings().model_dump(mode='json')['snapshot']['interval_seconds']))")
    assert run_fresh_python(code).strip() == "300.0"

