"""Frozen records: the snapshot's immutable, typed data classes, declared at a fraction of a dataclass's cost.

A record is a subclass of :class:`Frozen` decorated with :func:`frozen_record`; its fields are its annotations, in
order (a base record's first), each with an optional default: a value, or ``field(default_factory=list)``. Type
checkers see a frozen dataclass (PEP 681 ``dataclass_transform``): construction is checked field by field and
assignment is an error.

Why not ``dataclasses``: ``gpuguard snapshot`` declares about 25 of these, and ``@dataclass`` compiles each class's
``__init__``, ``__setattr__`` and ``__delattr__`` with ``exec`` and needs ``inspect`` (with ``ast``, ``dis`` and
``tokenize``): together about a quarter of the snapshot's CPU (issue #17). Here the decorator only reads the
annotations once; one shared ``__init__`` sets the fields; equality (same type, same values), hash, repr and the
refusal to assign are written once on :class:`Frozen`. Nothing is imported.

Where pydantic validates records (a snapshot read back: agent/snapshot/io.py), :func:`as_dataclasses` first makes
every record class a standard-library dataclass, in place and once: pydantic then validates them exactly as
it validates dataclasses, with the rules of :attr:`Frozen.__pydantic_config__`. The classes keep their own
``__init__``, equality, hash, repr and refusal to assign, so a record behaves the same before and after.

The package-manager hot path has its own, leaner kind (agent/records.py: ``__slots__``, a typed ``__init__`` per
class, no registry): its values are never validated by pydantic and its start-up budget is tighter still.
"""

from __future__ import annotations

import _thread

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing_extensions for Python 3.9/3.10's type checkers; nothing of it is imported at run time
    from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple, Type, TypeVar

    from typing_extensions import dataclass_transform

    _T = TypeVar("_T")
    _R = TypeVar("_R", bound="Frozen")
else:
    def dataclass_transform(**_kwargs):
        return lambda decorated: decorated

__all__ = ["FieldSpec", "Frozen", "FrozenInstanceError", "as_dataclasses", "field", "field_values", "frozen_record",
           "record_fields", "replace"]

_MISSING = object()


class FrozenInstanceError(AttributeError):
    """Assigning to (or deleting) a field of a record."""


class FieldSpec:
    """One declared field: its name, annotation as written, default or default factory, and metadata."""

    __slots__ = ("name", "annotation", "default", "default_factory", "metadata")

    def __init__(self, name: str, annotation: str, default: Any = _MISSING,
                 default_factory: Optional[Callable[[], Any]] = None,
                 metadata: Optional[Mapping[str, Any]] = None) -> None:
        self.name = name
        self.annotation = annotation
        self.default = default
        self.default_factory = default_factory
        self.metadata: Mapping[str, Any] = metadata or {}

    @property
    def required(self) -> bool:
        return self.default is _MISSING and self.default_factory is None

    def __repr__(self) -> str:
        return f"FieldSpec({self.name!r}: {self.annotation})"


class _FieldDefault:
    """What :func:`field` returns until :func:`frozen_record` takes it off the class."""

    __slots__ = ("default", "default_factory", "metadata")

    def __init__(self, default: Any, default_factory: Optional[Callable[[], Any]],
                 metadata: Optional[Mapping[str, Any]]) -> None:
        self.default = default
        self.default_factory = default_factory
        self.metadata = metadata


def field(*, default: Any = _MISSING, default_factory: Optional[Callable[[], Any]] = None,
          metadata: Optional[Mapping[str, Any]] = None) -> Any:
    """A field's default made anew for each record (``default_factory``), or a default with ``metadata``."""
    if default is not _MISSING and default_factory is not None:
        raise ValueError("cannot specify both default and default_factory")
    return _FieldDefault(default, default_factory, metadata)


class Frozen:
    """Base of every record: immutable, equality by type and field values, hashable, a readable repr.

    ``__pydantic_config__`` is how pydantic validates records (a plain dict: pydantic's ConfigDict is a TypedDict,
    so declaring it imports no pydantic): unknown fields and non-finite numbers (inf, nan) are refused.
    """

    __pydantic_config__ = {"extra": "forbid", "allow_inf_nan": False}
    __record_fields__: Tuple[FieldSpec, ...] = ()
    __record_names__: Tuple[str, ...] = ()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        cls = type(self)
        specs = cls.__record_fields__
        if args:
            if len(args) > len(specs):
                raise TypeError(f"{cls.__name__}() takes {len(specs)} positional arguments but {len(args)} were "
                                f"given")
            for spec, value in zip(specs, args):
                if spec.name in kwargs:
                    raise TypeError(f"{cls.__name__}() got multiple values for argument {spec.name!r}")
                kwargs[spec.name] = value
        assign = object.__setattr__
        for spec in specs:
            if spec.name in kwargs:
                value = kwargs.pop(spec.name)
            elif spec.default_factory is not None:
                value = spec.default_factory()
            elif spec.default is not _MISSING:
                value = spec.default
            else:
                raise TypeError(f"{cls.__name__}() missing required argument: {spec.name!r}")
            assign(self, spec.name, value)
        if kwargs:
            raise TypeError(f"{cls.__name__}() got an unexpected keyword argument {next(iter(kwargs))!r}")

    def _values(self) -> Tuple[Any, ...]:
        return tuple(getattr(self, name) for name in type(self).__record_names__)

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return self._values() == other._values()

    def __hash__(self) -> int:
        return hash((type(self).__qualname__, *self._values()))

    def __repr__(self) -> str:
        fields_text = ", ".join(f"{name}={getattr(self, name)!r}" for name in type(self).__record_names__)
        return f"{type(self).__qualname__}({fields_text})"

    def __setattr__(self, name: str, value: Any) -> None:
        raise FrozenInstanceError(f"cannot assign to field {name!r}")

    def __delattr__(self, name: str) -> None:
        raise FrozenInstanceError(f"cannot delete field {name!r}")


_RECORDS: List[Type[Frozen]] = []  # every record class, in declaration order (a base record before its subclasses)
_lock = _thread.allocate_lock()
_as_dataclasses = False


@dataclass_transform(frozen_default=True, eq_default=False, field_specifiers=(field,))
def frozen_record(cls: Type[_T]) -> Type[_T]:
    """Declare ``cls`` (a :class:`Frozen` subclass) a record: its annotations are its fields."""
    if not issubclass(cls, Frozen):
        raise TypeError(f"{cls.__name__} must subclass Frozen to be a frozen record")
    specs: Dict[str, FieldSpec] = {spec.name: spec for spec in cls.__record_fields__}  # a base record's fields
    for name, annotation in cls.__dict__.get("__annotations__", {}).items():
        declared = cls.__dict__.get(name, _MISSING)
        if isinstance(declared, _FieldDefault):
            delattr(cls, name)  # as dataclasses do: the class attribute is the default, never the marker
            if declared.default is not _MISSING:
                setattr(cls, name, declared.default)
            specs[name] = FieldSpec(name, str(annotation), declared.default, declared.default_factory,
                                    declared.metadata)
        else:
            specs[name] = FieldSpec(name, str(annotation), declared)
    ordered = tuple(specs.values())
    defaulted = False
    for spec in ordered:
        if spec.required and defaulted:
            raise TypeError(f"{cls.__name__}: non-default field {spec.name!r} follows a field with a default")
        defaulted = defaulted or not spec.required
    cls.__record_fields__ = ordered
    cls.__record_names__ = tuple(spec.name for spec in ordered)
    with _lock:
        _RECORDS.append(cls)
        if _as_dataclasses:  # declared after as_dataclasses() ran (a module imported later)
            _make_dataclass(cls)
    return cls


def record_fields(record_or_class: Any) -> Tuple[FieldSpec, ...]:
    """The fields of a record (or record class), in declaration order."""
    cls = record_or_class if isinstance(record_or_class, type) else type(record_or_class)
    if not issubclass(cls, Frozen) or not any(base in _RECORDS for base in cls.__mro__):
        raise TypeError(f"{cls.__name__} is not a frozen record")
    return cls.__record_fields__


def field_values(record: Frozen) -> Dict[str, Any]:
    """A record's fields by name, in declaration order (shallow: a nested record stays a record)."""
    return {name: getattr(record, name) for name in type(record).__record_names__}


def replace(record: _R, /, **changes: Any) -> _R:
    """A copy of ``record`` with some fields changed (``dataclasses.replace`` for records)."""
    values = field_values(record)
    values.update(changes)
    return type(record)(**values)


def as_dataclasses() -> None:
    """Make every record class a standard-library dataclass (in place, once), for pydantic to validate.

    The dataclass machinery adds only its field metadata (``__dataclass_fields__``): ``init``, ``eq``, ``repr`` and
    the refusal to assign (``frozen``) stay the record's, so records behave the same before and after. Pydantic
    builds validated instances without calling ``__init__`` or ``__setattr__``.
    """
    global _as_dataclasses
    with _lock:
        if _as_dataclasses:
            return
        for cls in _RECORDS:
            _make_dataclass(cls)
        _as_dataclasses = True


def _make_dataclass(cls: Type[Frozen]) -> None:
    import dataclasses

    own = cls.__dict__.get("__annotations__", {})
    for spec in cls.__record_fields__:
        if spec.name in own and (spec.default_factory is not None or spec.metadata):
            kwargs: Dict[str, Any] = {"metadata": spec.metadata} if spec.metadata else {}
            if spec.default_factory is not None:
                kwargs["default_factory"] = spec.default_factory
            elif spec.default is not _MISSING:
                kwargs["default"] = spec.default
            setattr(cls, spec.name, dataclasses.field(**kwargs))
    dataclasses.dataclass(init=False, eq=False, repr=False)(cls)
