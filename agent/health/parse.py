"""Parse the probe's output: the last ``GPUGUARD_PROBE_RESULT {json}`` line, whatever else was printed around it.

The probe is untrusted, so the result line is parsed like any hostile input: at most ``MAX_RESULT_LINE_BYTES`` long,
strict JSON (agent/strictjson.py: no NaN, bounded nesting, no deep recursion), and validated in pydantic's strict
mode (no string for a number, no bool for an int). Every string in it has its control characters escaped
(agent/printable.py) before anything stores or shows it. Every way it can be unusable is a ``ParseFailure`` with a
one-line reason, never an exception.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Union

from pydantic import ValidationError

from agent.errors import InputFileError
from agent.health.model import RESULT_MARKER, ProbeResult
from agent.models import first_validation_problem
from agent.printable import printable, printable_tree
from agent.strictjson import parse_json_text

# The real probe's line for eight GPUs and a collective is about 20 KB.
MAX_RESULT_LINE_BYTES = 256 << 10
# ProbeResult nests four levels deep (result -> gpus -> one GPU -> step_seconds).
MAX_RESULT_DEPTH = 8


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
        shown = printable(" ".join(stdout.split())[:160])
        return ParseFailure(f"no result line in the probe's output ({len(stdout)} bytes: '{shown}')")
    size = len(line.encode("utf-8", errors="replace"))
    if size > MAX_RESULT_LINE_BYTES:
        return ParseFailure(f"result line too long ({size} bytes > {MAX_RESULT_LINE_BYTES})")
    try:
        data = parse_json_text("result line", line, max_depth=MAX_RESULT_DEPTH)
    except InputFileError as exc:
        return ParseFailure(f"result line is {exc.reason}")
    try:
        return ProbeResult.model_validate(printable_tree(data), strict=True)
    except ValidationError as exc:
        return ParseFailure(f"result does not match the probe schema: {first_validation_problem(exc)}")
