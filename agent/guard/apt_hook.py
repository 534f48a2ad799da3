"""The apt ``DPkg::Pre-Install-Pkgs`` hook: refuse a transaction that breaks the policy before dpkg runs.

Run by apt (through ``/bin/sh -c``) for every install, upgrade or removal, with the transaction on the file
descriptor in ``APT_HOOK_INFO_FD``. It reads the compiled policy (plain JSON) and the installed set from
/var/lib/dpkg/status, computes the set the transaction would leave, evaluates it and exits:

    0   allowed (warnings, pre-existing violations and open override windows are reported on stderr)
    2   bad hook arguments (the apt.conf.d snippet is wrong): refused
    10  refused: the transaction breaks the policy
    11  refused by the fail-safe: the compiled policy is missing or invalid
    12  refused by the fail-safe: the hook input is malformed or of an unknown protocol version
    13  refused by the fail-safe: internal error

Any non-zero exit makes apt stop with exit code 100 before dpkg touches anything. When the policy cannot be read
or the input cannot be parsed, the fail-safe mode decides (default ``block-guarded``: refuse only transactions
that touch guarded packages). It never prints a traceback. It imports the standard library only: it is on the
hot path of every apt run and must not need the agent's daemon or its dependencies.
"""

from __future__ import annotations

import datetime as dt
import fnmatch
import os
import re
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs milliseconds of the apt hook's start-up budget
    from typing import Callable, Dict, Optional, Sequence, TextIO, Tuple

from agent.guard.decision import (EXIT_ALLOW, EXIT_FAILSAFE_INPUT, EXIT_FAILSAFE_POLICY, EXIT_INTERNAL,  # noqa: F401
                                  EXIT_REFUSED, EXIT_USAGE, PREFIX)
from agent.guard.decision import gpu_targets as _gpu_targets  # noqa: F401 - kept for callers of the old names
from agent.guard.decision import os_release as _os_release  # noqa: F401
from agent.guard.decision import under as _under

BYPASS_HINT = "to bypass the guard for one apt run (audited nowhere; prefer an override window): " \
              "apt-get -o DPkg::Pre-Install-Pkgs::gpuguard= ..."


class _Args:
    root = "/"
    state_dir = "/var/lib/gpuguard"
    policy_file: Optional[str] = None
    policy_dir = "/etc/gpuguard/policy.d"


def _parse_args(argv: Sequence[str]) -> _Args:
    args = _Args()
    items = list(argv)
    while items:
        flag = items.pop(0)
        if flag in ("--root", "--state-dir", "--policy-file", "--policy-dir") and items:
            setattr(args, flag[2:].replace("-", "_"), items.pop(0))
        else:
            raise ValueError(f"unknown or incomplete argument {flag!r}")
    return args


def _read_input(environ: Dict[str, str], fd: Optional[int]) -> Tuple[str, str]:
    """The raw hook input and where it came from."""
    if fd is None:
        raw_fd = environ.get("APT_HOOK_INFO_FD", "0")
        if not raw_fd.isdigit():
            raise ValueError(f"APT_HOOK_INFO_FD={raw_fd!r} is not a file descriptor number")
        fd = int(raw_fd)
    chunks = []
    while True:
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks).decode("utf-8", errors="replace"), f"apt hook input (fd {fd})"


class Hook:
    """One run of the hook; every outcome goes through ``say`` (stderr) and an exit code."""

    def __init__(self, args: _Args, err: TextIO, now: Callable[[], dt.datetime]) -> None:
        from agent.guard.decision import Decision

        self.args = args
        self.err = err
        self.now = now
        self.decision = Decision("apt", args.root, args.state_dir, self.say, now, BYPASS_HINT)
        self.paths = self.decision.paths

    def say(self, line: str) -> None:
        self.err.write(f"{PREFIX}: {line}\n")

    def path(self, host_path: str) -> str:
        return _under(self.args.root, host_path)

    def record(self, record: Dict[str, object]) -> None:
        """Queue a guard event for the daemon and keep an audit line; never fails the hook."""
        self.decision.record(record)

    # --- policy -----------------------------------------------------------------------------------------------

    def load_policy(self):
        return self.decision.load_policy(self.args.policy_file, self.args.policy_dir)

    # --- decisions --------------------------------------------------------------------------------------------

    def failsafe(self, mode: str, guarded: Sequence[str], names: Sequence[str], why: str, code: int,
                 command_line: Optional[str]) -> int:
        return self.decision.failsafe(mode, guarded, names, why, code, command_line)

    def run(self, environ: Dict[str, str], fd: Optional[int]) -> int:
        from agent.errors import InputFileError
        from agent.guard.apt import guess_packages, parse_hook_input
        from agent.policy.compiled import DEFAULT_FAILSAFE, DEFAULT_GUARDED

        policy, policy_problem = self.load_policy()
        mode = policy.failsafe if policy else DEFAULT_FAILSAFE
        guarded = policy.guarded if policy else list(DEFAULT_GUARDED)
        text, source = _read_input(environ, fd)
        try:
            request = parse_hook_input(text, source)
        except InputFileError as exc:
            return self.failsafe(mode, guarded, guess_packages(text), f"cannot read the transaction: {exc}",
                                 EXIT_FAILSAFE_INPUT, None)
        tx = request.transaction
        if policy is None:
            return self.failsafe(mode, guarded, [c.package for c in tx.changes],
                                 f"no usable policy ({policy_problem})", EXIT_FAILSAFE_POLICY, tx.command_line)
        try:
            return self.decide(policy, request)
        except Exception as exc:  # noqa: BLE001 - a bug in evaluation still ends in the fail-safe decision
            return self.failsafe(mode, guarded, [c.package for c in tx.changes],
                                 f"internal error ({type(exc).__name__}: {exc})", EXIT_INTERNAL, tx.command_line)

    def decide(self, policy, request) -> int:
        """Read the installed set the policy cares about from /var/lib/dpkg/status and decide (decision.py)."""
        from agent.dpkg_status import installed_versions

        tx = request.transaction
        if not tx.changes:
            return EXIT_ALLOW
        tx_names = {c.package for c in tx.changes}
        guarded = re.compile("|".join(fnmatch.translate(p) for p in policy.guarded) or "(?!)")
        try:
            with open(self.path("/var/lib/dpkg/status"), encoding="utf-8", errors="replace") as handle:
                status_text = handle.read()
        except FileNotFoundError:
            status_text = ""
        installed = installed_versions(status_text, request.native_arch,
                                       want=lambda n: guarded.match(n) or n in tx_names)
        return self.decision.decide(policy, tx, installed)


def main(argv: Optional[Sequence[str]] = None, environ: Optional[Dict[str, str]] = None,
         fd: Optional[int] = None, err: Optional[TextIO] = None,
         now: Optional[Callable[[], dt.datetime]] = None) -> int:
    """Hook entry point; returns the exit code and never raises (not even a traceback for a bug)."""
    stream = err if err is not None else sys.stderr
    clock = now or (lambda: dt.datetime.now(dt.timezone.utc))
    try:
        args = _parse_args(sys.argv[1:] if argv is None else argv)
    except ValueError as exc:
        stream.write(f"{PREFIX}: REFUSED: bad hook arguments ({exc}); fix the apt.conf.d snippet, or "
                     f"{BYPASS_HINT}\n")
        return EXIT_USAGE
    try:
        return Hook(args, stream, clock).run(dict(os.environ) if environ is None else environ, fd)
    except KeyboardInterrupt:
        stream.write(f"{PREFIX}: REFUSED: interrupted\n")
        return EXIT_INTERNAL
    except Exception as exc:  # noqa: BLE001 - the hook must fail safe with one line, never a traceback
        stream.write(f"{PREFIX}: REFUSED by fail-safe: internal error ({type(exc).__name__}: {exc}); "
                     f"{BYPASS_HINT}\n")
        return EXIT_INTERNAL


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
