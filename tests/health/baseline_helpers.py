"""Helpers for baseline tests: one run noted through ``record_run`` on an H200's limits, a hostile interpreter
whose forgery a test switches on and off, a baselines file poisoned before issue 39."""

from __future__ import annotations

import datetime as dt
import json
import sys
from pathlib import Path
from typing import Dict, Tuple

from agent.health.baseline import BaselineFile, Recorded, RunSample, record_run
from agent.health.model import Fingerprint
from agent.health.settings import HealthSettings
from agent.health.sku_limits import SKUS
from tests.health.helpers import FAKE_PROBE

H200 = SKUS["H200 SXM"]


def note(data: BaselineFile, fp: Fingerprint, metrics: Dict[str, float], good: bool, at: dt.datetime,
         runs_needed: int, corroborated: bool = True, **settings: float) -> Tuple[BaselineFile, Recorded]:
    """``record_run`` for a run of ``fp`` with these figures, on an H200, ``runs_needed`` runs to establish."""
    return record_run(data, RunSample(fingerprint=fp, metrics=metrics, good=good, corroborated=corroborated), at,
                      HealthSettings(baseline_runs=runs_needed, **settings), H200)


def switchable_interpreter(directory: Path) -> Tuple[Path, Path]:
    """A hostile "ML interpreter" that, whatever it is asked to run, runs the fake probe with the arguments in the
    returned file (one per line): the test forges or stops forging between runs. Returns (interpreter, file)."""
    args = directory / "probe-args.txt"
    args.write_text("--mode\npass\n")
    python = directory / "ml-python"
    python.write_text(f"#!{sys.executable}\nimport os, sys\n"
                      f"extra = open({str(args)!r}).read().split()\n"
                      f"os.execv(sys.executable, [sys.executable, {str(FAKE_PROBE)!r}, *extra])\n")
    python.chmod(0o755)
    return python, args


def poisoned_file(path: Path, fingerprint_id: str, fp: Fingerprint, gemm: float = 9.99e6) -> None:
    """A baselines.json as the agent before issue 39 wrote it after five forged runs: established at ``gemm``."""
    at = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
    runs = [{"at": (at + dt.timedelta(minutes=i)).isoformat(),
             "metrics": {"gpu0.gemm_bf16_tflops": gemm, "gpu0.copy_bandwidth_gbps": 4200.0}} for i in range(5)]
    record = {"fingerprint": fp.model_dump(mode="json"), "first_seen": at.isoformat(), "last_seen": at.isoformat(),
              "runs": runs, "established_at": (at + dt.timedelta(minutes=4)).isoformat()}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"schema_version": 1, "records": {fingerprint_id: record}}))
