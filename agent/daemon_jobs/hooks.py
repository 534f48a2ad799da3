"""The daemon's entry points into the policy engine, the health runner and the health-gated rollback, as Protocols.

:func:`default_hooks` wires the real ones; tests hand the jobs fakes (``Hooks(policy_check=...)``), and a hook left
``None`` is skipped. Each is a small Protocol, the call the job makes, so a fake is checked against the same shape:

- :class:`PolicyCheck`: ``agent.report.compliance.check_snapshot``, the report payloads for every rule the installed
  stack violates (empty: compliant; None: no policy). Called after every snapshot with the configured state
  directory; it reads the compiled policy then, so a SIGHUP (or a recompiled policy) takes effect at the next snapshot.
- :class:`HealthRun`, :class:`HealthPayloads`: ``agent.health.runner.run_health_check`` and
  ``agent.health.events.payloads_for``; :class:`HealthLast`: ``agent.health.last.load_last_result``, the last result
  given back at start.
- :class:`HealthRollback`: the health-gated rollback after a package change,
  ``agent.guard.rollback.health.rollback_before_change`` with the settings' StatePaths and package backend (apt/dnf
  tooling imported only when one is due), to the health gate's last set that passed when it has one.
- :class:`GuardedSets`: the guarded packages installed now and the guard's known-good set, as the health gate
  (agent/guard/rollback/health_gate.py) compares them.

They run where the job bodies that call them run: in a job child (agent/daemon_jobs/child_main.py), or in-process in
tests; the resident daemon holds none of them (their types are imported for the type checker only).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Mapping, Optional, Protocol, Sequence, Tuple

# package key -> (version, arch): a guarded set as the health gate keeps it (agent/guard/rollback/health_gate.py)
Installed = Mapping[str, Tuple[str, str]]

if TYPE_CHECKING:  # pragma: no cover
    from agent.config import Settings
    from agent.guard.rollback.core import GuardResult
    from agent.health.events import HealthPayload
    from agent.health.model import HealthResult
    from agent.health.settings import HealthMode, HealthSettings
    from agent.host import Host
    from agent.report.events import PolicyViolation, Rollback
    from agent.snapshot.model import Snapshot


class PolicyCheck(Protocol):
    def __call__(self, snapshot: Snapshot, state_dir: str, root: str = ...) -> Optional[Sequence[PolicyViolation]]:
        ...


class HealthRun(Protocol):
    def __call__(self, host: Host, settings: HealthSettings, state_dir: str, snapshot: Optional[Snapshot] = ...,
                 *, mode: Optional[HealthMode] = ...) -> HealthResult:
        ...


class HealthLast(Protocol):
    def __call__(self, state_dir: str) -> Optional[HealthResult]:
        ...


class HealthPayloads(Protocol):
    def __call__(self, result: HealthResult) -> Sequence[HealthPayload]:
        ...


class HealthRollback(Protocol):
    def __call__(self, host: Host, settings: Settings, health_status: str, sink: Callable[[Rollback], None],
                 target: Optional[Installed] = None, covers: str = "") -> GuardResult:
        ...


class GuardedSets(Protocol):
    def __call__(self, host: Host, settings: Settings) -> Optional[GuardedNow]:
        ...


@dataclass(frozen=True)
class GuardedNow:
    """The guarded packages installed now and the guard's known-good set (None: none recorded), as the health
    gate compares them: package key -> (version, arch)."""

    installed: Installed
    known_good: Optional[Installed]


@dataclass(frozen=True)
class Hooks:
    """The callables the snapshot and health jobs use; None: that part is not wired (tests)."""

    policy_check: Optional[PolicyCheck] = None
    health_run: Optional[HealthRun] = None
    health_last: Optional[HealthLast] = None
    health_payloads: Optional[HealthPayloads] = None
    health_rollback: Optional[HealthRollback] = None
    guarded_sets: Optional[GuardedSets] = None


def default_hooks() -> Hooks:
    """The real policy engine and health runner (imported here, in the job child that runs them)."""
    from agent.health.events import payloads_for
    from agent.health.last import load_last_result
    from agent.health.runner import run_health_check
    from agent.report.compliance import check_snapshot

    return Hooks(policy_check=check_snapshot, health_run=run_health_check, health_last=load_last_result,
                 health_payloads=payloads_for, health_rollback=_health_rollback, guarded_sets=guarded_sets)


def _health_rollback(host: Host, settings: Settings, health_status: str, sink: Callable[[Rollback], None],
                     target: Optional[Installed] = None, covers: str = "") -> GuardResult:
    from agent.guard.manager import backend_for
    from agent.guard.rollback.backend import InstalledPackage
    from agent.guard.rollback.health import rollback_before_change
    from agent.statepaths import StatePaths

    paths = StatePaths(settings.agent.state_dir)
    packages = None if target is None else {k: InstalledPackage(v[0], v[1]) for k, v in target.items()}
    return rollback_before_change(host, paths, backend_for(host, settings.guard, paths), health_status, sink=sink,
                                  target=packages, covers=covers)


def guarded_sets(host: Host, settings: Settings) -> Optional[GuardedNow]:
    """The guarded packages installed now and the known-good set; None without a compiled policy (no guarded set)."""
    from agent.guard.manager import backend_for
    from agent.guard.rollback.core import load_known_good
    from agent.guard.rollback.repoint import with_trees
    from agent.policy.compiled import read_compiled
    from agent.statepaths import StatePaths

    paths = StatePaths(settings.agent.state_dir)
    compiled = host.path(paths.compiled_policy)
    if not compiled.exists():
        return None
    policy = read_compiled(str(compiled))
    installed = backend_for(host, settings.guard, paths).read_installed(policy.guarded)
    known_good = load_known_good(host, paths)
    # The active tree of side-by-side ROCm trees is part of both (agent/guard/rollback/repoint.py): a repoint is a
    # change of the window; the guard does not judge trees, so its known-good set counts the tree in place as good.
    return GuardedNow(with_trees(host, {k: (v.version, v.arch) for k, v in installed.items()}),
                      None if known_good is None else with_trees(host, {k: (v.version, v.arch)
                                                                        for k, v in known_good.items()}))
