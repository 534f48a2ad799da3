"""``[kernel]``: the kernels a host may install (agent/policy/families/kernel.py judges them)."""

from __future__ import annotations

from typing import Any, List, Optional, Tuple

from pydantic import field_validator

from agent.policy.compiled import DEFAULT_KERNEL_PACKAGES
from agent.policy.sections import Action, PolicyModel, Spec, check_patterns, check_spec


class KernelSection(PolicyModel):
    """The kernels a host may install (new kernels only: those already installed stay allowed)."""

    packages: List[str] = list(DEFAULT_KERNEL_PACKAGES)
    allow: Optional[Spec] = None
    action: Optional[Action] = None

    _specs = field_validator("allow")(check_spec)
    _patterns = field_validator("packages")(check_patterns)


FIELD: Tuple[Any, Any] = (Optional[KernelSection], None)


def rule_count(section: Optional[KernelSection]) -> int:
    """The allow list is one rule."""
    return int(section is not None and section.allow is not None)


def merged_problems(section: Optional[KernelSection]) -> List[str]:
    """None: the section's models say everything."""
    return []
