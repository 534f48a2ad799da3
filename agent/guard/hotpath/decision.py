"""The guard's decision on one transaction, shared by the apt hook and the dnf checkers: pure policy, no protocol.

Given the compiled policy, a neutral Transaction and the installed set, :class:`Decision` evaluates the set the
transaction would leave, reports pre-existing violations as notes and ``warn`` rules as warnings, lets an open
override window through (audited), or prints the ``REFUSED (...)`` lines with hints (and the hub's staged-rollout
notice, hotpath/rollout.py), records the events for the
daemon and returns an exit code. :meth:`Decision.failsafe` is the single fail-safe policy (``block-guarded``,
``block-all``, ``allow``) for a policy that cannot be read, input that cannot be parsed or an internal error.
Every line goes through ``say`` (stderr, prefixed ``gpuguard:``). Standard library only, and the heavier modules
are imported only when a decision is needed: this is on the start-up path of every apt and dnf run.
"""

from __future__ import annotations

import posix  # os's own functions, without importing os (see agent/hostfacts/paths.py)

from agent.hostfacts.paths import under
from agent.policy.compiled import guarded_names

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs milliseconds of the apt hook's start-up budget
    import datetime as dt
    from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple

    from agent.guard.hotpath.transaction import Transaction
    from agent.policy.compiled import CompiledPolicy
    from agent.policy.evaluate import Violation

EXIT_ALLOW = 0
EXIT_USAGE = 2
EXIT_REFUSED = 10
EXIT_FAILSAFE_POLICY = 11
EXIT_FAILSAFE_INPUT = 12
EXIT_INTERNAL = 13

PREFIX = "gpuguard"


class Decision:
    """One guard decision for a front end (``tool``: apt, dnf, dnf5) over a host root and state directory.

    ``say`` writes one line to the operator (:meth:`say` escapes it), ``bypass_hint`` tells the operator how to skip
    the guard for one run of this front end, ``record`` queues an event for the daemon (default: guard-events.jsonl
    and audit.log under the state directory; it never fails the decision).
    """

    def __init__(self, tool: str, root: str, state_dir: str, say: Callable[[str], None],
                 now: Callable[[], dt.datetime], bypass_hint: str,
                 record: Optional[Callable[[Dict[str, object]], None]] = None) -> None:
        from agent.statepaths import StatePaths

        self.tool = tool
        self.root = root
        self.paths = StatePaths(state_dir)
        self._say = say
        self.now = now
        self.bypass_hint = bypass_hint
        self.record = record or self.record_to_state

    def say(self, line: str) -> None:
        """One line to the operator, its control characters escaped: a policy's names, patterns and messages, a
        hold's reason or a file name may carry a NUL or an ESC that would reach apt's terminal as is."""
        from agent.printable import printable  # only once something is said: an allowed run says nothing

        self._say(printable(line))

    def record_to_state(self, record: Dict[str, object]) -> None:
        """Queue a guard event for the daemon and keep an audit line; never fails the decision."""
        self.records_to_state([record])

    def records_to_state(self, records: Sequence[Dict[str, object]]) -> None:
        """Queue guard events and their audit lines with one append per file; never fails the decision."""
        from agent.guard.hotpath.state import append_json_lines

        if not records:
            return
        at = self.now().isoformat()
        lines = {self.paths.guard_events: [{"occurred_at": at, **r} for r in records],
                 self.paths.audit_log: [{"at": at, "event": r.get("kind"), **r} for r in records]}
        for target, batch in lines.items():
            try:
                append_json_lines(under(self.root, target), batch)
            except OSError as exc:
                self.say(f"warning: cannot record to {target}: {exc.strerror or exc}")

    def record_many(self, records: Sequence[Dict[str, object]]) -> None:
        """Record events in order: one append per file with the default recorder (10,000 refusals were 40,000
        opens), one call each with an injected one."""
        if self.record == self.record_to_state:
            self.records_to_state(records)
        else:
            for record in records:
                self.record(record)

    def load_policy(self, compiled_path: Optional[str],
                    policy_dir: str) -> Tuple[Optional[CompiledPolicy], Optional[str]]:
        """The compiled policy (default: under the state directory) and None, or None and what is wrong with it."""
        from agent.errors import InputFileError
        from agent.policy.compiled import read_compiled

        compiled_path = compiled_path or self.paths.compiled_policy
        try:
            policy = read_compiled(under(self.root, compiled_path))
        except InputFileError as exc:
            return None, f"{compiled_path}: {exc.reason}"
        self.warn_if_stale(compiled_path, policy_dir)
        return policy, None

    def warn_if_stale(self, compiled_path: str, policy_dir: str) -> None:
        try:
            compiled_mtime = posix.stat(under(self.root, compiled_path)).st_mtime
            host_dir = under(self.root, policy_dir)
            newer = [n for n in sorted(posix.listdir(host_dir)) if n.endswith(".toml")
                     and posix.stat(f"{host_dir}/{n}").st_mtime > compiled_mtime]
        except OSError:
            return
        if newer:
            self.say(f"warning: {', '.join(newer)} in {policy_dir} changed after the policy was compiled; "
                     f"this run uses the compiled policy (run 'gpuguard policy compile')")

    def rollback_authorized(self, policy: CompiledPolicy, tx: Transaction, after: Mapping[str, str],
                            blocking: Sequence[Violation]) -> bool:
        """True (audited) when gpuguard's own rollback authorization names exactly the set ``tx`` leaves."""
        from agent.guard.hotpath.authorization import authorizing

        grant = authorizing(under(self.root, self.paths.rollback_authorization), self.now(), after,
                            policy.guarded, self.say)
        if grant is None:
            return False
        self.say(f"gpuguard's rollback {grant.get('id')} to the known-good set goes through "
                 f"({len(blocking)} rule(s) waived for exactly that set)")
        from agent.guard.hotpath.state import append_json_line

        try:  # audit only: the rollback itself is reported by the agent as a rollback event
            append_json_line(under(self.root, self.paths.audit_log), {
                "at": self.now().isoformat(), "event": "rollback_authorized", "tool": self.tool,
                "authorization": grant.get("id"), "target": grant["target"], "command_line": tx.command_line,
                "violations": [v.to_dict() for v in blocking]})
        except OSError as exc:
            self.say(f"warning: cannot record to {self.paths.audit_log}: {exc.strerror or exc}")
        return True

    def maintenance_gate(self, guarded: Sequence[str], tx: Transaction) -> Optional[int]:
        """EXIT_REFUSED (one line, audited) while a maintenance hold waits for Slurm to drain the node, or its file
        is damaged, and ``tx`` touches guarded packages; None when the change may go ahead."""
        touched = guarded_names([c.package for c in tx.changes], guarded)
        if not touched:
            return None
        from agent.guard.hotpath.maintenance import drain_wait  # only for guarded changes: one bounded read

        line, damaged = drain_wait(under(self.root, self.paths.maintenance))
        if line is None:
            return None
        self.say(f"REFUSED: {line}; it touches guarded packages: {', '.join(touched[:8])}" if damaged else line)
        from agent.guard.hotpath.state import append_json_line

        try:  # audit only: waiting for a drain is not a policy refusal (no transaction_blocked alert)
            append_json_line(under(self.root, self.paths.audit_log), {
                "at": self.now().isoformat(), "event": "maintenance_wait", "tool": self.tool, "message": line,
                "packages": list(touched), "command_line": tx.command_line})
        except OSError as exc:
            self.say(f"warning: cannot record to {self.paths.audit_log}: {exc.strerror or exc}")
        return EXIT_REFUSED

    def self_protection(self, tx: Transaction, max_override_minutes: Optional[float]) -> Optional[int]:
        """EXIT_REFUSED (named as gpuguard's own removal, recorded) when ``tx`` removes gpuguard's own package and
        no open override window was opened with ``--allow-self-removal``; None when it may go ahead (audited as
        ``override_used`` when such a window lets it).

        A window opened for a kernel or a driver does not count: a release upgrade whose python3 could not stay
        beside the installed gpuguard used to remove the guard through it, silently.
        """
        from agent.defaults import OWN_PACKAGE

        removed = [c for c in tx.changes if c.package.split(":", 1)[0] == OWN_PACKAGE and c.new_version is None]
        if not removed:
            return None
        from agent.errors import InputFileError
        from agent.guard.hotpath.overrides import LONGEST_WINDOW_MINUTES, active_windows, load_windows

        packages = {c.package: f"{c.old_version} -> (removed)" for c in removed}
        message = ("this transaction removes gpuguard itself (" + ", ".join(f"{n} {m}" for n, m in packages.items())
                   + "): afterwards no hook, pins, command or daemon guard this host's kernel and GPU stack")
        try:
            windows = active_windows(load_windows(
                under(self.root, self.paths.overrides),
                LONGEST_WINDOW_MINUTES if max_override_minutes is None else max_override_minutes), self.now())
        except InputFileError as exc:
            self.say(f"warning: ignoring override windows: {exc}")
            windows = []
        allowing = [w for w in windows if w.allow_self_removal]
        violation = {"rule": "self-protection", "action": "block", "message": message, "packages": packages}
        if allowing:
            window = allowing[0]
            self.say(f"override window {window.id} ({window.reason!r}, by {window.opened_by}, opened with "
                     f"--allow-self-removal) lets through: {message}")
            self.record({"kind": "override_used", "window": window.to_dict(), "command_line": tx.command_line,
                         "violations": [violation]})
            return None
        self.say(f"REFUSED (self-protection): {message}")
        for window in windows:
            self.say(f"the open override window {window.id} ({window.reason!r}) does not cover removing gpuguard")
        self.say("to remove gpuguard on purpose: gpuguard override start --minutes 15 --allow-self-removal "
                 "--reason '...' (audited), then run this again; to keep it, see why the transaction removes it "
                 "(a dependency such as python3 it cannot stay beside: install the gpuguard package built for the "
                 "new release first)")
        self.record({"kind": "transaction_blocked", "tool": self.tool, "rule": "self-protection",
                     "message": message, "packages": packages, "command_line": tx.command_line})
        self.say("nothing was changed")
        return EXIT_REFUSED

    def failsafe(self, mode: str, guarded: Sequence[str], names: Sequence[str], why: str, code: int,
                 command_line: Optional[str], guessed: bool = False, whole: bool = True) -> int:
        """The fail-safe decision: let through (``allow``, or ``block-guarded`` without guarded packages) or
        refuse with ``code``.

        ``guessed``: ``names`` are only what could be recognised in input that could not be read; the messages
        then say so and never claim to know what the transaction touches. ``whole=False``: the input was not even
        read whole (cut short, another protocol, not text, too large, never ended), so the names in it may not be
        all the transaction touches: ``block-guarded`` refuses it whatever they are.
        """
        touched = guarded_names(list(names), guarded)
        if mode == "allow" or (mode == "block-guarded" and whole and not touched):
            if mode == "allow":
                detail = ""
            elif not guessed:
                detail = " (it touches no guarded package)"
            elif names:
                shown = ", ".join(list(names)[:8]) + (f" and {len(names) - 8} more" if len(names) > 8 else "")
                detail = f" (none of the names it could recognise is guarded: {shown})"
            else:
                detail = " (it could recognise no package name in it)"
            self.say(f"warning: {why}; fail-safe '{mode}' lets this transaction through{detail}")
            return EXIT_ALLOW
        verb = "it names" if guessed else "it touches"
        if touched:
            what = f"{verb} guarded packages: {', '.join(touched[:8])}"
        elif not whole:
            what = "it cannot be checked: what it does not show may touch guarded packages"
        else:
            what = "it cannot be checked"
        self.say(f"REFUSED by fail-safe '{mode}': {why}; {what}")
        self.say("to proceed: fix the problem above (gpuguard policy check / gpuguard policy compile), or "
                 + self.bypass_hint)
        self.record({"kind": "transaction_blocked", "tool": self.tool, "rule": "failsafe", "message": why,
                     "packages": {n: "?" for n in touched}, "command_line": command_line})
        return code

    def decide(self, policy: CompiledPolicy, tx: Transaction, installed: Mapping[str, str]) -> int:
        """Evaluate ``tx`` over ``installed`` (the installed set, keyed like the transaction) against ``policy``."""
        from agent.errors import InputFileError
        from agent.guard.hotpath.transaction import before_set, resulting_set
        from agent.policy.evaluate import HostState, evaluate, facts_used, introduced

        if not tx.changes:
            return EXIT_ALLOW
        facts = facts_used(policy)
        context = None
        if facts:  # host facts are read (the builder and their parsers imported) only when a rule reads them
            from agent.hostfacts.context import read_host_context

            context = read_host_context(self.root, facts)
        state = HostState(before=before_set(installed, tx), after=resulting_set(installed, tx), manager=tx.manager,
                          context=context)
        violations = evaluate(state, policy)
        new = introduced(violations, state)
        new_ids = {id(v) for v in new}
        for old in (v for v in violations if id(v) not in new_ids):
            self.say(f"note: the host already violates the policy ({old.rule}): {old.message}")
        warned: List[Dict[str, object]] = []
        for warning in (v for v in new if v.action == "warn"):
            self.say(f"warning ({warning.rule}): {warning.message}")
            warned.append({"kind": "policy_violation", "rule": warning.rule, "message": warning.message,
                           "packages": warning.packages, "action": "warn"})
        self.record_many(warned)
        blocking = [v for v in new if v.action in ("block", "rollback")]
        if not blocking:
            return EXIT_ALLOW
        from agent.guard.hotpath.overrides import active_windows, load_windows  # datetime: only when refusing
        if self.rollback_authorized(policy, tx, state.after, blocking):
            return EXIT_ALLOW
        try:
            windows = active_windows(load_windows(under(self.root, self.paths.overrides),
                                                  policy.max_override_minutes), self.now())
        except InputFileError as exc:
            self.say(f"warning: ignoring override windows: {exc}")
            windows = []
        if windows:
            window = windows[0]
            self.say(f"override window {window.id} ({window.reason!r}, by {window.opened_by}, until "
                     f"{window.expires_at.isoformat(timespec='seconds')}) lets through: "
                     + "; ".join(v.message for v in blocking))
            self.record({"kind": "override_used", "window": window.to_dict(), "command_line": tx.command_line,
                         "violations": [v.to_dict() for v in blocking]})
            return EXIT_ALLOW
        refused: List[Dict[str, object]] = []
        for v in blocking:
            packages = ", ".join(f"{name} {move}" for name, move in v.packages.items())
            self.say(f"REFUSED ({v.rule}): {packages}: {v.message}")
            refused.append({"kind": "transaction_blocked", "tool": self.tool, "rule": v.rule, "message": v.message,
                            "packages": v.packages, "command_line": tx.command_line})
        self.record_many(refused)
        hints = list(dict.fromkeys(v.hint for v in blocking if v.hint))
        for hint in hints:
            self.say(f"to proceed: {hint}")
        from agent.guard.hotpath.rollout import rollout_notice  # only when refusing: a held-back host's "why"

        notice = rollout_notice(under(self.root, self.paths.policy_bundle_state))
        if notice:
            self.say(notice)
        self.say(f"policy '{policy.name}' ({', '.join(policy.sources) or policy.path}); nothing was changed")
        return EXIT_REFUSED
