"""The guard's rollback checks wired from agent Settings, as the daemon and ``gpuguard guard rollback`` wire them."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, List, Optional

from agent.config import Settings
from agent.guard.manager import PackageTool, backend_for
from agent.guard.rollback.backend import PackageBackend
from agent.guard.rollback.core import GuardResult, check_and_rollback
from agent.guard.rollback.health import rollback_before_change
from agent.host import Host
from agent.statepaths import StatePaths

if TYPE_CHECKING:  # pragma: no cover
    from agent.daemon_jobs.health import HealthJob


def check(host: Host, settings: Optional[Settings] = None, tool: Optional[PackageTool] = None,
          backend: Optional[PackageBackend] = None, **kwargs: Any) -> GuardResult:
    """check_and_rollback with ``settings``' guard section and state directory, and ``backend`` (default: the one
    for the host's package database, over ``tool`` when given)."""
    settings = settings or Settings()
    paths = StatePaths(settings.agent.state_dir)
    return check_and_rollback(host, settings.guard, paths, backend or backend_for(host, settings.guard, paths, tool),
                              **kwargs)


def health_rollback(host: Host, settings: Settings, health_status: str, backend: Optional[PackageBackend] = None,
                    **kwargs: Any) -> GuardResult:
    """rollback_before_change with ``settings``' state directory and ``backend`` (default: the host's)."""
    paths = StatePaths(settings.agent.state_dir)
    return rollback_before_change(host, paths, backend or backend_for(host, settings.guard, paths), health_status,
                                  **kwargs)


def health_job(host: Host, settings: Settings, work: Path, run: Callable[..., Any],
               payloads: Callable[[Any], List[Any]]) -> "HealthJob":
    """A HealthJob over ``host`` as the daemon wires it (its rollback through :func:`health_rollback`, no snapshot;
    the guarded sets), ``run`` standing for the health check; its runtime's state and outbox in ``work`` (the caller
    closes ``job.runtime.outbox``)."""
    from agent.daemon_jobs.health import HealthJob
    from agent.daemon_jobs.hooks import Hooks, guarded_sets
    from agent.daemon_jobs.resident_settings import SettingsInForce
    from agent.daemon_jobs.runtime import EventEmitter, Runtime
    from agent.guard.rollback.backend import InstalledPackage
    from agent.report.outbox import Outbox

    outbox = Outbox(str(work / "outbox.sqlite3"))
    rt = Runtime(host=host, in_force=SettingsInForce.of(settings), state_dir=str(work), outbox=outbox,
                 emitter=EventEmitter(outbox, "test-host", "chroot", host.clock))

    def rollback(host: Host, settings: Settings, status: str, sink: Any, target: Any = None,
                 covers: str = "") -> Any:
        packages = None if target is None else {k: InstalledPackage(*v) for k, v in target.items()}
        return health_rollback(host, settings, status, sink=sink, target=packages, covers=covers,
                               snapshot=lambda h: None)

    return HealthJob(rt, Hooks(health_run=run, health_payloads=payloads, health_rollback=rollback,
                               guarded_sets=guarded_sets))


def cpu_fallback_payloads(result: Any) -> List[Any]:
    """The events of a stand-in health check: a CpuFallback when its status says so, else none."""
    from agent.report.events import CpuFallback

    return [CpuFallback(reason="ran_on_cpu", fingerprint="fp")] if result.status == "cpu_fallback" else []
