"""What ``gpuguard snapshot`` loads: only what a snapshot uses (issue #17, a lean agent).

The command line builds its parser from plain default paths (agent/defaults.py) and each command imports its own
code, so a snapshot loads no other area's settings model (guard, health, report, hub), no pydantic (its snapshot
types are frozen dataclasses), no logger library when it logs nothing, no scheduler and no HTTP client. Checked in
a fresh interpreter, the way the installed command runs.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FIXTURE_ROOT = REPO / "tests" / "fixtures" / "roots" / "gpuless-debian12"

# Modules (or packages: a name covers its submodules) a snapshot must not import.
NOT_FOR_A_SNAPSHOT = (
    "agent.config", "agent.guard.settings", "agent.health", "agent.report", "agent.hub", "agent.daemon",
    "agent.daemon_jobs", "agent.snapshot.diff", "structlog", "rich", "asyncio", "apscheduler", "requests",
    "urllib3", "fastapi", "uvicorn", "pydantic", "pydantic_core", "annotated_types", "agent.models",
)
# The libraries whose import alone would cost more than the operator's own reads (issue #17).
HEAVY_LIBRARIES = ("pydantic", "pydantic_core", "structlog", "apscheduler", "requests")

_PROBE = """
import io, json, sys
sys.path.insert(0, sys.argv[1])
from agent.cli import main
out = io.StringIO()
code = main(["snapshot", "--json", "--root", sys.argv[2], "--config", sys.argv[3]], out=out)
json.loads(out.getvalue())
print(json.dumps({"code": code, "modules": sorted(sys.modules)}))
"""


def _loaded(tmp_path: Path, config_text: str = "") -> dict:
    config = tmp_path / "agent.toml"
    if config_text:
        config.write_text(config_text)
    result = subprocess.run([sys.executable, "-I", "-c", _PROBE, str(REPO), str(FIXTURE_ROOT), str(config)],
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def _offenders(modules: list) -> list:
    return sorted(m for m in modules if any(m == bad or m.startswith(bad + ".") for bad in NOT_FOR_A_SNAPSHOT))


def test_snapshot_imports_only_what_it_uses(tmp_path: Path) -> None:
    """No settings model of another area, no structlog/asyncio, no scheduler, no HTTP client."""
    seen = _loaded(tmp_path)
    assert seen["code"] == 0
    assert "agent.snapshot.take" in seen["modules"]
    assert _offenders(seen["modules"]) == []


def test_snapshot_with_a_config_file_reads_only_its_section(tmp_path: Path) -> None:
    """A config file with every section still loads only [snapshot]'s model."""
    seen = _loaded(tmp_path, '[snapshot]\nextra_watched_packages = ["python3"]\n[health]\nenabled = true\n'
                             '[report]\n[guard]\n')
    assert seen["code"] == 0
    assert _offenders(seen["modules"]) == []


def test_snapshot_imports_no_pydantic_structlog_scheduler_or_http_client(tmp_path: Path) -> None:
    """Neither pydantic nor structlog, apscheduler or requests, with or without a [snapshot] section to check."""
    for config_text in ("", '[snapshot]\ninterval_seconds = 60\nwatched_packages = ["linux-image-*"]\n'):
        seen = _loaded(tmp_path, config_text)
        assert seen["code"] == 0
        assert [m for m in seen["modules"] if m.split(".")[0] in HEAVY_LIBRARIES] == []


def test_parser_needs_no_pydantic() -> None:
    """Building the parser (``--help`` of every command) imports neither pydantic nor any agent model."""
    code = ("import sys; sys.path.insert(0, sys.argv[1]); from agent.cli import build_parser; build_parser(); "
            "print(' '.join(sorted(m for m in sys.modules if m.split('.')[0] in ('pydantic', 'structlog') "
            "or m in ('agent.models', 'agent.host'))))")
    result = subprocess.run([sys.executable, "-I", "-c", code, str(REPO)], capture_output=True, text=True,
                            timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == ""
