"""The base of every pydantic model that crosses an edge (config, policy, report, hub): frozen and strict.

The snapshot's types are frozen records instead (agent/frozen.py), so ``gpuguard snapshot`` loads no
pydantic; pydantic validates them where a snapshot is read back (agent/snapshot/io.py).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, ValidationError

from agent.validation import validation_problems

__all__ = ["FrozenModel", "first_validation_problem"]

try:  # gpuguard's models use no third-party pydantic plugin: skip the entry-point scan of every installed package
    from pydantic.plugin import _loader as _pydantic_plugins

    if getattr(_pydantic_plugins, "_plugins", None) is None:
        _pydantic_plugins._plugins = {}
except ImportError:  # pragma: no cover - a pydantic without the plugin loader
    pass


class FrozenModel(BaseModel):
    """Immutable, rejects unknown fields and non-finite numbers (inf, nan); equality and hashing by value."""

    # defer_build: a model's validator and serializer are built when first used, not when its class is defined, so a
    # command pays only for the models it uses (issue #17).
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False, defer_build=True)


def first_validation_problem(exc: ValidationError) -> str:
    """``where -> field: message`` for the first error, ``(+N more)`` when pydantic found others too."""
    more = f" (+{exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
    return validation_problems(exc.errors()[:1])[0] + more
