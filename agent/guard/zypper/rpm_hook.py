"""The zypper guard's veto: the command gpuguard's rpm plugin runs before rpm changes anything.

libzypp cannot be stopped by its commit plugins (an ``ERROR`` answer only unloads the plugin; docs/guard.md,
"zypper hosts"), but every package it installs or removes goes through librpm, and librpm fails a transaction
whose plugin fails ``tsm_pre``. gpuguard's rpm plugin (packaging/zypper/gpuguard-rpm-plugin.c, loaded through
``%__transaction_gpuguard``) writes the transaction and the installed set to this command's stdin::

    root<TAB>/
    parent<TAB>4242                                  the pid of the process that ran rpm (zypper, zypp-rpm, a shell)
    I<TAB>name<TAB>epoch<TAB>version<TAB>release<TAB>arch   installed now (one line per package)
    +<TAB>...                                        coming in
    -<TAB>...                                        going out (erased, the old side of an upgrade)
    end

and refuses the rpm transaction unless this exits 0. When rpm runs under a zypper whose commit plugin kept the
whole commit (agent/guard/zypper/plan.py), the set the whole commit leaves is judged, not the one package of this
rpm run. The decision, its lines and exit codes are the dnf checker's (agent/guard/dnf/check.py) with the front end
named ``zypper`` (or ``rpm`` for rpm run by hand). Input that is cut short, malformed, not UTF-8 or larger than
MAX_INPUT_BYTES goes to the fail-safe, as on apt and dnf. Standard library only.
"""

from __future__ import annotations

import datetime as dt
import json
import sys

from agent.defaults import ZYPPER_PLAN_DIR
from agent.errors import InputFileError
from agent.guard.dnf import check as dnf_check
from agent.guard.dnf.check import BYPASS_HINTS
from agent.guard.dnf.request import REQUEST_FORMAT
from agent.guard.hotpath import entry
from agent.guard.hotpath.decision import EXIT_USAGE, PREFIX
from agent.guard.zypper import plan as zypper_plan
from agent.hostfacts.paths import read_regular_file

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import BinaryIO, Callable, Dict, List, Optional, Sequence, TextIO, Tuple

SOURCE = "gpuguard rpm plugin input"
KINDS = {"I": "installed", "+": "in", "-": "out"}
# libzypp's default multiversion packages on SUSE (zypp.conf: multiversion = provides:multiversion(kernel)): each
# version is installed beside the others, as dnf's install-only kernels.
SUSE_MULTIVERSION = ("kernel-default", "kernel-default-base", "kernel-default-extra", "kernel-default-devel",
                     "kernel-64kb", "kernel-azure", "kernel-rt", "kernel-source", "kernel-devel", "kernel-syms")
FRONT_ENDS = ("zypper", "zypp-rpm")


class PluginInput:
    """What the rpm plugin sent: root, parent pid, installed packages and the transaction's elements (tuples of
    name, epoch, version, release, arch)."""

    __slots__ = ("root", "parent_pid", "installed", "incoming", "outgoing")

    def __init__(self) -> None:
        self.root = "/"
        self.parent_pid = 0
        self.installed: List[Tuple[str, str, str, str, str]] = []
        self.incoming: List[Tuple[str, str, str, str, str]] = []
        self.outgoing: List[Tuple[str, str, str, str, str]] = []


def parse_plugin_input(text: str) -> PluginInput:
    """Parse the plugin's lines; InputFileError names the line that is wrong (one without ``end`` was cut short)."""
    parsed = PluginInput()
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    if not lines or lines[-1] != "end":
        raise InputFileError(SOURCE, "cut short: no end line (the rpm plugin did not send the whole transaction)")
    for number, line in enumerate(lines[:-1], 1):
        fields = line.split("\t")
        kind = fields[0]
        if kind == "root" and len(fields) == 2 and fields[1].startswith("/"):
            parsed.root = fields[1].rstrip("/") or "/"
        elif kind == "parent" and len(fields) == 2 and fields[1].isdigit():
            parsed.parent_pid = int(fields[1])
        elif kind in KINDS and len(fields) == 6 and fields[1] and fields[3]:
            package = (fields[1], fields[2], fields[3], fields[4], fields[5])
            {"I": parsed.installed, "+": parsed.incoming, "-": parsed.outgoing}[kind].append(package)
        else:
            raise InputFileError(SOURCE, f"line {number}: {line[:120]!r} is not a root, parent, I, + or - line")
    return parsed


def process_name(pid: int, proc: str = "/proc") -> str:
    try:
        return read_regular_file(f"{proc}/{pid}/comm", 64).decode("utf-8", errors="replace").strip()
    except OSError:
        return ""


def plan_items(parsed: PluginInput, steps: List[Dict[str, str]]) -> Optional[List[Tuple[str, ...]]]:
    """The plan's steps as request items when they cover this rpm run (every package coming in is one the plan
    installs; every package going out is one it removes or the old side of one it installs), else None."""
    def key(item: Sequence[str]) -> Tuple[str, str, str, str]:
        return (item[0], item[1] if item[1] not in ("", "0") else "", item[2], item[3])

    ins = [s for s in steps if s["type"] in ("+", "M")]
    outs = [s for s in steps if s["type"] == "-"]
    in_keys = {key([s[f] for f in zypper_plan.FIELDS]) for s in ins}
    out_keys = {key([s[f] for f in zypper_plan.FIELDS]) for s in outs}
    in_names = {s["name"] for s in ins}
    if not all(key(p) in in_keys for p in parsed.incoming):
        return None
    if not all(key(p) in out_keys or p[0] in in_names for p in parsed.outgoing):
        return None
    return ([tuple(s[f] for f in zypper_plan.FIELDS) + ("in", "zypper") for s in ins]
            + [tuple(s[f] for f in zypper_plan.FIELDS) + ("out", "zypper") for s in outs])


def request_text(parsed: PluginInput, tool: str, plan_dir: str, proc: str = "/proc") -> str:
    """The dnf checker's request document (agent/guard/dnf/request.py) for this rpm run, as JSON."""
    items: Optional[List[Tuple[str, ...]]] = None
    if tool == "zypper" and parsed.parent_pid:
        steps = zypper_plan.read_plan(plan_dir, parsed.parent_pid, proc)
        items = plan_items(parsed, steps) if steps is not None else None
    if items is None:
        items = ([p + ("in", "rpm") for p in parsed.incoming] + [p + ("out", "rpm") for p in parsed.outgoing])

    def pkg(t: Sequence[str]) -> Dict[str, str]:
        return {"name": t[0], "epoch": t[1], "version": t[2], "release": t[3], "arch": t[4]}

    return json.dumps({"format": REQUEST_FORMAT, "tool": tool, "command_line": None,
                       "installonly": list(SUSE_MULTIVERSION), "installed": [pkg(t) for t in parsed.installed],
                       "items": [dict(pkg(t), direction=t[5], action=t[6]) for t in items]})


def run(argv: Sequence[str], stdin: BinaryIO, err: TextIO, now: Callable[[], dt.datetime],
        proc: str = "/proc") -> int:
    """One rpm transaction: read the plugin's lines, decide, return the exit code (0 lets rpm go on)."""
    items = list(argv)
    plan_dir = ZYPPER_PLAN_DIR
    if "--plan-dir" in items:
        at = items.index("--plan-dir")
        plan_dir = items[at + 1] if at + 1 < len(items) else ""
        del items[at:at + 2]
    try:
        args = dnf_check.parse_args(["--tool", "zypper", *items])
        if not plan_dir.startswith("/"):
            raise ValueError("--plan-dir needs an absolute path")
    except ValueError as exc:
        err.write(f"{PREFIX}: REFUSED: bad rpm plugin arguments ({exc}); fix %_gpuguard_hook_args in "
                  f"/usr/lib/rpm/macros.d/macros.transaction_gpuguard, or {BYPASS_HINTS['rpm']}\n")
        return EXIT_USAGE
    text, problem = dnf_check.read_all(stdin, dnf_check.MAX_INPUT_BYTES, args.input_timeout_seconds)
    if problem is None:
        try:
            parsed = parse_plugin_input(text)
        except InputFileError as exc:
            problem = exc.reason
    if problem is not None:
        return dnf_check.check(text, args, err, now, source=SOURCE, problem=problem)
    tool = "zypper" if process_name(parsed.parent_pid, proc) in FRONT_ENDS else "rpm"
    args.tool = tool
    if "--root" not in items:
        args.root = parsed.root
    return dnf_check.check(request_text(parsed, tool, plan_dir, proc), args, err, now, source=SOURCE)


def main(argv: Optional[Sequence[str]] = None, stdin: Optional[BinaryIO] = None, err: Optional[TextIO] = None,
         now: Optional[Callable[[], dt.datetime]] = None) -> int:
    """Hook entry point; returns the exit code and never raises."""
    stream = err if err is not None else sys.stderr
    clock = now or (lambda: dt.datetime.now(dt.timezone.utc))
    return entry.never_raise(
        lambda: run(sys.argv[1:] if argv is None else argv, stdin if stdin is not None else sys.stdin.buffer,
                    stream, clock),
        stream, BYPASS_HINTS["zypper"])


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
