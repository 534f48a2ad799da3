"""The real probe script's parts that need no ML framework: its syntax level, timing, rank reports, no framework."""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType

import pytest

from agent.health.runner import PROBE_PATH, run_health_check
from tests.health.helpers import fake_probe_settings, make_host, make_snapshot


def load_probe() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpuguard_probe_under_test", PROBE_PATH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_probe_is_python_38_syntax_and_imports_nothing_from_the_agent() -> None:
    """The probe parses as Python 3.8 and imports only the standard library and torch."""
    tree = ast.parse(PROBE_PATH.read_text(), feature_version=(3, 8))
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module.split(".")[0])
    assert "agent" not in imported
    stdlib = set(sys.stdlib_module_names) if hasattr(sys, "stdlib_module_names") else imported - {"torch"}
    assert imported - stdlib <= {"torch"}


def test_clock_throttle_stretches_each_batch() -> None:
    """With throttle F every timed batch takes 1/(1-F) times as long, so its figures drop by F."""
    probe = load_probe()
    work = lambda: time.sleep(0.02)  # noqa: E731 - a stand-in for device work
    plain = probe.Clock(lambda: None, 0.0).batches(work, 2, 3)
    slowed = probe.Clock(lambda: None, 0.5).batches(work, 2, 3)
    ratio = sum(plain) / sum(slowed)
    assert ratio == pytest.approx(0.5, abs=0.08)


def test_gather_names_every_rank() -> None:
    """Rank reports become per-GPU figures plus a collective naming failed, aborted and timed-out ranks."""
    probe = load_probe()
    gpu = {"index": 0, "device": "cpu"}
    ok = {"rank": 0, "gpu": gpu, "collective": {"backend": "gloo", "bytes": 1024, "bus_bandwidth_gbps": 1.5,
                                                "sum_correct": True}, "error": None}
    failed = {"rank": 1, "gpu": {**gpu, "index": 1}, "collective": None, "error": "RuntimeError: boom"}
    gpus, collective = probe.gather([(0, 0, None, ok), (1, 1, None, failed), (2, -9, "aborted", None),
                                     (3, -9, "timeout", None)], 4, "small")
    assert [g["index"] for g in gpus] == [0, 1]
    assert [r["status"] for r in collective["ranks"]] == ["ok", "failed", "aborted", "timeout"]
    assert collective["ranks"][1]["error"] == "RuntimeError: boom"
    assert collective["sum_correct"] is None and collective["bus_bandwidth_gbps"] is None


def test_spread_and_nonfinite_figures() -> None:
    """Spread is (max - min) / median; NaN and infinity are reported as missing."""
    probe = load_probe()
    assert probe.spread_fraction([1.0, 1.1, 0.9]) == pytest.approx(0.2)
    assert probe.finite_or_none(float("nan")) is None and probe.finite_or_none(2) == 2.0
    assert probe.parse_slow_rank("1:0.25") == (1, 0.25)


def write_fake_torch(root: Path, body: str) -> Path:
    (root / "torch").mkdir(parents=True)
    (root / "torch" / "__init__.py").write_text(body)
    return root


@pytest.mark.timeout(60)
def test_no_framework_is_skipped(tmp_path: Path) -> None:
    """The real probe in an interpreter without torch reports 'skipped: no framework'."""
    fake = write_fake_torch(tmp_path / "site", "raise ImportError(\"No module named 'torch'\")\n")
    settings = fake_probe_settings(python_path=[str(fake)])
    result = run_health_check(make_host(), settings, str(tmp_path / "state"), snapshot=make_snapshot(),
                              probe_path=PROBE_PATH)
    assert result.status == "skipped"
    assert result.summary.startswith("skipped: no framework")


@pytest.mark.timeout(60)
def test_broken_framework_is_failed(tmp_path: Path) -> None:
    """A torch that is installed but cannot load its libraries makes the check 'failed', not 'skipped'."""
    fake = write_fake_torch(tmp_path / "site", "raise OSError('libcudart.so.13: cannot open shared object file')\n")
    settings = fake_probe_settings(python_path=[str(fake)])
    result = run_health_check(make_host(), settings, str(tmp_path / "state"), snapshot=make_snapshot(),
                              probe_path=PROBE_PATH)
    assert result.status == "failed"
    assert "libcudart.so.13" in result.summary


@pytest.mark.timeout(300)
def test_the_probe_exits_without_the_frameworks_teardown(tmp_path: Path) -> None:
    """Once its result is written the probe process ends at once: a framework whose teardown is slow (torch with a
    device context: up to a second) does not hold up the check. The fake's exit handler would take 600 s."""
    fake = write_fake_torch(tmp_path / "site", "import atexit, time\n__version__ = \"0.0+fake\"\n"
                                               "atexit.register(time.sleep, 600)\n")
    started = time.monotonic()
    done = subprocess.run([sys.executable, str(PROBE_PATH)], capture_output=True, text=True, timeout=240,
                          env={**os.environ, "PYTHONPATH": str(fake)}, check=False)
    assert time.monotonic() - started < 120  # not the exit handler's 600 s: a bound a loaded machine cannot reach
    assert done.returncode == 0
    result = json.loads(done.stdout.split(load_probe().RESULT_MARKER, 1)[1])
    assert result["framework"]["version"] == "0.0+fake", "the fake torch was imported, its exit handler registered"
