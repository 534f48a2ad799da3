"""``gpuguard snapshot``: snapshot the host's stack, or compare two snapshots."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, TextIO

from agent.commands.options import add_config, add_json, add_output, add_root

if TYPE_CHECKING:
    from agent.commands import HostFactory, Subparsers


def add_parser(sub: Subparsers) -> None:
    snap = sub.add_parser("snapshot", help="snapshot the kernel, OS, GPU driver, ROCm/CUDA and container stack")
    add_json(snap, "print canonical JSON instead of a summary")
    add_root(snap)
    add_output(snap, "also write the JSON snapshot to FILE (atomically)")
    add_config(snap, "agent config (watched packages); defaults apply when it does not exist", metavar=None)
    snap.add_argument("--diff", nargs=2, metavar=("OLD", "NEW"), help="compare two snapshot JSON files")
    snap.set_defaults(handler=snapshot)


def snapshot(args: argparse.Namespace, make_host: HostFactory, out: TextIO) -> int:
    """Print the snapshot (a summary or JSON), also writing it to --output; with --diff, compare two files."""
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
