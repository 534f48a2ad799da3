"""The health gate's window: the last guarded set that passed a health check, and the package changes since.

A post-change check used to be judged against "the change" that asked for it, with the set the guard kept before
that change; in a burst (a bypass rolled back, then an allowed package installed 4 s later) the check judged the
wrong change and found nothing to restore. The gate judges every verdict against the **last set that passed**:

    a package change (the guard's check, or a check that sees the installed set moved)  -> the window opens/grows
    pass, the set unchanged during the check, and the guard's known-good set (or the    -> that set is the last
      last-passed set itself)                                                              one that passed; closed
    pass while a change arrived during the check                                        -> nothing recorded; a
                                                                                           check after it (again)
    cpu_fallback / failed / confirmed regression, window open (or the check after a     -> roll back to the last
      change), after_change = "rollback"                                                   set that passed
    busy / deferred / timeout / skipped                                                 -> no verdict: still open

``health-gate.json`` (StatePaths.health_gate) keeps it: written atomically under an flock of the state directory
(the guard's job child and the health job's child both add to it), bounded (:data:`MAX_CHANGES` changes kept, the
rest counted; :data:`MAX_MOVES` packages a change), read strictly (agent.files.read_json_file and the field checks
here). A damaged file is reported (:class:`GateStateDamaged`, ``gpuguard status``) and never overwritten: the gate
then falls back to the set kept before the change, until an operator deletes it.

The sets carry the active ROCm tree of side-by-side trees as one more entry (``alternatives:core -> (tree,
"tree")``, agent/guard/rollback/repoint.py): a repoint by update-alternatives is a change like a package's.

The window logic (:func:`observe`, :func:`record_pass`, :func:`judge`, :func:`gate_decision`) is pure and takes the
time as an argument; the file's reading and writing is :func:`load_gate` and :func:`update_gate`.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import fcntl
import json
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Dict, List, Literal, Mapping, Optional, Tuple

from agent.errors import InputFileError
from agent.files import read_json_file, write_atomically
from agent.log import get_logger

if TYPE_CHECKING:  # pragma: no cover
    from agent.guard.rollback.backend import PackageBackend
    from agent.guard.rollback.core import GuardResult
    from agent.host import Host
    from agent.statepaths import StatePaths

log = get_logger("guard.health_gate")

GATE_FORMAT = 1
MAX_CHANGES = 32  # changes kept in the window; older ones are counted (``dropped``), never silently lost
MAX_MOVES = 64  # packages named per change; more are counted in the change's ``more``
MAX_PACKAGES = 4096  # guarded packages in one set

# package key -> (version, arch)
Installed = Mapping[str, Tuple[str, str]]
ChangeBy = Literal["package_manager", "guard_rollback", "health_rollback"]
CHANGE_BY: Tuple[str, ...] = ("package_manager", "guard_rollback", "health_rollback")
# The statuses that are a verdict on the window: a pass, or what asks for a rollback (agent/guard/rollback/health.py).
FAILING_STATUSES = frozenset({"cpu_fallback", "failed", "regression"})


class GateStateDamaged(InputFileError):
    """health-gate.json cannot be read as the gate's state; it is kept as it is for the operator."""


@dataclass(frozen=True)
class GateMove:
    """One package of a change: its version before and after ("" where it was absent)."""

    package: str
    old: str
    new: str

    def describe(self) -> str:
        return f"{self.package} {self.old or '(absent)'} -> {self.new or '(absent)'}"


@dataclass(frozen=True)
class GateChange:
    """A change of the guarded packages: when it was seen, what moved, and who moved it."""

    at_seconds: float
    by: str  # one of CHANGE_BY
    moves: Tuple[GateMove, ...] = ()
    more: int = 0  # moves beyond MAX_MOVES

    def describe(self) -> str:
        when = dt.datetime.fromtimestamp(self.at_seconds, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        who = {"guard_rollback": "the guard's rollback", "health_rollback": "a health rollback"}.get(self.by, "")
        what = ", ".join(m.describe() for m in self.moves) + (f" and {self.more} more" if self.more else "")
        return f"{when} " + (f"{who}: " if who else "") + (what or "no guarded package moved")


@dataclass(frozen=True)
class GateVerdict:
    """The last verdict on the window: the health status, what came of it, and the changes it covered."""

    at_seconds: float
    status: str
    outcome: str  # passed | rolled_back | failed | no_known_good | compliant | refused | not_compliant | reported
    covers: Tuple[GateChange, ...] = ()
    dropped: int = 0


@dataclass(frozen=True)
class GateState:
    """The gate's window: the last set that passed, the installed set last seen, the changes since the pass."""

    passed: Optional[Dict[str, Tuple[str, str]]] = None
    passed_at_seconds: Optional[float] = None
    seen: Optional[Dict[str, Tuple[str, str]]] = None
    changes: Tuple[GateChange, ...] = ()
    dropped: int = 0  # changes since the pass beyond MAX_CHANGES
    noted: int = 0  # changes ever noted: a check compares it before and after to see a change during it
    verdict: Optional[GateVerdict] = None

    @property
    def window_open(self) -> bool:
        """True when package changes happened since the last pass and no verdict judged them yet."""
        return bool(self.changes) or self.dropped > 0

    def covered(self) -> str:
        """The changes a verdict now would cover, for a person (an event's detail, a log line)."""
        return describe_changes(self.changes, self.dropped)


def describe_changes(changes: Tuple[GateChange, ...], dropped: int = 0) -> str:
    """``2 package change(s): T1 ...; T2 ...`` (the oldest dropped ones counted)."""
    total = len(changes) + dropped
    if total == 0:
        return "no package change"
    head = f"{total} package change(s)" + (f" ({dropped} older not listed)" if dropped else "")
    return head + ": " + "; ".join(c.describe() for c in changes)


# --- the window (pure) -------------------------------------------------------------------------------------------

def _moves(before: Optional[Installed], after: Installed) -> List[GateMove]:
    before = before or {}
    names = sorted(set(before) | set(after))
    return [GateMove(n, before[n][0] if n in before else "", after[n][0] if n in after else "") for n in names
            if (before.get(n) or ("", ""))[0] != (after.get(n) or ("", ""))[0]]


def _append(state: GateState, change: GateChange) -> GateState:
    changes = state.changes + (change,)
    dropped = state.dropped + max(0, len(changes) - MAX_CHANGES)
    return dataclasses.replace(state, changes=changes[-MAX_CHANGES:], dropped=dropped, noted=state.noted + 1)


def observe(state: GateState, installed: Installed, at_seconds: float, by: str = "package_manager",
            moved: Optional[Tuple[Mapping[str, str], Mapping[str, str]]] = None) -> GateState:
    """The installed set as seen now; a change is added when it moved since the last look.

    ``moved`` (from_versions, to_versions) names what a rollback moved: the guard's rollback of a bypass is a change
    even when the set is back where it was. ``by="health_rollback"`` is the gate's own move back to the last set
    that passed: its recheck judges it, so it adds no change.
    """
    current = {k: (v[0], v[1]) for k, v in installed.items()}
    if moved is not None:
        old, new = moved
        moves = [GateMove(k, str(old.get(k, "")), str(new.get(k, ""))) for k in sorted(set(old) | set(new))]
    else:
        moves = _moves(state.seen, current) if state.seen is not None else []
    state = dataclasses.replace(state, seen=current)
    if by == "health_rollback" or not moves:
        return state
    return _append(state, GateChange(at_seconds, by, tuple(moves[:MAX_MOVES]), max(0, len(moves) - MAX_MOVES)))


def record_pass(state: GateState, installed: Installed, at_seconds: float, status: str = "pass") -> GateState:
    """A corroborated pass of ``installed``: the last set that passed; the changes since are judged (closed)."""
    current = {k: (v[0], v[1]) for k, v in installed.items()}
    verdict = GateVerdict(at_seconds, status, "passed", state.changes, state.dropped)
    return dataclasses.replace(state, passed=current, passed_at_seconds=at_seconds, seen=current, changes=(),
                               dropped=0, verdict=verdict)


def judge(state: GateState, at_seconds: float, status: str, outcome: str) -> GateState:
    """A failing verdict on the window (rolled back, or why not): its changes are judged, the window closes.

    Written before a rollback runs, so a crash half-way never leads to a second rollback for the same changes.
    """
    return dataclasses.replace(state, changes=(), dropped=0,
                               verdict=GateVerdict(at_seconds, status, outcome, state.changes, state.dropped))


def may_record_pass(state: GateState, before: Optional[Installed], after: Optional[Installed],
                    known_good: Optional[Installed], noted_before: int) -> bool:
    """Whether a pass may become the last set that passed: the set did not move during the check (nor was a change
    noted), and it is the guard's known-good set (compliant, judged by the guard) or the last-passed set itself."""
    if before is None or after is None or dict(before) != dict(after) or state.noted != noted_before:
        return False
    versions = {k: v[0] for k, v in after.items()}
    return any(ref is not None and {k: v[0] for k, v in ref.items()} == versions for ref in (known_good, state.passed))


def gate_decision(action: str, status: str, after_change: bool, window_open: bool, confirmed: bool = False) -> str:
    """What a check's status asks for: "rollback", "confirm" (a regression: confirm it first) or "none".

    It is the existing table (agent.guard.rollback.health.decide) for the check after a change, and for any check
    while changes since the last pass are not judged yet (a periodic check right after a change acts as the
    post-change check).
    """
    from agent.guard.rollback.health import decide

    if not (after_change or window_open):
        return "none"
    return decide(action, status, confirmed)


# --- the file ----------------------------------------------------------------------------------------------------

def _set_to_json(packages: Optional[Mapping[str, Tuple[str, str]]]) -> Optional[Dict[str, Dict[str, str]]]:
    if packages is None:
        return None
    return {k: {"version": v[0], "arch": v[1]} for k, v in sorted(packages.items())}


def _change_to_json(c: GateChange) -> Dict[str, object]:
    return {"at_seconds": c.at_seconds, "by": c.by, "more": c.more,
            "moves": [{"package": m.package, "old": m.old, "new": m.new} for m in c.moves]}


def render_gate(state: GateState) -> str:
    """The file's text (sorted keys)."""
    verdict = None
    if state.verdict is not None:
        v = state.verdict
        verdict = {"at_seconds": v.at_seconds, "status": v.status, "outcome": v.outcome, "dropped": v.dropped,
                   "covers": [_change_to_json(c) for c in v.covers]}
    data = {"format": GATE_FORMAT, "passed": _set_to_json(state.passed), "passed_at_seconds": state.passed_at_seconds,
            "seen": _set_to_json(state.seen), "changes": [_change_to_json(c) for c in state.changes],
            "dropped": state.dropped, "noted": state.noted, "verdict": verdict}
    return json.dumps(data, indent=2, sort_keys=True) + "\n"


def _str(value: object, what: str, limit: int = 512) -> str:
    if not isinstance(value, str) or len(value) > limit:
        raise ValueError(f"{what} is not a string of at most {limit} characters")
    return value


def _count(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 2 ** 53:
        raise ValueError(f"{what} is not a count")
    return value


def _seconds(value: object, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1e11:
        raise ValueError(f"{what} is not a time in Unix seconds")
    return float(value)


def _fields(data: object, what: str, allowed: Tuple[str, ...]) -> Dict[str, object]:
    if not isinstance(data, dict):
        raise ValueError(f"{what} is not an object")
    unknown = sorted(set(data) - set(allowed))
    missing = sorted(set(allowed) - set(data))
    if unknown or missing:
        raise ValueError(f"{what}: " + ", ".join([f"unknown field {u!r}" for u in unknown]
                                                 + [f"missing field {m!r}" for m in missing]))
    return data


def _set_from(data: object, what: str) -> Optional[Dict[str, Tuple[str, str]]]:
    if data is None:
        return None
    if not isinstance(data, dict) or len(data) > MAX_PACKAGES:
        raise ValueError(f"{what} is not a set of at most {MAX_PACKAGES} packages")
    out = {}
    for key, item in data.items():
        item = _fields(item, f"{what} -> {key}", ("arch", "version"))
        out[_str(key, f"{what} key")] = (_str(item["version"], f"{what} -> {key} -> version"),
                                         _str(item["arch"], f"{what} -> {key} -> arch"))
    return out


def _change_from(data: object, what: str) -> GateChange:
    d = _fields(data, what, ("at_seconds", "by", "more", "moves"))
    if d["by"] not in CHANGE_BY:
        raise ValueError(f"{what} -> by is not one of {', '.join(CHANGE_BY)}")
    moves = d["moves"]
    if not isinstance(moves, list) or len(moves) > MAX_MOVES:
        raise ValueError(f"{what} -> moves is not a list of at most {MAX_MOVES}")
    parsed = []
    for i, m in enumerate(moves):
        m = _fields(m, f"{what} -> moves -> {i}", ("new", "old", "package"))
        parsed.append(GateMove(_str(m["package"], "package"), _str(m["old"], "old"), _str(m["new"], "new")))
    return GateChange(_seconds(d["at_seconds"], f"{what} -> at_seconds"), str(d["by"]), tuple(parsed),
                  _count(d["more"], f"{what} -> more"))


def _changes_from(data: object, what: str) -> Tuple[GateChange, ...]:
    if not isinstance(data, list) or len(data) > MAX_CHANGES:
        raise ValueError(f"{what} is not a list of at most {MAX_CHANGES} changes")
    return tuple(_change_from(c, f"{what} -> {i}") for i, c in enumerate(data))


def parse_gate(data: object) -> GateState:
    """The gate's state from the file's JSON; ValueError naming the first field that is not what it must be."""
    d = _fields(data, "health gate", ("changes", "dropped", "format", "noted", "passed", "passed_at_seconds",
                                      "seen", "verdict"))
    if d["format"] != GATE_FORMAT:
        raise ValueError(f"format {d['format']!r} is not {GATE_FORMAT}")
    verdict = None
    if d["verdict"] is not None:
        v = _fields(d["verdict"], "verdict", ("at_seconds", "covers", "dropped", "outcome", "status"))
        verdict = GateVerdict(_seconds(v["at_seconds"], "verdict -> at_seconds"),
                          _str(v["status"], "verdict -> status", 32), _str(v["outcome"], "verdict -> outcome", 32),
                          _changes_from(v["covers"], "verdict -> covers"), _count(v["dropped"], "verdict -> dropped"))
    passed_at = None if d["passed_at_seconds"] is None else _seconds(d["passed_at_seconds"], "passed_at_seconds")
    return GateState(passed=_set_from(d["passed"], "passed"), passed_at_seconds=passed_at,
                     seen=_set_from(d["seen"], "seen"), changes=_changes_from(d["changes"], "changes"),
                     dropped=_count(d["dropped"], "dropped"), noted=_count(d["noted"], "noted"), verdict=verdict)


def load_gate(path: str) -> GateState:
    """The gate's state (an empty one when the file is not there); GateStateDamaged when it cannot be read as one."""
    try:
        data = read_json_file(path)  # bounded, strict UTF-8, no NaN, bounded depth
    except InputFileError as exc:
        raise GateStateDamaged(path, f"damaged health gate state ({exc.reason}); delete it to start the gate "
                                     f"over from the next pass") from None
    if data is None:
        return GateState()
    try:
        return parse_gate(data)
    except ValueError as exc:
        raise GateStateDamaged(path, f"damaged health gate state ({exc}); delete it to start the gate over from "
                                     f"the next pass") from None


def update_gate(path: str, change: Callable[[GateState], GateState]) -> GateState:
    """Read, change and write the gate's state under an exclusive flock of its directory (the guard's and the health
    job's children both write it); the new state. GateStateDamaged (nothing written) for a damaged file, OSError
    (StateWriteError: the old file kept) when it cannot be written."""
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, exist_ok=True)
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        state = change(load_gate(path))
        write_atomically(path, render_gate(state), mode=0o600)
        return state
    finally:
        os.close(fd)  # drops the flock


def note_guard_check(host: "Host", paths: "StatePaths", backend: "PackageBackend", result: "GuardResult",
                     at_seconds: float) -> Optional[GateState]:
    """After the guard's check: the installed guarded set noted in the window (a rollback of a bypass is a change
    by the guard, what it moved named). Never the guard's failure: a damaged or unwritable state is logged."""
    from agent.errors import GpuguardError
    from agent.policy.compiled import read_compiled

    moved: Optional[Tuple[Mapping[str, str], Mapping[str, str]]] = None
    by = "package_manager"
    if result.status == "rolled_back":  # named as the rollback moved it (the bypass -> the known-good versions)
        by, moved = "guard_rollback", (dict(result.from_versions), dict(result.to_versions))
    try:
        policy = read_compiled(str(host.path(paths.compiled_policy)))
        from agent.guard.rollback.repoint import with_trees  # the active tree, as the health job's sets have it

        packages = backend.read_installed(policy.guarded)
        installed = with_trees(host, {k: (v.version, v.arch) for k, v in packages.items()})
        return update_gate(str(host.path(paths.health_gate)),
                           lambda s: observe(s, installed, at_seconds, by=by, moved=moved))
    except (GpuguardError, OSError) as exc:
        log.error("health_gate_not_noted", error=str(exc), guard_status=result.status)
        return None
