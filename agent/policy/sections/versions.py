"""``[[versions]]``: allowed versions of some packages (agent/policy/families/versions.py judges them)."""

from __future__ import annotations

from typing import Any, List, Optional, Tuple

from pydantic import Field, field_validator

from agent.policy.sections import Action, PolicyModel, Spec, check_package_spec, check_patterns


class VersionRule(PolicyModel):
    """Allowed versions of some packages (e.g. the container toolkit)."""

    name: Optional[str] = None
    packages: List[str] = Field(min_length=1)
    allow: Spec
    action: Optional[Action] = None

    _specs = field_validator("allow")(check_package_spec)
    _patterns = field_validator("packages")(check_patterns)


FIELD: Tuple[Any, Any] = (List[VersionRule], [])


def rule_count(rules: List[VersionRule]) -> int:
    """One rule per entry."""
    return len(rules)


def merged_problems(rules: List[VersionRule]) -> List[str]:
    """None: the section's models say everything."""
    return []
