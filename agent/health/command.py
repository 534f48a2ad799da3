"""``gpuguard health run``: settings from the config file with command-line overrides, one check, one report."""

from __future__ import annotations

from typing import Any, Callable, Dict, Optional, TextIO

from pydantic import ValidationError

from agent.config import load_settings
from agent.errors import UsageError
from agent.health.render import render_result
from agent.health.runner import run_health_check
from agent.health.settings import HealthSettings
from agent.host import Host
from agent.validation import validation_problems


def health_settings(base: HealthSettings, overrides: Dict[str, Any]) -> HealthSettings:
    """``base`` with the given command-line values (None means not given), validated like the config file."""
    given = {key: value for key, value in overrides.items() if value is not None}
    try:
        return HealthSettings.model_validate({**base.model_dump(), **given})
    except ValidationError as exc:
        raise UsageError("; ".join(validation_problems(exc.errors()))) from None


def health_run(make_host: Callable[[str], Host], out: TextIO, config_path: str, json_output: bool = False,
               python: Optional[str] = None, timeout_seconds: Optional[float] = None,
               throttle_fraction: Optional[float] = None, state_dir: Optional[str] = None,
               mode: Optional[str] = None) -> int:
    """Run the check, print a table (or JSON), return the status's exit code (0 only for a pass)."""
    settings = load_settings(config_path)
    health = health_settings(settings.health, {"python": python, "timeout_seconds": timeout_seconds,
                                               "throttle_fraction": throttle_fraction, "mode": mode})
    result = run_health_check(make_host("/"), health, state_dir or settings.agent.state_dir)
    out.write(result.to_json() if json_output else render_result(result))
    return result.exit_code
