"""Helpers for baseline tests: one run noted through ``record_run`` on an H200's limits."""

from __future__ import annotations

import datetime as dt
from typing import Dict, Tuple

from agent.health.baseline import BaselineFile, Recorded, RunSample, record_run
from agent.health.model import Fingerprint
from agent.health.settings import HealthSettings
from agent.health.sku_limits import SKUS

H200 = SKUS["H200 SXM"]


def note(data: BaselineFile, fp: Fingerprint, metrics: Dict[str, float], good: bool, at: dt.datetime,
         runs_needed: int, corroborated: bool = True, **settings: float) -> Tuple[BaselineFile, Recorded]:
    """``record_run`` for a run of ``fp`` with these figures, on an H200, ``runs_needed`` runs to establish."""
    return record_run(data, RunSample(fingerprint=fp, metrics=metrics, good=good, corroborated=corroborated), at,
                      HealthSettings(baseline_runs=runs_needed, **settings), H200)
