"""The dnf checker: refuse a resolved dnf transaction that breaks the policy, before anything is downloaded.

Run by the dnf4 plugin (packaging/dnf/gpuguard.py) from ``resolved()`` and by the dnf5 action
(agent/guard/dnf/dnf5_action.py), with the transaction as JSON (agent/guard/dnf/request.py) on stdin and ``--root``
set to dnf's installroot. It reads the compiled policy, evaluates the set the transaction would leave with the same
decision as the apt hook (agent/guard/hotpath/decision.py), prints the same ``gpuguard: ...`` lines on stderr and exits:

    0   allowed (warnings, pre-existing violations and open override windows are reported on stderr)
    2   bad arguments (the plugin configuration is wrong): refused
    10  refused: the transaction breaks the policy
    11  refused by the fail-safe: the compiled policy is missing or invalid
    12  refused by the fail-safe: the input is malformed, of an unknown format, not UTF-8, larger than 64 MiB or
        not ended within --input-timeout-seconds (default 60)
    13  refused by the fail-safe: internal error

When the policy cannot be read or the input cannot be parsed, the compiled policy's fail-safe mode decides
(default ``block-guarded``: refuse only transactions that touch guarded packages). It never prints a traceback and
imports the standard library only (it runs on the system python3 -IS, on the path of every dnf run).
"""

from __future__ import annotations

import datetime as dt
import sys

from agent.errors import InputNotWhole
from agent.guard.dnf.request import guess_packages, parse_request
from agent.guard.hotpath import entry
from agent.guard.hotpath.decision import EXIT_USAGE, PREFIX, Decision
from agent.guard.hotpath.stream import DEFAULT_TIMEOUT_SECONDS, read_bounded

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs milliseconds of the checker's start-up budget
    from typing import BinaryIO, Callable, Optional, Sequence, TextIO, Tuple

BYPASS_HINTS = {
    "dnf": "to bypass the guard for one dnf run (audited nowhere; prefer an override window): "
           "dnf --disableplugin=gpuguard ...",
    "dnf5": "to bypass the guard for one dnf5 run (audited nowhere; prefer an override window): "
            "dnf5 --disable-plugin=actions ...",
    "zypper": "zypper cannot skip gpuguard's rpm plugin; open an override window (gpuguard override start), or "
              "run rpm --noplugins yourself (audited nowhere)",
    "rpm": "to bypass the guard for one rpm run (audited nowhere; prefer an override window): rpm --noplugins ...",
}
MAX_INPUT_BYTES = 64 << 20


def parse_args(argv: Sequence[str]) -> entry.Args:
    """The apt hook's options plus ``--tool dnf|dnf5`` (the front end named in messages)."""
    return entry.parse_args(argv, "dnf", tuple(BYPASS_HINTS))


def check(text: str, args: entry.Args, err: TextIO, now: Callable[[], dt.datetime],
          source: str = "dnf plugin input", problem: Optional[str] = None) -> int:
    """Decide on one request text; every outcome is lines on ``err`` and an exit code. ``problem``: what kept the
    input from being read whole (too large, never ended, not UTF-8, a broken conversation with dnf5), or None."""
    def say(line: str) -> None:
        err.write(f"{PREFIX}: {line}\n")

    decision = Decision(args.tool, args.root, args.state_dir, say, now, BYPASS_HINTS[args.tool])

    def parse(raw: str) -> entry.Parsed:
        if problem:
            raise InputNotWhole(source, problem)
        request = parse_request(raw, source, tool=args.tool)
        decision.tool = request.tool  # the request names its front end (dnf5 through the dnf4 checker is dnf5)
        decision.bypass_hint = BYPASS_HINTS[request.tool]
        return entry.Parsed(request.transaction, lambda policy: request.installed)

    return entry.check(decision, args.policy_file, args.policy_dir, text, parse, guess_packages)


def read_all(stream: BinaryIO, limit_bytes: int = MAX_INPUT_BYTES,
             timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS) -> Tuple[str, Optional[str]]:
    """The input (at most ``limit_bytes`` of it, waiting at most ``timeout_seconds`` for its end when ``stream``
    has a file descriptor), decoded leniently for the fail-safe's guess, and what kept it from being read whole
    (too large, never ended, not UTF-8), or None."""
    try:
        fd: Optional[int] = stream.fileno()
    except (AttributeError, OSError, ValueError):  # an in-memory stream (tests): no descriptor to wait on
        fd = None
    problem: Optional[str] = None
    if fd is None:
        data = stream.read(limit_bytes + 1)
        if len(data) > limit_bytes:
            data, problem = data[:limit_bytes], f"larger than {limit_bytes} bytes: refused unread"
    else:
        data, problem = read_bounded(fd, limit_bytes, timeout_seconds)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        text = data.decode("utf-8", errors="replace")
        problem = problem or f"byte {exc.start}: not UTF-8"
    return text, problem


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
        text, problem = read_all(stdin if stdin is not None else sys.stdin.buffer, MAX_INPUT_BYTES,
                                 args.input_timeout_seconds)
        return check(text, args, stream, clock, problem=problem)

    return entry.never_raise(run, stream, BYPASS_HINTS[args.tool])


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
