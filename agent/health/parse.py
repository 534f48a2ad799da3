"""Parse the probe's output: the last ``GPUGUARD_PROBE_RESULT {json}`` line, whatever else was printed around it.

The probe is untrusted, so the result line is parsed like any hostile input: at most ``MAX_RESULT_LINE_BYTES`` long,
UTF-8 only (launch.py hands stdout over with its invalid bytes as lone surrogates; a ``\\udcff`` escape inside the
JSON is refused too), strict JSON (agent/strictjson.py: no NaN, no key named twice in one object, bounded nesting,
no deep recursion), and validated in pydantic's strict mode (no string for a number, no bool for an int). Every
string in it has its control characters escaped (agent/printable.py) before anything stores or shows it. Every way
it can be unusable is a ``ParseFailure`` with a one-line reason, never an exception.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Union

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


_SURROGATES = (0xD800, 0xDFFF)


def _first_surrogate(text: str) -> Optional[int]:
    """The offset of the first lone surrogate in ``text`` (an invalid byte, or a ``\\ud800`` escape), else None."""
    for offset, char in enumerate(text):
        if _SURROGATES[0] <= ord(char) <= _SURROGATES[1]:
            return offset
    return None


def _invalid_utf8(line: str) -> Optional[str]:
    """Why the line is not UTF-8 (an invalid byte, kept by launch.py as a lone surrogate), else None."""
    offset = _first_surrogate(line)
    if offset is None:
        return None
    code = ord(line[offset])
    if 0xDC80 <= code <= 0xDCFF:
        return f"not UTF-8 (byte 0x{code - 0xDC00:02x} at character {offset})"
    return f"not UTF-8 (a lone surrogate at character {offset})"


def _surrogate_in_tree(value: Any) -> Optional[str]:
    """A decoded JSON string (or key) holding a lone surrogate, from a ``\\udcff`` escape: no UTF-8 text has one."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if _first_surrogate(item) is not None:
                return printable(item.encode("utf-8", "backslashreplace").decode("ascii")[:80])
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return None


def shown_output(stdout: str) -> str:
    """The start of stdout for a message: invalid bytes as U+FFFD, control characters escaped."""
    text = stdout
    if _first_surrogate(stdout) is not None:
        text = stdout.encode("utf-8", "surrogatepass").decode("utf-8", "replace")
    return printable(" ".join(text.split())[:160])


@dataclass(frozen=True)
class ParseFailure:
    """The probe's output held no usable result; ``reason`` says why in one line."""

    reason: str


def decode_line(line: str, what: str, max_bytes: int = MAX_RESULT_LINE_BYTES,
                max_depth: int = MAX_RESULT_DEPTH) -> Union[Any, ParseFailure]:
    """One untrusted JSON line decoded as the module docstring says (size, UTF-8, strict JSON, no surrogate escape);
    strings are not yet made printable (the caller validates, then escapes)."""
    size = len(line.encode("utf-8", errors="surrogatepass"))
    if size > max_bytes:
        return ParseFailure(f"{what} too long ({size} bytes > {max_bytes})")
    not_utf8 = _invalid_utf8(line)
    if not_utf8 is not None:
        return ParseFailure(f"{what} is {not_utf8}")
    try:
        data = parse_json_text(what, line, max_depth=max_depth, unique_keys=True)
    except InputFileError as exc:
        return ParseFailure(f"{what} is {exc.reason}")
    escaped = _surrogate_in_tree(data)
    if escaped is not None:
        return ParseFailure(f"{what} is not UTF-8 (a lone surrogate escape in '{escaped}')")
    return data


def parse_probe_output(stdout: str) -> Union[ProbeResult, ParseFailure]:
    """The probe's result from its stdout; frameworks print warnings there too, so only the marker line counts."""
    line: Optional[str] = None
    for raw in reversed(stdout.splitlines()):
        if raw.startswith(RESULT_MARKER):
            line = raw[len(RESULT_MARKER):]
            break
    if line is None:
        return ParseFailure(f"no result line in the probe's output ({len(stdout)} bytes: '{shown_output(stdout)}')")
    data = decode_line(line, "result line")
    if isinstance(data, ParseFailure):
        return data
    try:
        return ProbeResult.model_validate(printable_tree(data), strict=True)
    except ValidationError as exc:
        return ParseFailure(f"result does not match the probe schema: {first_validation_problem(exc)}")
