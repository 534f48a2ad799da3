"""``[frozen]``: packages that must not move at all (agent/policy/families/frozen.py judges them)."""

from __future__ import annotations

from typing import Any, List, Optional, Tuple

from pydantic import field_validator

from agent.policy.sections import Action, PolicyModel, check_patterns


class FrozenSection(PolicyModel):
    """Packages that must not move at all (install, upgrade, downgrade or removal)."""

    packages: List[str] = []
    action: Optional[Action] = None

    _patterns = field_validator("packages")(check_patterns)


FIELD: Tuple[Any, Any] = (Optional[FrozenSection], None)


def rule_count(section: Optional[FrozenSection]) -> int:
    """One rule per frozen package (or glob)."""
    return len(section.packages) if section else 0


def merged_problems(section: Optional[FrozenSection]) -> List[str]:
    """None: the section's models say everything."""
    return []
