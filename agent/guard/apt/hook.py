"""The apt ``DPkg::Pre-Install-Pkgs`` hook: refuse a transaction that breaks the policy before dpkg runs.

Run by apt (through ``/bin/sh -c``) for every install, upgrade or removal, with the transaction on the file
descriptor in ``APT_HOOK_INFO_FD``. It reads the compiled policy (plain JSON) and the installed set from
/var/lib/dpkg/status, computes the set the transaction would leave, evaluates it and exits:

    0   allowed (warnings, pre-existing violations and open override windows are reported on stderr)
    2   bad hook arguments (the apt.conf.d snippet is wrong): refused
    10  refused: the transaction breaks the policy
    11  refused by the fail-safe: the compiled policy is missing or invalid (wrong types, not UTF-8, too deep, too
        large, not a regular file)
    12  refused by the fail-safe: the hook input is malformed, of another protocol version than 3, not UTF-8,
        larger than 64 MiB or not ended within --input-timeout-seconds (default 60), or dpkg's status file cannot
        be read
    13  refused by the fail-safe: internal error

Any non-zero exit makes apt stop with exit code 100 before dpkg touches anything. When the policy cannot be read
or the input cannot be parsed, the fail-safe mode decides (default ``block-guarded``: refuse only transactions
that touch guarded packages; input not read whole, being cut short, of another protocol or not text, is refused
since what it does not show may touch them). It never prints a traceback. It imports the standard library only:
it is on the hot path of every apt run and must not need the agent's daemon or its dependencies.
"""

from __future__ import annotations

import posix  # os's own functions, without importing os (see agent/hostfacts/paths.py)
import sys

from agent.errors import InputFileError, InputNotWhole
from agent.guard.apt.protocol import guess_packages, parse_hook_input
from agent.guard.hotpath import entry
from agent.guard.hotpath.decision import EXIT_USAGE, PREFIX, Decision
from agent.guard.hotpath.stream import read_bounded
from agent.hostfacts.dpkg_status import installed_versions, iter_named
from agent.hostfacts.package_keys import package_key
from agent.hostfacts.paths import read_regular_file, under
from agent.policy.globs import any_glob, split_globs

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs milliseconds of the apt hook's start-up budget
    import datetime as dt
    from typing import Callable, Dict, Optional, Sequence, TextIO, Tuple

    from agent.policy.compiled import CompiledPolicy

BYPASS_HINT = "to bypass the guard for one apt run (audited nowhere; prefer an override window): " \
              "apt-get -o DPkg::Pre-Install-Pkgs::gpuguard= ..."


# apt's own input for a 10,000-package transaction is about 3 MB; dpkg's status file can be tens of MB.
MAX_INPUT_BYTES = 64 << 20
MAX_STATUS_BYTES = 512 << 20


def _read_input(environ: Dict[str, str], fd: Optional[int], timeout_seconds: float) -> Tuple[bytes, str, Optional[str]]:
    """The raw hook input (at most MAX_INPUT_BYTES of it, waiting at most ``timeout_seconds`` for its end), where it
    came from, and what kept it from being read whole (None when nothing did)."""
    if fd is None:
        raw_fd = environ.get("APT_HOOK_INFO_FD", "0")
        if not raw_fd.isdigit():
            raise ValueError(f"APT_HOOK_INFO_FD={raw_fd!r} is not a file descriptor number")
        fd = int(raw_fd)
    data, problem = read_bounded(fd, MAX_INPUT_BYTES, timeout_seconds)
    return data, f"apt hook input (fd {fd})", problem


def _read_status(root: str) -> bytes:
    """dpkg's status file, read without blocking and bounded; InputFileError when it cannot be read."""
    path = under(root, "/var/lib/dpkg/status")
    try:
        return read_regular_file(path, MAX_STATUS_BYTES)
    except FileNotFoundError:
        return b""
    except OSError as exc:
        raise InputFileError(path, exc.strerror or str(exc)) from None


def run(args: entry.Args, environ: Dict[str, str], fd: Optional[int], err: TextIO,
        now: Callable[[], dt.datetime]) -> int:
    """One run of the hook over the input on ``fd``: the shared check (hotpath/entry.py) with apt's parser."""
    def say(line: str) -> None:
        err.write(f"{PREFIX}: {line}\n")

    data, source, problem = _read_input(environ, fd, args.input_timeout_seconds)
    text = data.decode("utf-8", errors="replace")  # for the fail-safe's guess only: parse() reads it strictly

    def parse(raw: str) -> entry.Parsed:
        if problem:
            raise InputNotWhole(source, problem)
        try:
            data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InputNotWhole(source, f"byte {exc.start}: not UTF-8: not what apt writes") from None
        request = parse_hook_input(raw, source)

        def installed(policy: CompiledPolicy) -> Dict[str, str]:
            """The installed versions of the guarded packages, from dpkg's status file.

            The transaction's own packages need none: apt names their old versions, which the decision takes as
            the truth (hotpath/transaction.before_set). Plain globs (``name``, ``prefix*``, ``*suffix``) are
            looked up at C speed; any other glob makes it a scan of every stanza.
            """
            status = _read_status(args.root)
            names, prefixes, suffixes, others = split_globs(policy.guarded)
            if others:
                return installed_versions(status.decode("utf-8", errors="replace"), request.native_arch,
                                          want=any_glob(policy.guarded))
            known = {c.package for c in request.transaction.changes if ":" not in c.package}  # native keys
            return {package_key(name, arch, request.native_arch): version
                    for name, version, arch, _ in iter_named(status, names, prefixes, suffixes, known,
                                                             request.native_arch)}

        return entry.Parsed(request.transaction, installed)

    decision = Decision("apt", args.root, args.state_dir, say, now, BYPASS_HINT)
    return entry.check(decision, args.policy_file, args.policy_dir, text, parse, guess_packages)


def _environ() -> Dict[str, str]:
    """The environment as os.environ decodes it (the file system encoding, undecodable bytes escaped)."""
    encoding = sys.getfilesystemencoding()
    return {key.decode(encoding, "surrogateescape"): value.decode(encoding, "surrogateescape")
            for key, value in posix.environ.items()}


def _utc_now() -> dt.datetime:
    """Now, in UTC; datetime is imported only when a decision records or checks a window (3 ms of start-up)."""
    import datetime

    return datetime.datetime.now(datetime.timezone.utc)


def main(argv: Optional[Sequence[str]] = None, environ: Optional[Dict[str, str]] = None,
         fd: Optional[int] = None, err: Optional[TextIO] = None,
         now: Optional[Callable[[], dt.datetime]] = None) -> int:
    """Hook entry point; returns the exit code and never raises (not even a traceback for a bug)."""
    stream = err if err is not None else sys.stderr
    clock = now or _utc_now
    try:
        args = entry.parse_args(sys.argv[1:] if argv is None else argv, "apt")
    except ValueError as exc:
        stream.write(f"{PREFIX}: REFUSED: bad hook arguments ({exc}); fix the apt.conf.d snippet, or "
                     f"{BYPASS_HINT}\n")
        return EXIT_USAGE
    return entry.never_raise(lambda: run(args, _environ() if environ is None else environ, fd, stream, clock),
                             stream, BYPASS_HINT)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
