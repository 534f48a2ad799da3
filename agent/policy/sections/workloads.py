"""``[workloads]``: a driver/ROCm/CUDA change only to a stack on which the named workloads passed somewhere in the
fleet (agent/policy/families/workloads.py judges it)."""

from __future__ import annotations

from typing import Any, List, Optional, Tuple

from pydantic import Field, field_validator

from agent.policy.sections import Action, PolicyModel
from agent.wire import workload_name_ok


class WorkloadsSection(PolicyModel):
    """The registered workloads (``[[health.workloads]]`` names) that must have passed on a stack, on some host of
    the fleet (the hub's verified list, cached on the host), before a change to that stack is allowed."""

    verified: List[str] = Field(min_length=1, max_length=64)
    action: Optional[Action] = None

    @field_validator("verified")
    @classmethod
    def _names(cls, value: List[str]) -> List[str]:
        bad = [name for name in value if not workload_name_ok(name)]
        if bad:
            raise ValueError(f"{bad[0]!r} is not a workload name (1-64 of a-z 0-9 _ . - starting with a letter or "
                             "digit)")
        if len(set(value)) != len(value):
            raise ValueError("a workload named twice")
        return value


FIELD: Tuple[Any, Any] = (Optional[WorkloadsSection], None)


def rule_count(section: Optional[WorkloadsSection]) -> int:
    """One rule when the section is there."""
    return 1 if section is not None else 0


def merged_problems(section: Optional[WorkloadsSection]) -> List[str]:
    """None: the section's model says everything."""
    return []
