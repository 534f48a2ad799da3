"""Frozen dataclass records that write themselves as JSON and read themselves back checked, field by field.

The resident daemon and its job children talk through these (agent/daemon_jobs/protocol.py), and the resident writes
its report events with them (agent/report/plain.py): standard library only, so the long-running daemon needs no
pydantic. A record is a frozen dataclass that subclasses :class:`JsonRecord`; its fields' annotations say what JSON
each holds:

    str, int, float, bool       the JSON scalar (a float field takes an int; a bool is never a number)
    Literal["a", "b"]           one of those strings
    datetime.datetime           an ISO 8601 string with a time zone
    Optional[X]                 X or null
    Tuple[X, ...], Tuple[X, Y]  a JSON array of X, or of exactly those (a tuple on read)
    Dict[str, X]                a JSON object of X
    a JsonRecord                a JSON object, read as that record
    JsonObject                  any JSON object, kept as it is (the validated settings handed to a child)

:meth:`JsonRecord.from_json` raises :class:`RecordError` naming the field (``drained -> failure -> category: expected
a string, got int``) for a missing field without a default, an unknown field, or a value of another type.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import math
import typing
from typing import Dict, Mapping, Tuple, Type, TypeVar, Union

__all__ = ["JsonObject", "JsonRecord", "RecordError", "iso_time"]

JsonObject = Dict[str, object]
Location = Tuple[Union[str, int], ...]
R = TypeVar("R", bound="JsonRecord")

_HINTS: Dict[type, Mapping[str, object]] = {}
_NONE = type(None)


class RecordError(ValueError):
    """A JSON value that is not the record asked for; ``location`` names the field, ``problem`` says what is wrong."""

    def __init__(self, location: Location, problem: str) -> None:
        self.location = location
        self.problem = problem
        where = " -> ".join(str(part) for part in location)
        super().__init__(f"{where}: {problem}" if where else problem)


class JsonRecord:
    """The JSON side of a frozen dataclass record: :meth:`to_json` and the checked :meth:`from_json`."""

    def to_json(self) -> JsonObject:
        """The record as a JSON object (records nested in it as objects, tuples as arrays, times as ISO text)."""
        return {spec.name: _dump(getattr(self, spec.name)) for spec in dataclasses.fields(self)}  # type: ignore[arg-type]

    @classmethod
    def from_json(cls: Type[R], data: object, location: Location = ()) -> R:
        """The record from a JSON object as :meth:`to_json` writes it; RecordError names the first bad field."""
        if not isinstance(data, dict):
            raise RecordError(location, f"expected a JSON object, got {_kind(data)}")
        hints = _hints(cls)
        specs = dataclasses.fields(cls)  # type: ignore[arg-type]
        known = {spec.name for spec in specs}
        unknown = sorted(str(key) for key in data if key not in known)
        if unknown:
            raise RecordError((*location, unknown[0]), "unknown field")
        values: Dict[str, object] = {}
        for spec in specs:
            if spec.name in data:
                values[spec.name] = _read(hints[spec.name], data[spec.name], (*location, spec.name))
            elif spec.default is dataclasses.MISSING and spec.default_factory is dataclasses.MISSING:
                raise RecordError((*location, spec.name), "missing")
        try:
            return cls(**values)
        except ValueError as exc:  # the record's own checks (__post_init__)
            raise RecordError(location, str(exc)) from None


def iso_time(moment: dt.datetime) -> str:
    """A time as pydantic writes it in JSON: ISO 8601, ``Z`` for UTC."""
    text = moment.isoformat()
    return text[:-6] + "Z" if text.endswith("+00:00") else text


def _hints(cls: type) -> Mapping[str, object]:
    found = _HINTS.get(cls)
    if found is None:
        found = _HINTS[cls] = typing.get_type_hints(cls)
    return found


def _dump(value: object) -> object:
    if isinstance(value, JsonRecord):
        return value.to_json()
    if isinstance(value, (tuple, list)):
        return [_dump(item) for item in value]
    if isinstance(value, dict):
        return {str(key): _dump(item) for key, item in value.items()}
    if isinstance(value, dt.datetime):
        return iso_time(value)
    return value


def _kind(value: object) -> str:
    return "null" if value is None else type(value).__name__


def _read(hint: object, value: object, location: Location) -> object:
    """``value`` checked (and converted: tuples, floats, times, records) as ``hint`` says; RecordError if not."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is object:
        return value
    if origin is Union:
        if value is None and _NONE in args:
            return None
        others = [arg for arg in args if arg is not _NONE]
        if len(others) != 1:
            raise TypeError(f"{hint}: only Optional[X] unions are supported")
        return _read(others[0], value, location)
    if origin is typing.Literal:
        if value not in args:
            raise RecordError(location, f"expected one of {', '.join(repr(a) for a in args)}, got {value!r}")
        return value
    if hint is bool:
        if not isinstance(value, bool):
            raise RecordError(location, f"expected true or false, got {_kind(value)}")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise RecordError(location, f"expected an integer, got {_kind(value)}")
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise RecordError(location, f"expected a number, got {_kind(value)}")
        if not math.isfinite(value):
            raise RecordError(location, "expected a finite number")
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            raise RecordError(location, f"expected a string, got {_kind(value)}")
        return value
    if hint is dt.datetime:
        return _read_time(value, location)
    if origin is tuple:
        return _read_array(args, value, location)
    if origin is dict:
        if not isinstance(value, dict):
            raise RecordError(location, f"expected a JSON object, got {_kind(value)}")
        return {key: _read(args[1], item, (*location, key)) for key, item in value.items()}
    if isinstance(hint, type) and issubclass(hint, JsonRecord):
        return hint.from_json(value, location)
    raise TypeError(f"{hint}: not a type a JsonRecord field can hold")


def _read_array(args: Tuple[object, ...], value: object, location: Location) -> Tuple[object, ...]:
    if not isinstance(value, list):
        raise RecordError(location, f"expected a JSON array, got {_kind(value)}")
    if len(args) == 2 and args[1] is Ellipsis:
        return tuple(_read(args[0], item, (*location, i)) for i, item in enumerate(value))
    if len(value) != len(args):
        raise RecordError(location, f"expected {len(args)} items, got {len(value)}")
    return tuple(_read(arg, item, (*location, i)) for i, (arg, item) in enumerate(zip(args, value)))


def _read_time(value: object, location: Location) -> dt.datetime:
    if not isinstance(value, str):
        raise RecordError(location, f"expected an ISO 8601 time, got {_kind(value)}")
    try:
        moment = dt.datetime.fromisoformat(value[:-1] + "+00:00" if value.endswith("Z") else value)
    except ValueError:
        raise RecordError(location, f"expected an ISO 8601 time, got {value!r}") from None
    if moment.tzinfo is None:
        raise RecordError(location, "expected a time with a time zone")
    return moment
