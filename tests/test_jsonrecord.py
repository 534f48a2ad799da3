"""JSON records (agent/jsonrecord.py): written as JSON, read back checked, every bad field named with its path."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Dict, Literal, Optional, Tuple

import pytest

from agent.jsonrecord import JsonObject, JsonRecord, RecordError, iso_time


@dataclass(frozen=True)
class Inner(JsonRecord):
    """A nested record."""

    name: str
    count: int = 0


@dataclass(frozen=True)
class Outer(JsonRecord):
    """One field of every kind a record may hold."""

    flag: bool
    ratio: float
    level: Literal["info", "warning"]
    when: dt.datetime
    inner: Inner
    maybe: Optional[Inner] = None
    names: Tuple[str, ...] = ()
    pair: Tuple[str, int] = ("a", 1)
    counts: Dict[str, int] = field(default_factory=dict)
    blob: Optional[JsonObject] = None

    def __post_init__(self) -> None:
        if self.ratio < 0:
            raise ValueError("ratio: at least 0")


WHEN = dt.datetime(2026, 12, 4, 12, 0, tzinfo=dt.timezone.utc)
FULL = Outer(flag=True, ratio=0.5, level="warning", when=WHEN, inner=Inner("a", 2), maybe=Inner("b"),
             names=("x", "y"), pair=("p", 3), counts={"k": 1}, blob={"any": [1, {"deep": None}]})


def test_a_record_round_trips_through_its_json() -> None:
    """to_json writes plain JSON (times as ISO text with Z, tuples as arrays); from_json gives the same record."""
    written = FULL.to_json()
    assert written["when"] == "2026-12-04T12:00:00Z" and written["names"] == ["x", "y"]
    assert written["inner"] == {"name": "a", "count": 2}
    assert Outer.from_json(written) == FULL


def test_defaults_fill_fields_left_out_and_an_int_is_a_float() -> None:
    """A field with a default may be missing; an integer where a number is asked becomes a float."""
    read = Outer.from_json({"flag": False, "ratio": 1, "level": "info", "when": "2026-12-04T12:00:00+00:00",
                            "inner": {"name": "n"}})
    assert read.ratio == 1.0 and isinstance(read.ratio, float) and read.inner == Inner("n") and read.maybe is None


@pytest.mark.parametrize("change, problem", [
    ({"flag": 1}, "flag: expected true or false, got int"),
    ({"ratio": True}, "ratio: expected a number, got bool"),
    ({"ratio": float("nan")}, "ratio: expected a finite number"),
    ({"level": "debug"}, "level: expected one of 'info', 'warning', got 'debug'"),
    ({"when": "2026-12-04T12:00:00"}, "when: expected a time with a time zone"),
    ({"when": "yesterday"}, "when: expected an ISO 8601 time, got 'yesterday'"),
    ({"inner": {"name": "a", "count": "2"}}, "inner -> count: expected an integer, got str"),
    ({"inner": None}, "inner: expected a JSON object, got null"),
    ({"names": ["x", 3]}, "names -> 1: expected a string, got int"),
    ({"pair": ["p"]}, "pair: expected 2 items, got 1"),
    ({"counts": {"k": "one"}}, "counts -> k: expected an integer, got str"),
    ({"extra": 1}, "extra: unknown field"),
    ({"ratio": -1}, "ratio: at least 0"),
])
def test_a_bad_field_is_named_with_its_path(change: dict, problem: str) -> None:
    """Every kind of wrong value raises RecordError saying where and what, never a KeyError or TypeError."""
    data = {**FULL.to_json(), **change}
    with pytest.raises(RecordError) as caught:
        Outer.from_json(data, ("result",))
    assert str(caught.value) == f"result -> {problem}" or str(caught.value) == f"result: {problem}"


def test_a_missing_required_field_and_a_non_object_are_named() -> None:
    """Nothing to read is as clear as a bad value."""
    data = FULL.to_json()
    del data["inner"]
    with pytest.raises(RecordError, match="^inner: missing$"):
        Outer.from_json(data)
    with pytest.raises(RecordError, match="^expected a JSON object, got list$"):
        Outer.from_json([1])


def test_iso_time_writes_z_for_utc_only() -> None:
    """UTC as pydantic writes it; another offset kept."""
    assert iso_time(WHEN) == "2026-12-04T12:00:00Z"
    plus_two = dt.datetime(2026, 1, 1, tzinfo=dt.timezone(dt.timedelta(hours=2)))
    assert iso_time(plus_two) == "2026-01-01T00:00:00+02:00"
