"""``[[bake]]``: bake time, the days a version must have been public before a host takes it
(agent/policy/families/bake.py judges them)."""

from __future__ import annotations

from typing import Any, List, Literal, Optional, Tuple

from pydantic import Field, field_validator

from agent.policy.sections import Action, PolicyModel, check_patterns


class BakeRule(PolicyModel):
    """A package family's bake time: ``family`` names the default globs (driver, gpu_stack: ROCm and CUDA,
    firmware), ``packages`` replaces them."""

    name: Optional[str] = None
    family: Literal["driver", "gpu_stack", "firmware"]
    packages: Optional[List[str]] = Field(default=None, min_length=1)
    min_age_days: int = Field(ge=1, le=365)
    action: Optional[Action] = None

    @field_validator("packages")
    @classmethod
    def _patterns(cls, value: Optional[List[str]]) -> Optional[List[str]]:
        return None if value is None else check_patterns(value)


FIELD: Tuple[Any, Any] = (List[BakeRule], [])


def rule_count(rules: List[BakeRule]) -> int:
    """One rule per entry."""
    return len(rules)


def merged_problems(rules: List[BakeRule]) -> List[str]:
    """None: the section's models say everything."""
    return []
