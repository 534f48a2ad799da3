"""Parsing the probe's output: the marker line among framework noise, and every way it can be unusable."""

from __future__ import annotations

import json

import pytest

from agent.health.model import ProbeResult
from agent.health.parse import ParseFailure, parse_probe_output

MINIMAL = {"probe_schema_version": 1, "python": "3.8.10"}


def test_result_line_found_among_noise() -> None:
    """Warnings printed before and after do not matter; the marker line is parsed."""
    text = "UserWarning: numpy missing\nGPUGUARD_PROBE_RESULT " + json.dumps(MINIMAL) + "\ntrailing noise\n"
    result = parse_probe_output(text)
    assert isinstance(result, ProbeResult) and result.python == "3.8.10"


def test_last_result_line_wins() -> None:
    """When a result line appears twice, the last one counts."""
    first = json.dumps({**MINIMAL, "python": "first"})
    second = json.dumps({**MINIMAL, "python": "second"})
    result = parse_probe_output(f"GPUGUARD_PROBE_RESULT {first}\nGPUGUARD_PROBE_RESULT {second}\n")
    assert isinstance(result, ProbeResult) and result.python == "second"


@pytest.mark.parametrize("text, reason", [
    ("", "no result line"),
    ("Segmentation fault\n", "no result line"),
    ("GPUGUARD_PROBE_RESULT {not json\n", "not valid JSON"),
    ("GPUGUARD_PROBE_RESULT {\"probe_schema_version\": 2, \"python\": \"3\"}\n", "probe_schema_version"),
    ("GPUGUARD_PROBE_RESULT " + json.dumps({**MINIMAL, "surprise": 1}) + "\n", "surprise"),
])
def test_unusable_output_is_a_parse_failure(text: str, reason: str) -> None:
    """Output without a valid, schema-conforming result line gives a ParseFailure saying why."""
    result = parse_probe_output(text)
    assert isinstance(result, ParseFailure)
    assert reason in result.reason
