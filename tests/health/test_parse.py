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


@pytest.mark.parametrize("line, reason", [
    ("[" * 100_000, "nested deeper than 8 levels"),
    ("{\"a\": " * 20_000 + "1" + "}" * 20_000, "nested deeper than 8 levels"),
    (json.dumps({**MINIMAL, "errors": [[[[[[[[["deep"]]]]]]]]]}), "nested deeper than 8 levels"),
    ("1" * 5000, "not valid JSON"),
    (json.dumps({**MINIMAL, "errors": ["x" * (300 << 10)]}), "result line too long"),
])
def test_a_hostile_result_line_is_a_one_line_parse_failure(line: str, reason: str) -> None:
    """Deep nesting, a 5000-digit number or an oversized line gives a one-line ParseFailure, never an exception."""
    result = parse_probe_output("GPUGUARD_PROBE_RESULT " + line + "\n")
    assert isinstance(result, ParseFailure) and reason in result.reason and "\n" not in result.reason


@pytest.mark.parametrize("field, value", [("device_count", "2"), ("device_count", True), ("uid", 0.0),
                                          ("accelerator_available", "true"), ("accelerator_available", 1),
                                          ("throttle_fraction", "0.5"), ("python", 3)])
def test_result_fields_are_strictly_typed(field: str, value: object) -> None:
    """A value of the wrong JSON type (a string for a number or bool, a bool for an int) is refused, not coerced."""
    result = parse_probe_output("GPUGUARD_PROBE_RESULT " + json.dumps({**MINIMAL, field: value}) + "\n")
    assert isinstance(result, ParseFailure) and field in result.reason


def test_a_nan_in_the_result_is_refused() -> None:
    """A non-finite number in the result line is a parse failure, not a figure."""
    result = parse_probe_output('GPUGUARD_PROBE_RESULT {"probe_schema_version": 1, "python": "3", '
                                '"throttle_fraction": NaN}\n')
    assert isinstance(result, ParseFailure) and "NaN" in result.reason


@pytest.mark.parametrize("changes, where", [
    ({"errors": ["x" * 5000]}, "errors -> 1"),
    ({"errors": ["e"] * 2000}, "errors"),
    ({"device_count": 10**9}, "device_count"),
    ({"gpus": [{"index": 10**9, "device": "cuda:0", "gemm_dtype": "bf16"}]}, "gpus -> 1 -> index"),
    ({"gpus": [{"index": 0, "device": "cuda:0", "gemm_dtype": "bf16", "gemm_bf16_tflops": 1e300}]},
     "gpus -> 1 -> gemm_bf16_tflops"),
    ({"gpus": [{"index": 0, "device": "cuda:0", "gemm_dtype": "bf16", "copy_bandwidth_gbps": -5.0}]},
     "gpus -> 1 -> copy_bandwidth_gbps"),
])
def test_out_of_bounds_values_are_refused(changes: dict, where: str) -> None:
    """Overlong strings and lists, absurd counts and indexes, figures beyond any device or negative are refused."""
    result = parse_probe_output("GPUGUARD_PROBE_RESULT " + json.dumps({**MINIMAL, **changes}) + "\n")
    assert isinstance(result, ParseFailure) and where in result.reason, result
