"""Parse the probe's output: the last ``GPUGUARD_PROBE_RESULT {json}`` line, whatever else was printed around it."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Optional, Union

from pydantic import ValidationError

from agent.health.model import RESULT_MARKER, ProbeResult
from agent.models import first_validation_problem


@dataclass(frozen=True)
class ParseFailure:
    """The probe's output held no usable result; ``reason`` says why in one line."""

    reason: str


def parse_probe_output(stdout: str) -> Union[ProbeResult, ParseFailure]:
    """The probe's result from its stdout; frameworks print warnings there too, so only the marker line counts."""
    line: Optional[str] = None
    for raw in reversed(stdout.splitlines()):
        if raw.startswith(RESULT_MARKER):
            line = raw[len(RESULT_MARKER):]
            break
    if line is None:
        shown = " ".join(stdout.split())[:160]
        return ParseFailure(f"no result line in the probe's output ({len(stdout)} bytes: {shown!r})")
    try:
        data = json.loads(line)
    except json.JSONDecodeError as exc:
        return ParseFailure(f"result line is not valid JSON ({exc.msg} at column {exc.colno})")
    try:
        return ProbeResult.model_validate(data)
    except ValidationError as exc:
        return ParseFailure(f"result does not match the probe schema: {first_validation_problem(exc)}")
