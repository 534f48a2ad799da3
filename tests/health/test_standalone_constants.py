"""The stand-alone scripts (the probe, the workload shim) carry their own copies of the wire constants the agent
parses them with; these tests hold the copies equal to agent/health/model.py and keep the scripts out of the agent's
imports (they are run by path, and importing one would pull argparse/runpy into the agent's parsers)."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Dict

import pytest

from agent.health import model

HEALTH = Path(model.__file__).parent
AGENT = HEALTH.parent


def module_constants(path: Path) -> Dict[str, object]:
    """The module-level ``NAME = <literal>`` assignments of a file, without importing it."""
    found: Dict[str, object] = {}
    for node in ast.parse(path.read_text(encoding="utf-8"), str(path)).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            try:
                found[node.targets[0].id] = ast.literal_eval(node.value)
            except ValueError:
                continue
    return found


@pytest.mark.parametrize("script, name, home", [
    ("probe.py", "RESULT_MARKER", "RESULT_MARKER"),
    ("workload_shim.py", "REPORT_MARKER", "WORKLOAD_REPORT_MARKER"),
    ("workload_shim.py", "NONCE_ENV", "WORKLOAD_NONCE_ENV"),
])
def test_a_scripts_copy_equals_the_agents(script: str, name: str, home: str) -> None:
    """Each stand-alone script's copy of a marker or environment name equals agent/health/model.py's."""
    assert module_constants(HEALTH / script)[name] == getattr(model, home)


def test_no_agent_module_imports_a_standalone_script() -> None:
    """No module of the agent imports the probe or the workload shim (they run by path, in another interpreter)."""
    importers = []
    for path in sorted(AGENT.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            names = ([node.module or "", *(f"{node.module}.{a.name}" for a in node.names)]
                     if isinstance(node, ast.ImportFrom)
                     else [a.name for a in node.names] if isinstance(node, ast.Import) else [])
            if any(n in ("agent.health.probe", "agent.health.workload_shim") for n in names):
                importers.append(str(path.relative_to(AGENT.parent)))
    assert importers == []
