"""``gpuguard override start|list|end``: time-limited, audited maintenance windows that let violations through."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING, TextIO

from agent.commands.guard_inputs import settings_of, state_paths
from agent.commands.options import add_group, add_guard_options, add_json

if TYPE_CHECKING:
    from agent.commands import HostFactory, Subparsers
    from agent.config import Settings
    from agent.host import Host


def add_parser(sub: Subparsers) -> None:
    ovr_sub = add_group(sub, "override", "time-limited, audited maintenance windows that let violations through")
    start = ovr_sub.add_parser("start", help="open a window now")
    add_guard_options(start, policy=False)
    start.add_argument("--minutes", type=float, required=True, help="how long the window stays open")
    start.add_argument("--reason", required=True, help="why (written to the audit log)")
    start.add_argument("--allow-self-removal", action="store_true",
                       help="also let a transaction remove gpuguard's own package (audited; no other window does)")
    start.set_defaults(handler=override_start)
    lst = ovr_sub.add_parser("list", help="list recorded windows")
    add_guard_options(lst, policy=False)
    add_json(lst, "print JSON")
    lst.set_defaults(handler=override_list)
    end = ovr_sub.add_parser("end", help="close the open window(s) now")
    add_guard_options(end, policy=False)
    end.add_argument("--id", help="close only this window")
    end.set_defaults(handler=override_end)


def _max_override_minutes(host: Host, settings: Settings) -> float:
    """The compiled policy's longest window; 240 minutes when there is no compiled policy to ask."""
    from agent.errors import InputFileError
    from agent.policy.compiled import read_compiled

    try:
        return read_compiled(str(host.path(state_paths(settings).compiled_policy))).max_override_minutes
    except InputFileError:
        return 240


def override_start(args: argparse.Namespace, make_host: HostFactory, out: TextIO) -> int:
    """Open a window now, for --minutes, audited with --reason."""
    from agent.guard.hotpath.overrides import start_window

    host = make_host(args.root)
    settings = settings_of(args)
    paths = state_paths(settings)
    window = start_window(str(host.path(paths.overrides)), str(host.path(paths.audit_log)), args.minutes,
                          args.reason, _max_override_minutes(host, settings), now=host.clock,
                          allow_self_removal=args.allow_self_removal)
    also = "; it also lets gpuguard itself be removed" if window.allow_self_removal else ""
    out.write(f"override window {window.id} open until {window.expires_at.isoformat(timespec='seconds')} "
              f"({window.reason!r}, by {window.opened_by}){also}; audited in {paths.audit_log}\n")
    return 0


def override_list(args: argparse.Namespace, make_host: HostFactory, out: TextIO) -> int:
    """Every recorded window, open or expired."""
    from agent.guard.hotpath.overrides import load_windows

    host = make_host(args.root)
    settings = settings_of(args)
    paths = state_paths(settings)
    now = host.clock()
    windows = load_windows(str(host.path(paths.overrides)), _max_override_minutes(host, settings))
    if args.json:
        out.write(json.dumps([dict(w.to_dict(), active=w.is_active(now)) for w in windows], indent=2) + "\n")
        return 0
    for window in windows:
        state = "open" if window.is_active(now) else "expired"
        out.write(f"{window.id} {state} {window.started_at.isoformat(timespec='seconds')} -> "
                  f"{window.expires_at.isoformat(timespec='seconds')} by {window.opened_by}: {window.reason}\n")
    if not windows:
        out.write("no override windows\n")
    return 0


def override_end(args: argparse.Namespace, make_host: HostFactory, out: TextIO) -> int:
    """Close the open window(s) now, or only --id."""
    from agent.guard.hotpath.overrides import end_windows

    host = make_host(args.root)
    paths = state_paths(settings_of(args))
    closed = end_windows(str(host.path(paths.overrides)), str(host.path(paths.audit_log)), now=host.clock,
                         window_id=args.id)
    out.write("".join(f"closed override window {w.id} ({w.reason!r})\n" for w in closed) or "no open window\n")
    return 0
