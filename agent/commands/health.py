"""``gpuguard health run``: settings from the config file with command-line overrides, one check, one report."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any, Dict, TextIO

from agent.commands.options import add_config, add_group, add_json
from agent.defaults import DEFAULT_STATE_DIR

if TYPE_CHECKING:
    from agent.commands import HostFactory, Subparsers
    from agent.health.settings import HealthSettings


def add_parser(sub: Subparsers) -> None:
    health_sub = add_group(sub, "health", "accelerator health check: prove the ML stack runs on the GPUs")
    run = health_sub.add_parser("run", help="run the probe once, compare with the baseline, print the result "
                                            "(exit 0 pass, 20 regression, 21 cpu_fallback, 22 failed, "
                                            "23 timeout, 24 skipped (also: no GPU), 25 busy, 26 deferred (also: "
                                            "another check still running after --wait-seconds); errors: 15 the "
                                            "probe's user is missing)")
    add_json(run, "print the result as JSON instead of a table")
    run.add_argument("--python", metavar="PATH", help="interpreter of the ML stack to probe (default: config)")
    run.add_argument("--timeout-seconds", type=float, metavar="N", help="kill the probe after N seconds")
    run.add_argument("--throttle-fraction", type=float, metavar="F",
                     help="make the probe slow its own work by F (tests the regression alarm)")
    run.add_argument("--wait-seconds", type=float, metavar="N",
                     help="wait up to N seconds for a health check already running (the daemon's) to finish, "
                          "then run; still running then: deferred, exit 26 (default: config, 600)")
    run.add_argument("--mode", choices=("auto", "functional", "full"),
                     help="auto: judge speed on idle GPUs only; functional: never judge speed; full: wait (deferred) "
                          "while another job uses a GPU (default: config, auto)")
    add_config(run)
    run.add_argument("--state-dir", metavar="DIR", help=f"where baselines live (default: config, {DEFAULT_STATE_DIR})")
    run.set_defaults(handler=health_run)


def health_run(args: argparse.Namespace, make_host: HostFactory, out: TextIO) -> int:
    """Run the check, print a table (or JSON), return the status's exit code (0 only for a pass)."""
    from agent.config import load_settings
    from agent.health.render import render_result
    from agent.health.runner import run_health_check

    settings = load_settings(args.config)
    health = _health_settings(settings.health, {"python": args.python, "timeout_seconds": args.timeout_seconds,
                                                "throttle_fraction": args.throttle_fraction, "mode": args.mode,
                                                "check_lock_wait_seconds": args.wait_seconds})
    result = run_health_check(make_host("/"), health, args.state_dir or settings.agent.state_dir,
                              on_lock_wait=lambda line: print(line, file=sys.stderr, flush=True))
    out.write(result.to_json() if args.json else render_result(result))
    return result.exit_code


def _health_settings(base: HealthSettings, overrides: Dict[str, Any]) -> HealthSettings:
    """``base`` with the given command-line values (None means not given), validated like the config file."""
    from pydantic import ValidationError

    from agent.errors import UsageError
    from agent.health.settings import HealthSettings
    from agent.validation import validation_problems

    given = {key: value for key, value in overrides.items() if value is not None}
    try:
        return HealthSettings.model_validate({**base.model_dump(), **given})
    except ValidationError as exc:
        raise UsageError("; ".join(validation_problems(exc.errors()))) from None
