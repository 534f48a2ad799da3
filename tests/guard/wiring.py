"""The guard's rollback checks wired from agent Settings, as the daemon and ``gpuguard guard rollback`` wire them."""

from __future__ import annotations

from typing import Any, Optional

from agent.config import Settings
from agent.guard.manager import PackageTool, backend_for
from agent.guard.rollback.backend import PackageBackend
from agent.guard.rollback.core import GuardResult, check_and_rollback
from agent.guard.rollback.health import rollback_before_change
from agent.host import Host
from agent.statepaths import StatePaths


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
