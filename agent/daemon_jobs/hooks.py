"""The daemon's entry points into the policy engine and the health runner, as typed callables.

:func:`default_hooks` wires the real ones; tests hand the jobs fakes (``Hooks(policy_check=...)``), and a hook
left ``None`` is skipped. The entry points:

- ``agent.report.compliance.check_snapshot(snapshot, state_dir, root=...) -> Optional[Sequence[PolicyViolation]]``
  the report payloads for every rule the installed stack violates (empty: compliant; None: no policy). Called
  after every snapshot with the configured state directory; it reads the compiled policy then, so a SIGHUP (or a
  recompiled policy) takes effect at the next snapshot.
- ``agent.health.runner.run_health_check(host, health_settings, state_dir, snapshot=...) -> HealthResult`` and
  ``agent.health.events.payloads_for(result) -> [HealthRegression | CpuFallback]``; at start
  ``agent.health.last.load_last_result(state_dir)`` gives the last status back.
- ``agent.guard.rollback.health.rollback_before_change(host, paths, backend, health_status, sink=...)
  -> GuardResult`` the health-gated rollback after a package change, called as ``health_rollback(host, settings,
  health_status, sink=...)`` (apt/dnf tooling imported only when one is due).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional


@dataclass(frozen=True)
class Hooks:
    """The callables the snapshot and health jobs use; None: that part is not wired (tests)."""

    policy_check: Optional[Callable[..., Any]] = None
    health_run: Optional[Callable[..., Any]] = None
    health_last: Optional[Callable[[str], Any]] = None
    health_payloads: Optional[Callable[[Any], Any]] = None
    health_rollback: Optional[Callable[..., Any]] = None


def default_hooks() -> Hooks:
    """The real policy engine and health runner (imported here, when the daemon starts)."""
    from agent.health.events import payloads_for
    from agent.health.last import load_last_result
    from agent.health.runner import run_health_check
    from agent.report.compliance import check_snapshot

    return Hooks(policy_check=check_snapshot, health_run=run_health_check, health_last=load_last_result,
                 health_payloads=payloads_for, health_rollback=_health_rollback)


def _health_rollback(host: Any, settings: Any, health_status: str, **kwargs: Any) -> Any:
    from agent.guard.manager import backend_for
    from agent.guard.rollback.health import rollback_before_change
    from agent.statepaths import StatePaths

    paths = StatePaths(settings.agent.state_dir)
    return rollback_before_change(host, paths, backend_for(host, settings.guard, paths), health_status, **kwargs)
