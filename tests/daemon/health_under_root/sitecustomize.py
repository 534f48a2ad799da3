"""A test seam for agent processes of tests/daemon/test_rollout_fleet.py (put first on their PYTHONPATH): with
``GPUGUARD_TEST_HEALTH_UNDER_ROOT=1`` the health job runs under ``--root`` too, where it is otherwise skipped ("the
probe measures this machine, not the tree under --root", agent/daemon_jobs/health.py). The probe those agents run is
tests/health/probes/fake_probe.py, which measures nothing, so each fake host gets a real post-change check from a
real job child. Nothing else changes: the package tools still run chrooted (agent/host.py ``is_live`` is untouched).
"""

import importlib.abc
import importlib.util
import os
import sys
from typing import Any

_TARGET = "agent.daemon_jobs.health"


class _Patch(importlib.abc.MetaPathFinder):
    """Finds ``agent.daemon_jobs.health`` once, and lifts the fake-root skip after the module has run."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name != _TARGET:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        loader = spec.loader if spec is not None else None
        if loader is None:
            return spec
        original = loader.exec_module

        def exec_module(module: Any) -> None:
            original(module)
            module.HealthSkips.skipped = lambda skips: not skips.runtime.settings.health_enabled

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


if os.environ.get("GPUGUARD_TEST_HEALTH_UNDER_ROOT") == "1":
    sys.meta_path.insert(0, _Patch())
