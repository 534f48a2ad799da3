"""Small immutable value types for the standard-library-only hot path (the apt hook, the dnf checkers).

``collections.namedtuple`` would do, but importing collections and building each class with ``exec`` cost the apt
hook about 3 ms of a start-up budget of about 15 ms above the interpreter's own. A :class:`Record` subclass lists
its fields in ``__slots__`` and writes a typed ``__init__`` that passes them, in order, to ``Record.__init__``;
the base gives equality by type and values, a hash, a readable repr and refuses assignment. No imports.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs milliseconds of the apt hook's start-up budget
    from typing import Tuple


class Record:
    """An immutable record whose fields are the subclass's ``__slots__``, set once by ``Record.__init__``."""

    __slots__: Tuple[str, ...] = ()

    def __init__(self, *values: object) -> None:
        names = type(self).__slots__
        if len(values) != len(names):
            raise TypeError(f"{type(self).__name__} takes {len(names)} fields, got {len(values)}")
        for name, value in zip(names, values):
            object.__setattr__(self, name, value)

    def values(self) -> Tuple[object, ...]:
        """The fields' values, in ``__slots__`` order."""
        return tuple(getattr(self, name) for name in type(self).__slots__)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"{type(self).__name__} is immutable (cannot set {name})")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"{type(self).__name__} is immutable (cannot delete {name})")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Record) and type(other) is type(self) and self.values() == other.values()

    def __ne__(self, other: object) -> bool:
        return not self == other

    def __hash__(self) -> int:
        return hash((type(self).__name__,) + self.values())

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={getattr(self, name)!r}" for name in type(self).__slots__)
        return f"{type(self).__name__}({fields})"

    def __reduce__(self) -> Tuple[object, Tuple[object, ...]]:
        return type(self), self.values()
