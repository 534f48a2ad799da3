"""``gpuguard health run``: config and flags reach the check, table or JSON is printed, the status is the exit code."""

from __future__ import annotations

import io
import json
import os
import pwd
import sys
from pathlib import Path
from types import ModuleType
from typing import Dict, Optional

import pytest

from agent.cli import main
from tests.health.helpers import make_fake_nvml, make_host

pytestmark = pytest.mark.timeout(60)


def config_without_torch(tmp_path: Path) -> Path:
    """A config whose probe environment shadows torch with a package that cannot be imported."""
    site = tmp_path / "site" / "torch"
    site.mkdir(parents=True)
    (site / "__init__.py").write_text("raise ImportError(\"No module named 'torch'\")\n")
    config = tmp_path / "agent.toml"
    me = pwd.getpwuid(os.geteuid()).pw_name  # the probe runs as the test's user (root here: configured explicitly)
    config.write_text(f"[health]\ntimeout_seconds = 30\nrun_as = \"{me}\"\n"
                      f"extra_env = {{ PYTHONPATH = \"{tmp_path / 'site'}\" }}\n")
    return config


def run_cli(tmp_path: Path, *args: str, modules: Optional[Dict[str, ModuleType]] = None) -> tuple:
    out = io.StringIO()
    code = main(["health", "run", "--config", str(config_without_torch(tmp_path)), "--state-dir",
                 str(tmp_path / "state"), "--python", sys.executable, *args],
                make_host=lambda root: make_host(modules), out=out)
    return code, out.getvalue()


def test_table_and_exit_code(tmp_path: Path) -> None:
    """Without a framework the command prints a SKIPPED table and exits 24."""
    code, text = run_cli(tmp_path)
    assert code == 24
    assert text.startswith("health   SKIPPED  skipped: no framework")


def test_json_output(tmp_path: Path) -> None:
    """--json prints the whole result as JSON, including the probe's argv with the throttle flag."""
    code, text = run_cli(tmp_path, "--json", "--throttle-fraction", "0.15", "--timeout-seconds", "20")
    data = json.loads(text)
    assert code == 24 and data["status"] == "skipped"
    assert data["probe_argv"][:4] == [sys.executable, data["probe_argv"][1], "--throttle-fraction", "0.15"]
    assert data["probe_argv"][data["probe_argv"].index("--rank-timeout-seconds") + 1] == "15"
    assert (tmp_path / "state" / "health" / "last.json").exists()


def test_bad_flag_value_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """A throttle outside [0, 1) is refused with one line and exit code 2."""
    code, _ = run_cli(tmp_path, "--throttle-fraction", "1.5")
    assert code == 2
    assert "throttle_fraction" in capsys.readouterr().err


def test_mode_full_on_a_busy_gpu_is_deferred(tmp_path: Path) -> None:
    """--mode full waits while another job uses the GPU: DEFERRED, exit 26, the tenant named in the table."""
    nvml = make_fake_nvml([[80.0]], processes=[[[(4242, 1 << 30)]]])
    code, text = run_cli(tmp_path, "--mode", "full", modules={"pynvml": nvml})
    assert code == 26
    assert text.startswith("health   DEFERRED  deferred: busy, waiting for idle GPUs (GPU 0: in use by pid 4242")
    assert "busy     GPU 0" in text
