"""Parse a workload run's stdout: the workload's own ``gpuguard_result`` line and the shim's report line.

Both come from the workload's process, so both are read as hostile input (health/parse.py's rules: bounded,
UTF-8, strict JSON, strict schema, printable strings). The shim's line must carry the nonce this run gave it; a
report line with another nonce is a forgery (or a replay of an old run's output) and is named as such.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, Optional, Union

from pydantic import ValidationError

from agent.health.model import WORKLOAD_REPORT_MARKER, ShimReport
from agent.health.parse import ParseFailure, decode_line, shown_output
from agent.models import first_validation_problem
from agent.printable import printable_tree

RESULT_KEY = "gpuguard_result"
MAX_METRICS = 64
MAX_RESULT_LINE_BYTES = 16 << 10
MAX_REPORT_LINE_BYTES = 1 << 20


@dataclass(frozen=True)
class WorkloadOutput:
    """What a run printed that gpuguard reads: the figures (possibly none) and the shim's report."""

    metrics: Dict[str, float]
    report: ShimReport


def parse_metrics(stdout: str) -> Union[Dict[str, float], ParseFailure]:
    """The last ``{"gpuguard_result": {...}}`` line's figures; no such line is no figures (not a failure)."""
    for raw in reversed(stdout.splitlines()):
        text = raw.strip()
        if not (text.startswith("{") and f'"{RESULT_KEY}"' in text):
            continue
        data = decode_line(text, "the workload's result line", max_bytes=MAX_RESULT_LINE_BYTES, max_depth=3)
        if isinstance(data, ParseFailure):
            return data
        if not isinstance(data, dict) or set(data) != {RESULT_KEY} or not isinstance(data[RESULT_KEY], dict):
            return ParseFailure(f'the workload\'s result line must be {{"{RESULT_KEY}": {{"metric": number, ...}}}}')
        figures = data[RESULT_KEY]
        if len(figures) > MAX_METRICS:
            return ParseFailure(f"the workload's result line has {len(figures)} metrics (at most {MAX_METRICS})")
        out: Dict[str, float] = {}
        for name, value in figures.items():
            if not (isinstance(name, str) and 0 < len(name) <= 64 and all(c.isalnum() or c in "_.-" for c in name)):
                return ParseFailure(f"the workload's result line: metric name {str(name)[:64]!r} is not 1-64 of "
                                    "A-Z a-z 0-9 _ . -")
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                return ParseFailure(f"the workload's result line: {name} is not a finite number")
            out[name] = float(value)
        return out
    return {}


def parse_report(stdout: str, nonce: str) -> Union[ShimReport, ParseFailure]:
    """The shim's last report line, checked against this run's nonce."""
    line: Optional[str] = None
    for raw in reversed(stdout.splitlines()):
        if raw.startswith(WORKLOAD_REPORT_MARKER):
            line = raw[len(WORKLOAD_REPORT_MARKER):]
            break
    if line is None:
        return ParseFailure(f"no gpuguard report line: the workload ended its process before the shim could report "
                            f"({len(stdout)} bytes of output: '{shown_output(stdout)}')")
    data = decode_line(line, "the shim's report line", max_bytes=MAX_REPORT_LINE_BYTES, max_depth=6)
    if isinstance(data, ParseFailure):
        return data
    try:
        report = ShimReport.model_validate(printable_tree(data), strict=True)
    except ValidationError as exc:
        return ParseFailure(f"the shim's report line does not match its schema: {first_validation_problem(exc)}")
    if report.nonce != nonce:
        return ParseFailure("the report line does not carry this run's nonce: it was not written by gpuguard's shim "
                            "for this run (a forged or replayed result)")
    return report


def parse_workload_output(stdout: str, nonce: str) -> Union[WorkloadOutput, ParseFailure]:
    """Figures and report together; either one unusable is the run's failure reason."""
    report = parse_report(stdout, nonce)
    if isinstance(report, ParseFailure):
        return report
    metrics = parse_metrics(stdout)
    if isinstance(metrics, ParseFailure):
        return metrics
    return WorkloadOutput(metrics=metrics, report=report)
