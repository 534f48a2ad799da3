"""The one flow every front end runs (apt hook, dnf checker, dnf5 action), and the never-raise wrapper around it.

:func:`check` loads the compiled policy, parses the front end's input, and either lets the fail-safe decide (the
policy or the input cannot be read, or evaluation failed) or decides on the resulting set. :func:`never_raise`
turns anything left (a bug, an interrupt) into one ``REFUSED`` line and exit 13: a front end never prints a
traceback and never lets a transaction through because it crashed.
"""

from __future__ import annotations

from agent.defaults import DEFAULT_POLICY_DIR, DEFAULT_STATE_DIR
from agent.errors import InputFileError, InputNotWhole
from agent.guard.hotpath.decision import EXIT_ALLOW, EXIT_FAILSAFE_INPUT, EXIT_FAILSAFE_POLICY, EXIT_INTERNAL, PREFIX
from agent.guard.hotpath.stream import DEFAULT_TIMEOUT_SECONDS
from agent.policy.compiled import DEFAULT_FAILSAFE, DEFAULT_GUARDED

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs milliseconds of the hook's start-up budget
    from typing import Callable, List, Mapping, Optional, Sequence, TextIO

    from agent.guard.hotpath.decision import Decision
    from agent.guard.hotpath.transaction import Transaction
    from agent.policy.compiled import CompiledPolicy


class Parsed:
    """A front end's input: the Transaction and ``installed(policy)``, the installed set keyed like it."""

    __slots__ = ("transaction", "installed")

    def __init__(self, transaction: Transaction, installed: Callable[[CompiledPolicy], Mapping[str, str]]) -> None:
        self.transaction = transaction
        self.installed = installed


class Args:
    """A front end's command line: host root, state directory, compiled policy, policy sources, front end name, and
    how long to wait for the whole input."""

    def __init__(self, tool: str) -> None:
        self.root = "/"
        self.state_dir = DEFAULT_STATE_DIR
        self.policy_file: Optional[str] = None
        self.policy_dir = DEFAULT_POLICY_DIR
        self.tool = tool
        self.input_timeout_seconds = DEFAULT_TIMEOUT_SECONDS


def parse_args(argv: Sequence[str], tool: str, tools: Sequence[str] = ()) -> Args:
    """``--root``, ``--state-dir``, ``--policy-file``, ``--policy-dir``, ``--input-timeout-seconds`` (and
    ``--tool`` when ``tools`` names the front ends allowed); ValueError says what is wrong."""
    args = Args(tool)
    flags = ("--root", "--state-dir", "--policy-file", "--policy-dir") + (("--tool",) if tools else ())
    items = list(argv)
    while items:
        flag = items.pop(0)
        if flag in flags and items:
            setattr(args, flag[2:].replace("-", "_"), items.pop(0))
        elif flag == "--input-timeout-seconds" and items:
            value = items.pop(0)
            try:
                args.input_timeout_seconds = float(value)
            except ValueError:
                args.input_timeout_seconds = -1.0
            if not 0 < args.input_timeout_seconds < 86400:
                raise ValueError(f"--input-timeout-seconds {value[:20]!r} is not a number of seconds in (0, 86400)")
        else:
            raise ValueError(f"unknown or incomplete argument {flag!r}")
    if tools and args.tool not in tools:
        raise ValueError(f"--tool {args.tool!r} is not one of {', '.join(tools)}")
    args.root = args.root or "/"
    return args


def check(decision: Decision, policy_file: Optional[str], policy_dir: str, text: str,
          parse: Callable[[str], Parsed], guess_packages: Callable[[str], List[str]]) -> int:
    """Decide on one front end's input ``text``; every outcome is lines through ``decision.say`` and an exit code."""
    policy, policy_problem = decision.load_policy(policy_file, policy_dir)
    mode = policy.failsafe if policy else DEFAULT_FAILSAFE
    guarded = policy.guarded if policy else list(DEFAULT_GUARDED)
    try:
        parsed = parse(text)
    except InputNotWhole as exc:  # cut, another protocol, not text, too large, never ended: its words are not all
        return decision.failsafe(mode, guarded, guess_packages(text), f"cannot read the transaction: {exc}",
                                 EXIT_FAILSAFE_INPUT, None, guessed=True, whole=False)
    except InputFileError as exc:
        return decision.failsafe(mode, guarded, guess_packages(text), f"cannot read the transaction: {exc}",
                                 EXIT_FAILSAFE_INPUT, None, guessed=True)
    tx: Transaction = parsed.transaction
    names = [c.package for c in tx.changes]
    refused_self = decision.self_protection(tx, policy.max_override_minutes if policy else None)
    if refused_self is not None:  # before the policy: without gpuguard nothing judges later transactions
        return refused_self
    if policy is None:
        return decision.failsafe(mode, guarded, names, f"no usable policy ({policy_problem})", EXIT_FAILSAFE_POLICY,
                                 tx.command_line)
    if not tx.changes:
        return EXIT_ALLOW
    waiting = decision.maintenance_gate(policy.guarded, tx)
    if waiting is not None:
        return waiting
    try:
        installed: Mapping[str, str] = parsed.installed(policy)
    except InputFileError as exc:
        return decision.failsafe(mode, guarded, names, f"cannot read the installed set: {exc}", EXIT_FAILSAFE_INPUT,
                                 tx.command_line)
    except Exception as exc:  # noqa: BLE001 - a bug in reading the installed set still ends in the fail-safe
        return decision.failsafe(mode, guarded, names, f"internal error ({type(exc).__name__}: {exc})",
                                 EXIT_INTERNAL, tx.command_line)
    try:
        return decision.decide(policy, tx, installed)
    except Exception as exc:  # noqa: BLE001 - a bug in evaluation still ends in the fail-safe decision
        return decision.failsafe(mode, guarded, names, f"internal error ({type(exc).__name__}: {exc})",
                                 EXIT_INTERNAL, tx.command_line)


def never_raise(run: Callable[[], int], err: TextIO, bypass_hint: str) -> int:
    """``run()``'s exit code; an interrupt or any exception becomes one ``REFUSED`` line and EXIT_INTERNAL."""
    try:
        return run()
    except KeyboardInterrupt:
        err.write(f"{PREFIX}: REFUSED: interrupted\n")
        return EXIT_INTERNAL
    except Exception as exc:  # noqa: BLE001 - fail safe with one line, never a traceback
        err.write(f"{PREFIX}: REFUSED by fail-safe: internal error ({type(exc).__name__}: {exc}); {bypass_hint}\n")
        return EXIT_INTERNAL

