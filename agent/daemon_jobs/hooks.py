"""Lazy hooks into the parts of gpuguard built beside the daemon: the policy engine and the health runner.

Each is imported on first use; when the module (or the entry point in it) is missing, the daemon carries on
without it and says so once in its log. The entry points the daemon calls:

- ``agent.policy.compliance.check_snapshot(snapshot, settings, root=...) -> Optional[Sequence[PolicyViolation]]``
  the report payloads for every rule the installed stack violates (empty: compliant; None: no policy). Called after every
  snapshot with the current settings and reads the compiled policy then, so a SIGHUP (or a recompiled policy)
  takes effect at the next snapshot; the pure ``agent.policy.evaluate`` stays free of agent imports.
- ``agent.health.runner.run_health_check(host, health_settings, state_dir, snapshot=...) -> HealthResult`` and
  ``agent.health.events.payloads_for(result) -> [HealthRegression | CpuFallback]``; at start
  ``agent.health.runner.load_last_result(state_dir)`` gives the last status back.
"""

from __future__ import annotations

import importlib
import threading
from typing import Any, Callable, Dict, Optional

from agent.log import get_logger

log = get_logger("hooks")

HOOKS = {
    "policy_check": ("agent.policy.compliance", "check_snapshot"),
    "health_run": ("agent.health.runner", "run_health_check"),
    "health_last": ("agent.health.runner", "load_last_result"),
    "health_payloads": ("agent.health.events", "payloads_for"),
    "health_settings": ("agent.health.settings", "HealthSettings"),
}


class LazyHook:
    """Imports ``module.attribute`` when first asked; None (logged once) when it is not there."""

    def __init__(self, module: str, attribute: str, importer: Callable[[str], Any] = importlib.import_module) -> None:
        self.module = module
        self.attribute = attribute
        self._importer = importer
        self._resolved: Optional[Callable[..., Any]] = None
        self._missing_logged = False
        self._lock = threading.Lock()

    def resolve(self) -> Optional[Callable[..., Any]]:
        with self._lock:
            if self._resolved is not None:
                return self._resolved
            try:
                module = self._importer(self.module)
                found = getattr(module, self.attribute, None)
                reason = None if callable(found) else f"{self.module} has no callable {self.attribute}"
            except ImportError as exc:
                found, reason = None, f"{self.module} is not installed ({exc})"
            if reason is not None:
                if not self._missing_logged:
                    log.warning("hook_unavailable", hook=f"{self.module}.{self.attribute}", reason=reason)
                    self._missing_logged = True
                return None
            self._resolved = found
            return found


def default_hooks(importer: Callable[[str], Any] = importlib.import_module) -> Dict[str, LazyHook]:
    """One LazyHook per entry point in HOOKS."""
    return {name: LazyHook(module, attribute, importer) for name, (module, attribute) in HOOKS.items()}
