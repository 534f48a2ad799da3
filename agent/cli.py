"""The ``gpuguard`` command: parses arguments and dispatches; known errors become one line and an exit code.

Each command imports what it needs inside its handler: building the parser needs only argparse and the default
paths (agent/defaults.py), so ``gpuguard snapshot`` loads no settings model of another area, no scheduler, no HTTP
client and no logger it does not use (tests/test_cli_imports.py pins this).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING, Any, Callable, List, Optional, Sequence, TextIO, Tuple

from agent import __version__
from agent.defaults import DEFAULT_CONFIG_PATH, DEFAULT_HUB_CONFIG_PATH, JOB_NAMES
from agent.errors import GpuguardError
from agent.log import configure, get_logger

if TYPE_CHECKING:
    from agent.host import Host

HostFactory = Callable[[str], "Host"]
ParserAdder = Callable[["argparse._SubParsersAction[argparse.ArgumentParser]"], None]


def _cmd_snapshot(args: argparse.Namespace, make_host: HostFactory, out: TextIO) -> int:
    from agent.files import write_atomically

    if args.diff:
        from agent.snapshot.diff import diff_snapshots, render_diff
        from agent.snapshot.io import load_snapshot

        diff = diff_snapshots(load_snapshot(args.diff[0]), load_snapshot(args.diff[1]))
        out.write(diff.model_dump_json(indent=2) + "\n" if args.json else render_diff(diff))
        return 0
    from agent.collectors import default_collectors
    from agent.snapshot.render import render_snapshot
    from agent.snapshot.settings import load_snapshot_settings
    from agent.snapshot.take import take_snapshot

    settings = load_snapshot_settings(args.config)
    snap = take_snapshot(make_host(args.root), default_collectors(settings.all_watched_packages))
    if args.output:
        write_atomically(args.output, snap.to_json())
    out.write(snap.to_json() if args.json else render_snapshot(snap))
    return 0


def _cmd_run(args: argparse.Namespace, make_host: HostFactory, out: TextIO) -> int:
    from agent.daemon_jobs.openssl import keep_openssl_out

    keep_openssl_out()  # before pydantic, structlog and apscheduler would load it
    from agent.daemon import run_daemon

    return run_daemon(args.config, make_host(args.root))


def _cmd_job(args: argparse.Namespace, make_host: HostFactory, out: TextIO) -> int:
    from agent.daemon_jobs.child_main import parse_request, run_job

    return run_job(args.job, args.config, make_host(args.root), parse_request(args.request), args.result)


def _cmd_status(args: argparse.Namespace, make_host: HostFactory, out: TextIO) -> int:
    from agent.status.command import slurm_check, status

    if args.slurm or args.drain:
        return slurm_check(make_host(args.root), args.config, args.drain, args.node_name, out)
    return status(make_host(args.root), args.config, args.json, args.offline, out)


def _cmd_schema(args: argparse.Namespace, make_host: HostFactory, out: TextIO) -> int:
    from agent.files import write_atomically
    from agent.report.schema import render_schema

    if args.output:
        write_atomically(args.output, render_schema())
    else:
        out.write(render_schema())
    return 0


def _cmd_hub_serve(args: argparse.Namespace, make_host: HostFactory, out: TextIO) -> int:
    from agent.hub.server import serve
    from agent.hub.settings import load_hub_settings

    # An explicit --config must exist; the default path may be absent (defaults apply).
    settings = load_hub_settings(args.config or DEFAULT_HUB_CONFIG_PATH, required=args.config is not None)
    configure(level=settings.log_level)
    serve(settings)
    return 0


def _cmd_hub_add(args: argparse.Namespace, make_host: HostFactory, out: TextIO) -> int:
    from agent.hub.settings import load_hub_settings
    from agent.hub.tokens import add_token

    tokens_file = args.tokens_file or load_hub_settings(args.config or DEFAULT_HUB_CONFIG_PATH,
                                                        required=args.config is not None).tokens_file
    token = add_token(tokens_file, args.role, args.subject, rotate=args.rotate)
    out.write(token + "\n")
    print(f"gpuguard: {args.role} token for {args.subject!r} stored (hash only) in {tokens_file}; "
          "it is shown this once", file=sys.stderr)
    return 0


def _cmd_health_run(args: argparse.Namespace, make_host: HostFactory, out: TextIO) -> int:
    from agent.health.command import health_run

    return health_run(make_host, out, args.config, json_output=args.json, python=args.python,
                      timeout_seconds=args.timeout_seconds, throttle_fraction=args.throttle_fraction,
                      state_dir=args.state_dir, mode=args.mode)


def _guard_command(name: str) -> Callable[[argparse.Namespace, HostFactory, TextIO], int]:
    """A handler from agent.guard.commands, imported only when that command runs."""

    def handler(args: argparse.Namespace, make_host: HostFactory, out: TextIO) -> int:
        from agent.guard import commands

        return getattr(commands, name)(args, make_host, out)

    return handler


def _add_guard_parsers(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    """``policy``, ``pin``, ``override`` and ``guard``: the pairing policy and the package-manager guard."""

    def common(p: argparse.ArgumentParser, policy: bool = True) -> None:
        p.add_argument("--root", default="/", help="act on the host tree under DIR instead of / (chroot, fixture)")
        p.add_argument("--config", default=DEFAULT_CONFIG_PATH, metavar="PATH",
                       help=f"agent config file (default {DEFAULT_CONFIG_PATH}; missing means defaults)")
        if policy:
            p.add_argument("--policy", metavar="PATH", help="policy file or directory (default: [guard] policy_path, "
                                                            "/etc/gpuguard/policy.d under --root)")

    pol = sub.add_parser("policy", help="pairing policy: check, compile, explain, freeze")
    pol_sub = pol.add_subparsers(dest="policy_command", metavar="POLICY_COMMAND")
    pol_sub.required = True
    check = pol_sub.add_parser("check", help="validate a policy file or directory, also for rules that can never "
                                             "match or block everything; every problem on its own line, warnings "
                                             "as 'warning: ...' (exit 0 valid, warnings allowed; 3 invalid)")
    check.add_argument("path", metavar="FILE|DIR", nargs="?",
                       help="default: /etc/gpuguard/policy.d under --root")
    check.add_argument("--matrix", metavar="PATH", help="AMD compatibility matrix file (default: the shipped one, "
                                                        "/usr/share/gpuguard/amd-compat-matrix.toml)")
    check.add_argument("--root", default="/", help="check against the host tree under DIR instead of / (its "
                                                   "packages and kernels: rules that match nothing are warnings)")
    check.add_argument("--no-host", action="store_true", help="skip the checks against this host's packages")
    check.add_argument("--json", action="store_true", help="print the result as JSON")
    check.set_defaults(handler=_guard_command("policy_check"))
    comp = pol_sub.add_parser("compile", help="write the compiled policy the apt hook reads (atomically)")
    common(comp)
    comp.add_argument("--output", "-o", metavar="FILE", help="write here instead of the state directory")
    comp.set_defaults(handler=_guard_command("policy_compile"))
    explain = pol_sub.add_parser("explain", help="show what this host is pinned to and what it may do (exit 0 "
                                                 "compliant, 10 the host violates the policy, 3 invalid policy)")
    common(explain)
    explain.add_argument("--json", action="store_true", help="print the result as JSON")
    explain.set_defaults(handler=_guard_command("policy_explain"))
    freeze = pol_sub.add_parser(
        "freeze", help="write a policy that keeps this host on its installed driver/ROCm or NVIDIA driver/CUDA "
                       "builds and kernels, commented line by line (exit 10 when installed and loaded driver differ)",
        description="Print (or write with --output) a policy from the host as it is now: the installed driver/ROCm "
                    "or NVIDIA driver/CUDA pairing at its exact builds, the running and installed kernels, the rest "
                    "of the GPU stack frozen, the other guarded packages. Save it as "
                    "/etc/gpuguard/policy.d/50-freeze.toml, check it, then policy compile and pin apply. A host "
                    "whose installed driver is not the loaded one is refused (exit 10).")
    freeze.add_argument("--root", default="/", help="read the host tree under DIR instead of / (chroot, fixture)")
    freeze.add_argument("--config", default=DEFAULT_CONFIG_PATH, metavar="PATH",
                        help=f"agent config file (default {DEFAULT_CONFIG_PATH}; missing means defaults)")
    freeze.add_argument("--output", "-o", metavar="FILE", help="write the policy to FILE (atomically) instead of "
                                                               "stdout, e.g. /etc/gpuguard/policy.d/50-freeze.toml")
    freeze.add_argument("--force", action="store_true", help="replace FILE when it exists")
    freeze.add_argument("--name", help="the policy's name (default: freeze-HOSTNAME)")
    freeze.add_argument("--allow-point-releases", action="store_true",
                        help="allow point releases of the installed series (driver 6.2.*, ROCm 6.2.*, NVIDIA "
                             "driver 580.*, CUDA 13.0.*) instead of the exact builds")
    freeze.add_argument("--kernel-series", action="store_true",
                        help="allow new kernels of the installed series (6.8.0-*-generic) instead of the exact "
                             "kernel releases")
    freeze.add_argument("--accept-inconsistent", action="store_true",
                        help="freeze the installed packages even when the loaded driver differs (the policy says so)")
    freeze.set_defaults(handler=_guard_command("policy_freeze"))

    pin = sub.add_parser("pin", help="native pins rendered from the policy (apt preferences.d, dnf versionlock)")
    pin_sub = pin.add_subparsers(dest="pin_command", metavar="PIN_COMMAND")
    pin_sub.required = True
    apply = pin_sub.add_parser("apply", help="write /etc/apt/preferences.d/gpuguard-*.pref (dpkg hosts) or "
                                             "gpuguard's dnf versionlock entries (rpm hosts), remove stale ones")
    common(apply)
    apply.add_argument("--dry-run", action="store_true", help="print what would change; write nothing")
    apply.set_defaults(handler=_guard_command("pin_apply"))

    ovr = sub.add_parser("override", help="time-limited, audited maintenance windows that let violations through")
    ovr_sub = ovr.add_subparsers(dest="override_command", metavar="OVERRIDE_COMMAND")
    ovr_sub.required = True
    start = ovr_sub.add_parser("start", help="open a window now")
    common(start, policy=False)
    start.add_argument("--minutes", type=float, required=True, help="how long the window stays open")
    start.add_argument("--reason", required=True, help="why (written to the audit log)")
    start.set_defaults(handler=_guard_command("override_start"))
    lst = ovr_sub.add_parser("list", help="list recorded windows")
    common(lst, policy=False)
    lst.add_argument("--json", action="store_true", help="print JSON")
    lst.set_defaults(handler=_guard_command("override_list"))
    end = ovr_sub.add_parser("end", help="close the open window(s) now")
    common(end, policy=False)
    end.add_argument("--id", help="close only this window")
    end.set_defaults(handler=_guard_command("override_end"))

    grd = sub.add_parser("guard", help="after-the-fact guard for changes that bypassed apt/dnf (dpkg -i, rpm -U)")
    grd_sub = grd.add_subparsers(dest="guard_command", metavar="GUARD_COMMAND")
    grd_sub.required = True
    rollback = grd_sub.add_parser("rollback", help="compare with the last known-good set and roll back violations "
                                                  "(exit 0 ok, 10 violations left, 14 rollback failed)")
    common(rollback)
    rollback.add_argument("--dry-run", action="store_true", help="plan only (apt-get -s, dnf --assumeno)")
    rollback.set_defaults(handler=_guard_command("guard_rollback"))


def _add_snapshot_parser(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    snap = sub.add_parser("snapshot", help="snapshot the kernel, OS, GPU driver, ROCm/CUDA and container stack")
    snap.add_argument("--json", action="store_true", help="print canonical JSON instead of a summary")
    snap.add_argument("--root", default="/", help="read the host tree under DIR instead of / (chroot, fixture)")
    snap.add_argument("--output", "-o", metavar="FILE", help="also write the JSON snapshot to FILE (atomically)")
    snap.add_argument("--config", default=DEFAULT_CONFIG_PATH,
                      help="agent config (watched packages); defaults apply when it does not exist")
    snap.add_argument("--diff", nargs=2, metavar=("OLD", "NEW"), help="compare two snapshot JSON files")
    snap.set_defaults(handler=_cmd_snapshot)


def _add_run_parser(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    run = sub.add_parser("run", help="run the agent daemon: snapshots, package watch, health checks, reporting")
    run.add_argument("--config", default=DEFAULT_CONFIG_PATH, metavar="PATH",
                     help=f"agent config file (default {DEFAULT_CONFIG_PATH}; missing means defaults)")
    run.add_argument("--root", default="/", help="read the host tree under DIR instead of / (chroot, fixture)")
    run.set_defaults(handler=_cmd_run)


def _add_job_parser(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    # Internal: one job body in a child of ``gpuguard run`` (agent/daemon_jobs/children.py); not for people.
    job = sub.add_parser("_job")
    job.add_argument("job", choices=JOB_NAMES)
    job.add_argument("--config", default=DEFAULT_CONFIG_PATH)
    job.add_argument("--root", default="/")
    job.add_argument("--request", default="{}")
    job.add_argument("--result", required=True)
    job.set_defaults(handler=_cmd_job)


def _add_schema_parser(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    schema = sub.add_parser("schema", help="print the JSON schema of report events (schemas/events-v1.json)")
    schema.add_argument("--output", "-o", metavar="FILE", help="write it to FILE (atomically) instead")
    schema.set_defaults(handler=_cmd_schema)


def _add_status_parser(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    status = sub.add_parser("status", help="is the agent all right: daemon, last snapshot/health/guard results, "
                                           "compliance, outbox, hub (exit 0 ok, 30 attention, 31 failing)")
    status.add_argument("--json", action="store_true", help="print checks and facts as JSON instead of a table")
    status.add_argument("--offline", action="store_true", help="do not contact the hub")
    status.add_argument("--config", default=DEFAULT_CONFIG_PATH, metavar="PATH",
                        help=f"agent config file (default {DEFAULT_CONFIG_PATH}; missing means defaults)")
    status.add_argument("--root", default="/", help="look for the daemon under DIR's /proc instead of / (tests)")
    status.add_argument("--slurm", action="store_true", help="one line for a Slurm Prolog or HealthCheckProgram: "
                        "exit 0 ok (a busy GPU included), 1 drain (docs/integrations.md); never asks the hub")
    status.add_argument("--drain", action="store_true", help="with --slurm: drain this node through scontrol on a "
                        "failure, resume it only when gpuguard drained it")
    status.add_argument("--node-name", metavar="NAME", help="the Slurm node name for --drain (default "
                        "$SLURMD_NODENAME, else the short host name)")
    status.set_defaults(handler=_cmd_status)


def _terminal_columns() -> int:
    """The width argparse would wrap help to (``shutil.get_terminal_size``: COLUMNS, the terminal, else 80)."""
    try:
        columns = int(os.environ.get("COLUMNS", "0"))
    except ValueError:
        columns = 0
    stdout = sys.__stdout__
    if columns <= 0 and stdout is not None:
        try:
            columns = os.get_terminal_size(stdout.fileno()).columns
        except (AttributeError, ValueError, OSError):
            columns = 0
    return columns or 80


class _HelpFormatter(argparse.HelpFormatter):
    """argparse's own, given the width: argparse makes one for every argument added and would otherwise import
    shutil (with bz2 and lzma) to ask the terminal, on every command, help or not (issue #17)."""

    def __init__(self, prog: str) -> None:
        super().__init__(prog, width=_terminal_columns() - 2)


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose help formatter is :class:`_HelpFormatter`; subcommand parsers are of this class too."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", _HelpFormatter)
        super().__init__(**kwargs)


def build_parser(command: Optional[str] = None) -> argparse.ArgumentParser:
    """The command line's parser: every command's, or only ``command``'s (see :func:`command_in`).

    A command's own parser, its help and its usage are the same either way: each is built by the same function.
    """
    parser: argparse.ArgumentParser = _Parser(
        prog="gpuguard", description="Keep a GPU host's driver/ROCm/CUDA stack frozen and working.")
    parser.add_argument("--version", action="version", version=f"gpuguard {__version__}")
    parser.add_argument("--log-level", default="warning", choices=_LOG_LEVELS)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for names, add in _COMMAND_PARSERS:
        # Internal commands (``_job``) exist only when run: help, usage errors and completion never list them.
        if command in names or (command is None and not names[0].startswith("_")):
            add(sub)
    return parser


def command_in(argv: Sequence[str]) -> Optional[str]:
    """The command ``argv`` runs when only its parser is needed; None when the whole parser is (no command, an
    unknown one, ``gpuguard --help``, an option argparse must judge), so help, errors and completion see every
    command."""
    expect_value = False
    for arg in argv:
        if expect_value:
            expect_value = False
        elif arg == "--log-level":
            expect_value = True
        elif arg.startswith("--log-level="):
            continue
        elif arg.startswith("-"):
            return None
        else:
            return arg if any(arg in names for names, _ in _COMMAND_PARSERS) else None
    return None


def _add_health_parser(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    health = sub.add_parser("health", help="accelerator health check: prove the ML stack runs on the GPUs")
    health_sub = health.add_subparsers(dest="health_command", metavar="HEALTH_COMMAND")
    health_sub.required = True
    run = health_sub.add_parser("run", help="run the probe once, compare with the baseline, print the result "
                                            "(exit 0 pass, 20 regression, 21 cpu_fallback, 22 failed, "
                                            "23 timeout, 24 skipped, 25 busy, 26 deferred)")
    run.add_argument("--json", action="store_true", help="print the result as JSON instead of a table")
    run.add_argument("--python", metavar="PATH", help="interpreter of the ML stack to probe (default: config)")
    run.add_argument("--timeout-seconds", type=float, metavar="N", help="kill the probe after N seconds")
    run.add_argument("--throttle-fraction", type=float, metavar="F",
                     help="make the probe slow its own work by F (tests the regression alarm)")
    run.add_argument("--mode", choices=("auto", "functional", "full"),
                     help="auto: judge speed on idle GPUs only; functional: never judge speed; full: wait (deferred) "
                          "while another job uses a GPU (default: config, auto)")
    run.add_argument("--config", default=DEFAULT_CONFIG_PATH, metavar="PATH",
                     help=f"agent config file (default {DEFAULT_CONFIG_PATH}; missing means defaults)")
    run.add_argument("--state-dir", metavar="DIR", help="where baselines live (default: config, /var/lib/gpuguard)")
    run.set_defaults(handler=_cmd_health_run)


def _add_hub_parser(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    hub = sub.add_parser("hub", help="the reference central endpoint: receive host reports, answer fleet questions")
    hub_sub = hub.add_subparsers(dest="hub_command", metavar="HUB_COMMAND")
    hub_sub.required = True
    config_help = f"hub config file (default {DEFAULT_HUB_CONFIG_PATH}; missing means defaults)"

    serve = hub_sub.add_parser("serve", help="run the hub (uvicorn) until SIGINT/SIGTERM")
    serve.add_argument("--config", metavar="PATH", help=config_help)
    serve.set_defaults(handler=_cmd_hub_serve)
    for role, name, what in (("host", "add-host", "HOST_ID"), ("reader", "add-reader", "NAME")):
        add = hub_sub.add_parser(name, help=f"make a {role} token, print it once, store only its hash")
        add.add_argument("subject", metavar=what)
        add.add_argument("--config", metavar="PATH", help=config_help)
        add.add_argument("--tokens-file", metavar="PATH", help="tokens file (default: tokens_file of the config)")
        add.add_argument("--rotate", action="store_true", help="replace an existing token (the old one stops "
                                                               "working)")
        add.set_defaults(handler=_cmd_hub_add, role=role)


_LOG_LEVELS = ["debug", "info", "warning", "error"]
# Every command's parser, in the order ``gpuguard --help`` lists them; the guard's four commands are built together.
_COMMAND_PARSERS: Tuple[Tuple[Tuple[str, ...], ParserAdder], ...] = (
    (("snapshot",), _add_snapshot_parser),
    (("run",), _add_run_parser),
    (("_job",), _add_job_parser),
    (("schema",), _add_schema_parser),
    (("status",), _add_status_parser),
    (("hub",), _add_hub_parser),
    (("policy", "pin", "override", "guard"), _add_guard_parsers),
    (("health",), _add_health_parser),
)


def _host_for_root(root: str) -> "Host":
    """The default host factory (agent.host imported only by the commands that read a host)."""
    from agent.host import Host

    return Host.for_root(root)


def main(argv: Optional[List[str]] = None, make_host: HostFactory = _host_for_root,
         out: Optional[TextIO] = None) -> int:
    """Entry point; returns the process exit code."""
    if argv is None:
        argv = sys.argv[1:]
    args = build_parser(command_in(argv)).parse_args(argv)
    configure(level=args.log_level)
    stream = out if out is not None else sys.stdout
    try:
        return args.handler(args, make_host, stream)
    except GpuguardError as exc:
        get_logger("cli").debug("command_failed", error=str(exc), exit_code=exc.exit_code)
        print(f"gpuguard: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("gpuguard: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
