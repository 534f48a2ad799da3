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

import pytest

from tests.conftest import REPO, ROOTS, run_fresh_python

FIXTURE_ROOT = ROOTS / "gpuless-debian12"

# Modules (or packages: a name covers its submodules) a snapshot must not import.
NOT_FOR_A_SNAPSHOT = (
    "agent.config", "agent.guard.settings", "agent.health", "agent.report", "agent.hub", "agent.daemon",
    "agent.daemon_jobs", "agent.snapshot.diff", "structlog", "rich", "asyncio", "apscheduler", "requests",
    "urllib3", "fastapi", "uvicorn", "pydantic", "pydantic_core", "annotated_types", "agent.models",
)
# Standard-library modules a snapshot has no use for that cost milliseconds of its start-up: dataclasses with inspect
# (ast, dis, tokenize; its types are frozen records, agent/frozen.py), shutil with bz2 and lzma (argparse's help
# formatter would ask it the terminal's width).
NOT_FOR_A_SNAPSHOT_START = ("dataclasses", "inspect", "ast", "dis", "tokenize", "shutil", "bz2", "lzma")
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


def _loaded(tmp_path: Path, config_text: str = "", root: Path = FIXTURE_ROOT) -> dict:
    config = tmp_path / "agent.toml"
    if config_text:
        config.write_text(config_text)
    return json.loads(run_fresh_python(_PROBE, str(root), str(config)).strip().splitlines()[-1])


def _offenders(modules: list) -> list:
    return sorted(m for m in modules if any(m == bad or m.startswith(bad + ".") for bad in NOT_FOR_A_SNAPSHOT))


def test_snapshot_imports_only_what_it_uses(tmp_path: Path) -> None:
    """No settings model of another area, no structlog/asyncio, no scheduler, no HTTP client."""
    seen = _loaded(tmp_path)
    assert seen["code"] == 0
    assert "agent.snapshot.take" in seen["modules"]
    assert _offenders(seen["modules"]) == []


def test_snapshot_loads_no_other_command_family(tmp_path: Path) -> None:
    """Of agent/commands/, a snapshot loads its own module and the shared options, no other command's."""
    seen = _loaded(tmp_path)
    assert seen["code"] == 0
    assert [m for m in seen["modules"] if m.startswith("agent.commands")] == [
        "agent.commands", "agent.commands.options", "agent.commands.snapshot"]


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
    assert run_fresh_python(code).strip() == ""


def test_snapshot_start_up_loads_no_dataclasses_inspect_or_shutil(tmp_path: Path) -> None:
    """Neither dataclasses (with inspect) nor shutil (with bz2, lzma): a quarter of the snapshot's CPU once."""
    seen = _loaded(tmp_path, '[snapshot]\ninterval_seconds = 60\n')
    assert seen["code"] == 0
    assert [m for m in seen["modules"] if m in NOT_FOR_A_SNAPSHOT_START] == []


def test_snapshot_with_cached_tool_versions_imports_no_subprocess(tmp_path: Path) -> None:
    """The first snapshot asks docker its version and caches it under the state directory; the next, a new process,
    answers from the cache, runs no command and so does not even import subprocess."""
    root = tmp_path / "root"
    (root / "etc").mkdir(parents=True)
    (root / "etc/os-release").write_text('ID=debian\nVERSION_ID="12"\n')
    (root / "var/lib/gpuguard").mkdir(parents=True)
    docker = root / "usr/bin/docker"
    docker.parent.mkdir(parents=True)
    docker.write_text("#!/bin/sh\necho 'Docker version 28.2.2, build e6534b4'\n")
    docker.chmod(0o755)
    first = _loaded(tmp_path, root=root)
    assert first["code"] == 0 and "subprocess" in first["modules"]
    cache = json.loads((root / "var/lib/gpuguard/cache/tool-versions.json").read_text())
    assert cache["docker"]["value"] == "28.2.2"
    again = _loaded(tmp_path, root=root)
    assert again["code"] == 0
    assert "subprocess" not in again["modules"]


# What the installed launcher (``python3 -I -S``, packaging/launchers/gpuguard) loads for a snapshot, beyond a bare
# interpreter of the same flags: 106 modules at issue #45 (112 before it). A budget, not a timing: a new import on the
# snapshot's path shows here first.
SNAPSHOT_MODULE_BUDGET = 110
# Standard-library modules the snapshot's hot path no longer needs (issue #45): pathlib (with urllib.parse, ipaddress
# and ntpath) for the Host's paths. (threading, once the log's lock, still comes with subprocess where a command runs.)
NOT_ON_THE_SNAPSHOT_PATH = ("pathlib", "urllib", "urllib.parse", "ipaddress", "ntpath")

_LAUNCHER_PROBE = """
import io, json, sys
bare = set(sys.modules)
sys.path.insert(0, sys.argv[1])
from agent.cli import main
out = io.StringIO()
code = main(["snapshot", "--json", "--root", sys.argv[2], "--config", sys.argv[3]], out=out)
print(json.dumps({"code": code, "new": sorted(set(sys.modules) - bare)}))
"""


def _launcher_loaded(tmp_path: Path, root: Path) -> dict:
    """The modules a snapshot of ``root`` adds to a ``python -I -S`` interpreter, as the installed command runs."""
    result = subprocess.run([sys.executable, "-I", "-S", "-c", _LAUNCHER_PROBE, str(REPO), str(root),
                             str(tmp_path / "agent.toml")], capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("root", ["gpuless-debian12", "mi300x-rocm62-ubuntu2204", "nvidia-h200-ubuntu2404"])
def test_snapshot_stays_within_its_module_budget(tmp_path: Path, root: str) -> None:
    """From the launcher's interpreter a snapshot imports at most the budget's modules and none of pathlib's kin."""
    seen = _launcher_loaded(tmp_path, ROOTS / root)
    assert seen["code"] == 0
    assert [m for m in seen["new"] if m in NOT_ON_THE_SNAPSHOT_PATH] == []
    assert len(seen["new"]) <= SNAPSHOT_MODULE_BUDGET, seen["new"]


def test_importing_the_collectors_compiles_no_pattern() -> None:
    """Every collector's regular expressions are compiled at first use, none when the registry is imported."""
    code = ("import sys, re; sys.path.insert(0, sys.argv[1]); import argparse, json; compiled = []; "
            "real = re._compiler.compile; "
            "re._compiler.compile = lambda p, flags=0: (compiled.append(p), real(p, flags))[1]; "
            "import agent.collectors, agent.gpu_libraries; print(len(compiled))")
    assert run_fresh_python(code).strip() == "0"
