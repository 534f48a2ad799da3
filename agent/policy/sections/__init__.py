"""The policy's TOML sections as pydantic models: one module per rule family that has a section of its own, named
after the family (agent/policy/families/<name>.py), and what they share.

Each module holds its section's models and the three things agent/policy/model.py assembles ``Policy`` from:
``FIELD`` (the section's annotation and default, a field of ``Policy``), ``rule_count`` (how many rules it
defines) and ``merged_problems`` (what is wrong only once the policy files are merged). model.py walks the table of
families (agent/policy/families/__init__.py, ``FAMILIES``) and takes each family that has a module here; a family
without one (``matrix``: its switch is ``[policy] require_amd_matrix``) has no section. Off the hook's path: only
``gpuguard policy`` and the daemon import pydantic.

Types are strict: TOML has booleans and numbers, so ``require_amd_matrix = "yes"`` or
``max_override_minutes = "240"`` is an error, not something coerced (load.py words those messages).
"""

from __future__ import annotations

from typing import Annotated, Any, Callable, List, Literal, Optional, Sequence, Union

from pydantic import BeforeValidator, ConfigDict

from agent.models import FrozenModel
from agent.policy.spec import package_spec_errors, spec_errors

Action = Literal["warn", "block", "rollback"]


class PolicyModel(FrozenModel):
    """A policy table: frozen, unknown keys refused, and strict (no string for a bool or a number)."""

    model_config = ConfigDict(**FrozenModel.model_config, strict=True)


def _spec_type(value: Any) -> Any:
    if isinstance(value, str) or (isinstance(value, list) and all(isinstance(v, str) for v in value)):
        return value
    raise ValueError(f"{value!r} is not a version spec: give a string such as \"6.2.*\" or a list of them")


# One error per bad value (a plain Union would report one per union member).
Spec = Annotated[Union[str, List[str]], BeforeValidator(_spec_type)]


def _checked(value: Optional[Spec], errors: Callable[[Spec], List[str]]) -> Optional[Spec]:
    """``value`` unchanged when ``errors`` finds nothing wrong with it (None passes), else a ValueError naming all."""
    if value is None:
        return value
    problems = errors(value)
    if problems:
        raise ValueError("; ".join(problems))
    return value


def check_spec(value: Optional[Spec]) -> Optional[Spec]:
    """A spec on releases (agent/policy/spec.py); a validator."""
    return _checked(value, spec_errors)


def check_package_spec(value: Optional[Spec]) -> Optional[Spec]:
    """A spec on package versions: its constraint versions are ones dpkg or rpm accepts; a validator."""
    return _checked(value, package_spec_errors)


def check_patterns(value: List[str]) -> List[str]:
    """Package names or globs, no blank and no space; a validator."""
    for pattern in value:
        if not pattern.strip() or " " in pattern:
            raise ValueError(f"{pattern!r} is not a package name or glob")
    return value


def duplicate_names(section: str, names: Sequence[str]) -> List[str]:
    """One problem per pairing name used more than once (across the merged files)."""
    return [f"{section} -> pairing: name {name!r} is used more than once"
            for name in sorted({n for n in names if names.count(n) > 1})]
