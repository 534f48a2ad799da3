"""The base of every model that crosses an edge (snapshot, config, policy, report): frozen and strict."""

from __future__ import annotations

from typing import Any, Iterable, List, Mapping

from pydantic import BaseModel, ConfigDict, ValidationError

try:  # gpuguard's models use no third-party pydantic plugin: skip the entry-point scan of every installed package
    from pydantic.plugin import _loader as _pydantic_plugins

    if getattr(_pydantic_plugins, "_plugins", None) is None:
        _pydantic_plugins._plugins = {}
except ImportError:  # pragma: no cover - a pydantic without the plugin loader
    pass


class FrozenModel(BaseModel):
    """Immutable, rejects unknown fields and non-finite numbers (inf, nan); equality and hashing by value."""

    # defer_build: a model's validator and serializer are built when first used, not when its class is defined, so a
    # command pays only for the models it uses (``gpuguard snapshot`` on a host without AMD GPUs never builds the
    # amdsmi models' own validators; issue #17).
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False, defer_build=True)


def validation_problems(errors: Iterable[Mapping[str, Any]], skip_loc: int = 0, top: str = "(top level)") -> List[str]:
    """``field -> 1 -> key: message`` for every error pydantic found (``ValidationError.errors()``).

    The one formatter of validation problems: list indexes count from 1, as an operator counts the entries of a
    file; ``skip_loc`` drops leading location parts (FastAPI's ``body``), ``top`` names an error without one.
    """
    problems = []
    for err in errors:
        loc = list(err.get("loc", ()))[skip_loc:]
        where = " -> ".join(str(p + 1) if isinstance(p, int) else str(p) for p in loc) or top
        message = str(err.get("msg", "invalid"))
        if message.startswith("Value error, "):
            message = message[len("Value error, "):]
        problems.append(f"{where}: {message}")
    return problems


def first_validation_problem(exc: ValidationError) -> str:
    """``where -> field: message`` for the first error, ``(+N more)`` when pydantic found others too."""
    more = f" (+{exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
    return validation_problems(exc.errors()[:1])[0] + more
