"""The dnf checker: refuse a resolved dnf transaction that breaks the policy, before anything is downloaded.

Run by the dnf4 plugin (packaging/dnf/gpuguard.py) from ``resolved()`` and by the dnf5 action
(agent/guard/dnf/dnf5_action.py), with the transaction as JSON (agent/guard/dnf/request.py) on stdin and ``--root``
set to dnf's installroot. It reads the compiled policy, evaluates the set the transaction would leave with the same
decision as the apt hook (agent/guard/hotpath/decision.py), prints the same ``gpuguard: ...`` lines on stderr and exits:

    0   allowed (warnings, pre-existing violations and open override windows are reported on stderr)
    2   bad arguments (the plugin configuration is wrong): refused
    10  refused: the transaction breaks the policy
    11  refused by the fail-safe: the compiled policy is missing or invalid
    12  refused by the fail-safe: the input is malformed or of an unknown format
    13  refused by the fail-safe: internal error

When the policy cannot be read or the input cannot be parsed, the compiled policy's fail-safe mode decides
(default ``block-guarded``: refuse only transactions that touch guarded packages). It never prints a traceback and
imports the standard library only (it runs on the system python3 -IS, on the path of every dnf run).
"""

from __future__ import annotations

import datetime as dt
import sys

from agent.errors import InputFileError
from agent.guard.dnf.request import guess_packages, parse_request
from agent.guard.hotpath import entry
from agent.guard.hotpath.decision import EXIT_USAGE, PREFIX, Decision

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs milliseconds of the checker's start-up budget
    from typing import BinaryIO, Callable, Optional, Sequence, TextIO, Tuple

BYPASS_HINTS = {
    "dnf": "to bypass the guard for one dnf run (audited nowhere; prefer an override window): "
           "dnf --disableplugin=gpuguard ...",
    "dnf5": "to bypass the guard for one dnf5 run (audited nowhere; prefer an override window): "
            "dnf5 --disable-plugin=actions ...",
}
MAX_INPUT_BYTES = 64 << 20


def parse_args(argv: Sequence[str]) -> entry.Args:
    """The apt hook's options plus ``--tool dnf|dnf5`` (the front end named in messages)."""
    return entry.parse_args(argv, "dnf", tuple(BYPASS_HINTS))


def check(text: str, args: entry.Args, err: TextIO, now: Callable[[], dt.datetime],
          source: str = "dnf plugin input", oversized: bool = False) -> int:
    """Decide on one request text; every outcome is lines on ``err`` and an exit code."""
    def say(line: str) -> None:
        err.write(f"{PREFIX}: {line}\n")

    decision = Decision(args.tool, args.root, args.state_dir, say, now, BYPASS_HINTS[args.tool])

    def parse(raw: str) -> entry.Parsed:
        if oversized:
            raise InputFileError(source, f"larger than {MAX_INPUT_BYTES} bytes: refused unread")
        request = parse_request(raw, source, tool=args.tool)
        decision.tool = request.tool  # the request names its front end (dnf5 through the dnf4 checker is dnf5)
        decision.bypass_hint = BYPASS_HINTS[request.tool]
        return entry.Parsed(request.transaction, lambda policy: request.installed)

    return entry.check(decision, args.policy_file, args.policy_dir, text, parse, guess_packages)


def read_all(stream: BinaryIO, limit_bytes: int = MAX_INPUT_BYTES) -> Tuple[str, bool]:
    """The input (at most ``limit_bytes`` of it), decoded leniently (a bad byte must end in the fail-safe, not in a
    UnicodeDecodeError), and whether there was more."""
    data = stream.read(limit_bytes + 1)
    return data[:limit_bytes].decode("utf-8", errors="replace"), len(data) > limit_bytes


def main(argv: Optional[Sequence[str]] = None, stdin: Optional[BinaryIO] = None, err: Optional[TextIO] = None,
         now: Optional[Callable[[], dt.datetime]] = None) -> int:
    """Checker entry point; returns the exit code and never raises (not even a traceback for a bug)."""
    stream = err if err is not None else sys.stderr
    clock = now or (lambda: dt.datetime.now(dt.timezone.utc))
    try:
        args = parse_args(sys.argv[1:] if argv is None else argv)
    except ValueError as exc:
        stream.write(f"{PREFIX}: REFUSED: bad checker arguments ({exc}); fix checker= in "
                     f"/etc/dnf/plugins/gpuguard.conf, or {BYPASS_HINTS['dnf']}\n")
        return EXIT_USAGE
    def run() -> int:
        text, oversized = read_all(stdin if stdin is not None else sys.stdin.buffer, MAX_INPUT_BYTES)
        return check(text, args, stream, clock, oversized=oversized)

    return entry.never_raise(run, stream, BYPASS_HINTS[args.tool])


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
