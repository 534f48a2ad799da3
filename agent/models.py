"""The base of every model that crosses an edge (snapshot, config, policy, report): frozen and strict."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class FrozenModel(BaseModel):
    """Immutable, rejects unknown fields; equality and hashing by value."""

    model_config = ConfigDict(frozen=True, extra="forbid")
