"""The base of every model that crosses an edge (snapshot, config, policy, report): frozen and strict."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, ValidationError


class FrozenModel(BaseModel):
    """Immutable, rejects unknown fields; equality and hashing by value."""

    model_config = ConfigDict(frozen=True, extra="forbid")


def first_validation_problem(exc: ValidationError) -> str:
    """``where -> field: message`` for the first error, ``(+N more)`` when pydantic found others too."""
    first = exc.errors()[0]
    where = " -> ".join(str(p) for p in first["loc"]) or "(top level)"
    more = f" (+{exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
    return f"{where}: {first['msg']}{more}"
