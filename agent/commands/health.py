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

STATE_DIR_HELP = f"where baselines live (default: config, {DEFAULT_STATE_DIR})"


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
    run.add_argument("--state-dir", metavar="DIR", help=STATE_DIR_HELP)
    run.set_defaults(handler=health_run)
    base_sub = add_group(health_sub, "baseline", "the stored per-GPU baselines the checks compare with")
    show = base_sub.add_parser("show", help="per fingerprint and GPU: the figures, how many runs, since when and by "
                                            "which rule (first runs, drift, reset); suspicious ones named")
    add_json(show, "print the baselines as JSON")
    add_config(show)
    show.add_argument("--state-dir", metavar="DIR", help=STATE_DIR_HELP)
    show.set_defaults(handler=baseline_show)
    reset = base_sub.add_parser("reset", help="clear the baselines (or one GPU's figures), audited: the next "
                                              "corroborated runs establish them again")
    reset.add_argument("--gpu", type=int, metavar="N", help="only GPU N's figures (learned again from the next runs)")
    reset.add_argument("--reason", default="", help="why (written to the audit log)")
    add_config(reset)
    reset.add_argument("--state-dir", metavar="DIR", help=STATE_DIR_HELP)
    reset.set_defaults(handler=baseline_reset)


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


def baseline_show(args: argparse.Namespace, make_host: HostFactory, out: TextIO) -> int:
    """Print the baselines per fingerprint and GPU, and the stored figures beyond the host's SKU limits."""
    import json
    from pathlib import Path

    from agent.config import load_settings
    from agent.health.baseline import BaselineStore, last_snapshot_limits, scope_views, suspicious_baselines
    from agent.health.render import render_baselines
    from agent.statepaths import StatePaths

    settings = load_settings(args.config)
    host = make_host("/")
    paths = StatePaths(args.state_dir or settings.agent.state_dir)
    data = BaselineStore(Path(paths.health_baselines)).load()
    limits = last_snapshot_limits(host, paths.last_snapshot)
    views = scope_views(data)
    suspicious = suspicious_baselines(data, limits)
    if args.json:
        out.write(json.dumps({"baselines": [v.model_dump(mode="json") for v in views],
                              "resets": [r.model_dump(mode="json") for r in data.resets], "sku_limits": limits.name,
                              "suspicious": [s.model_dump(mode="json") for s in suspicious]},
                             sort_keys=True, indent=2) + "\n")
    else:
        out.write(render_baselines(views, suspicious, data.resets, limits.name))
    return 0


def baseline_reset(args: argparse.Namespace, make_host: HostFactory, out: TextIO) -> int:
    """Clear the baselines (or GPU N's figures) under the store's lock, and write the audit line."""
    from pathlib import Path

    from agent.config import load_settings
    from agent.errors import InputFileError, UsageError
    from agent.guard.hotpath.overrides import audit, who
    from agent.health.baseline import BaselineStore, reset, scope_views
    from agent.statepaths import StatePaths

    if args.gpu is not None and not 0 <= args.gpu < 1024:
        raise UsageError(f"--gpu {args.gpu}: a GPU index is 0..1023")
    settings = load_settings(args.config)
    host = make_host("/")
    paths = StatePaths(args.state_dir or settings.agent.state_dir)
    store = BaselineStore(Path(paths.health_baselines))
    now = host.clock()
    by = who()
    try:
        with store.locked():
            before = store.load()
            store.save(reset(before, now, by, args.gpu))
    except OSError as exc:
        raise InputFileError(str(store.path), exc.strerror or str(exc)) from None
    cleared = [v.model_dump(mode="json") for v in scope_views(before)
               if args.gpu is None or v.scope == f"gpu{args.gpu}"]
    audit(paths.audit_log, "health_baseline_reset", now, gpu=args.gpu, by=by, reason=args.reason,
          cleared=cleared)
    what = "every baseline" if args.gpu is None else f"GPU {args.gpu}'s baseline figures"
    out.write(f"reset {what} ({len(cleared)} cleared); the next corroborated runs establish them again; "
              f"audited in {paths.audit_log}\n")
    return 0


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
