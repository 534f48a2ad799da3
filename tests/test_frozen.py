"""Frozen records: construction like a dataclass's, immutability, value semantics, and pydantic validation."""

from __future__ import annotations

import dataclasses
import math
from typing import Dict, List, Optional

import pytest
from pydantic import TypeAdapter, ValidationError

from agent.frozen import (
    Frozen,
    FrozenInstanceError,
    as_dataclasses,
    field,
    field_values,
    frozen_record,
    record_fields,
    replace,
)


@frozen_record
class Gpu(Frozen):
    """A record with a required field, a plain default and a default factory."""

    index: int
    name: Optional[str] = None
    tags: List[str] = field(default_factory=list)


@frozen_record
class Board(Gpu):
    """A subclass record: the base's fields first, then its own."""

    slot: str = "0"


@frozen_record
class Limits(Frozen):
    """A record with field metadata (a settings section's rule)."""

    interval_seconds: float = field(default=300.0, metadata={"gt": 0})
    labels: Dict[str, str] = field(default_factory=dict)


def test_constructed_like_a_dataclass() -> None:
    """Positional or keyword arguments, defaults filled in, a new default list for each record."""
    a, b = Gpu(0), Gpu(index=1, name="H200", tags=["sxm"])
    assert (a.index, a.name, a.tags) == (0, None, [])
    assert (b.index, b.name, b.tags) == (1, "H200", ["sxm"])
    assert Gpu(2).tags is not Gpu(3).tags
    assert Board(0, "MI300X", [], "7").slot == "7" and Board(1).slot == "0"
    assert Limits().interval_seconds == 300.0 and Limits.interval_seconds == 300.0


@pytest.mark.parametrize("call, message", [
    (lambda: Gpu(), "Gpu() missing required argument: 'index'"),
    (lambda: Gpu(0, "a", [], "extra"), "Gpu() takes 3 positional arguments but 4 were given"),
    (lambda: Gpu(0, index=1), "Gpu() got multiple values for argument 'index'"),
    (lambda: Gpu(0, colour="red"), "Gpu() got an unexpected keyword argument 'colour'"),
])
def test_wrong_arguments_are_refused(call, message) -> None:
    """Missing, surplus, doubled and unknown arguments raise TypeError naming the field."""
    with pytest.raises(TypeError) as caught:
        call()
    assert str(caught.value) == message


def test_a_field_without_default_after_one_with_is_refused() -> None:
    """As with dataclasses: the declaration itself fails."""
    with pytest.raises(TypeError, match="non-default field 'b' follows a field with a default"):
        @frozen_record
        class _Bad(Frozen):
            a: int = 0
            b: int


def test_only_frozen_subclasses_are_records() -> None:
    """The decorator needs the Frozen base (its __init__, equality and immutability)."""
    with pytest.raises(TypeError, match="must subclass Frozen"):
        frozen_record(type("Plain", (), {"__annotations__": {"a": "int"}}))


def test_fields_cannot_be_assigned_or_deleted() -> None:
    """Assignment and deletion raise FrozenInstanceError, an AttributeError."""
    gpu = Gpu(0)
    with pytest.raises(FrozenInstanceError):
        gpu.index = 1  # type: ignore[misc]
    with pytest.raises(AttributeError):
        del gpu.name  # type: ignore[misc]
    assert gpu.index == 0 and gpu.name is None


def test_equality_hash_and_repr_by_type_and_values() -> None:
    """Same type and values: equal, one hash; a subclass with the same values is another type."""
    assert Gpu(0, "x") == Gpu(index=0, name="x") and hash(Gpu(0, "x", ())) == hash(Gpu(0, "x", ()))  # type: ignore
    assert Gpu(0) != Gpu(1) and Gpu(0) != Board(0)
    assert repr(Board(0, slot="2")) == "Board(index=0, name=None, tags=[], slot='2')"


def test_replace_makes_a_changed_copy() -> None:
    """The fields by name; the copy has the changes, the original does not; an unknown field is refused."""
    gpu = Gpu(0, "x", ["a"])
    assert field_values(gpu) == {"index": 0, "name": "x", "tags": ["a"]}
    assert replace(gpu, name="y") == Gpu(0, "y", ["a"]) and gpu.name == "x"
    with pytest.raises(TypeError, match="unexpected keyword argument 'colour'"):
        replace(gpu, colour="red")


def test_record_fields_in_declaration_order() -> None:
    """Names base-first, annotations as written, defaults, factories and metadata."""
    specs = record_fields(Board)
    assert [(s.name, s.annotation, s.required) for s in specs] == [
        ("index", "int", True), ("name", "Optional[str]", False), ("tags", "List[str]", False),
        ("slot", "str", False)]
    assert record_fields(Limits(interval_seconds=1.0))[0].metadata == {"gt": 0}
    assert record_fields(type("Subclass", (Board,), {})) == specs  # a subclass that declares nothing more
    with pytest.raises(TypeError, match="not a frozen record"):
        record_fields(int)
    with pytest.raises(TypeError, match="not a frozen record"):
        record_fields(Frozen)


def test_pydantic_validates_records_as_dataclasses() -> None:
    """After as_dataclasses: strict validation (no unknown fields, no inf/nan), records built, behaviour kept."""
    as_dataclasses()
    as_dataclasses()  # once is enough; again changes nothing
    assert dataclasses.is_dataclass(Gpu) and [f.name for f in dataclasses.fields(Board)] == [
        "index", "name", "tags", "slot"]
    adapter = TypeAdapter(Board)
    board = adapter.validate_python({"index": 1, "tags": ["sxm"]})
    assert type(board) is Board and board == Board(1, None, ["sxm"], "0")
    assert adapter.validate_json('{"index": 2}').tags == []
    with pytest.raises(ValidationError, match="Unexpected keyword argument"):
        adapter.validate_python({"index": 1, "colour": "red"})
    with pytest.raises(ValidationError):
        TypeAdapter(Limits).validate_python({"interval_seconds": math.inf})
    with pytest.raises(FrozenInstanceError):
        board.slot = "1"  # type: ignore[misc]
    assert Gpu(3).tags == [] and repr(Gpu(3)) == "Gpu(index=3, name=None, tags=[])"


def test_a_record_declared_later_is_made_a_dataclass_at_once() -> None:
    """A module imported after the first read-back declares records pydantic can validate straight away."""
    as_dataclasses()

    @frozen_record
    class Late(Frozen):
        value: int
        notes: List[str] = field(default_factory=list)

    assert dataclasses.is_dataclass(Late)
    assert TypeAdapter(Late).validate_python({"value": 1}) == Late(1)
