"""``[amd]``: which packages carry the AMD driver and ROCm, and the allowed pairings (agent/policy/families/amd.py
judges them)."""

from __future__ import annotations

from typing import Any, List, Literal, Optional, Tuple

from pydantic import Field, field_validator

from agent.defaults import AMD_DRIVER_PACKAGE, ROCM_CORE_PACKAGE
from agent.policy.sections import Action, PolicyModel, Spec, check_package_spec, check_spec, duplicate_names


class AmdPairing(PolicyModel):
    """One allowed combination of amdgpu driver release and ROCm release."""

    name: str = Field(min_length=1)
    amdgpu: Spec
    rocm: Spec
    amdgpu_package: Optional[Spec] = None
    rocm_package: Optional[Spec] = None
    kernels: Optional[Spec] = None
    action: Optional[Action] = None

    _specs = field_validator("amdgpu", "rocm", "kernels")(check_spec)
    _package_specs = field_validator("amdgpu_package", "rocm_package")(check_package_spec)


class AmdSection(PolicyModel):
    """Which packages carry the AMD driver and ROCm, and the allowed pairings."""

    driver_package: str = AMD_DRIVER_PACKAGE
    rocm_package: str = ROCM_CORE_PACKAGE
    action: Optional[Action] = None
    side_by_side: bool = False  # may several ROCm releases (rocm-core6.4.1 beside rocm-core) be installed?
    # "pinned": the tree update-alternatives points at (/opt/rocm/core) must be a release an installed release
    # package carries and the pairing in force accepts; "any": not judged
    active_tree: Literal["any", "pinned"] = "any"
    pairing: List[AmdPairing] = []


FIELD: Tuple[Any, Any] = (Optional[AmdSection], None)


def rule_count(section: Optional[AmdSection]) -> int:
    """One rule per pairing."""
    return len(section.pairing) if section else 0


def merged_problems(section: Optional[AmdSection]) -> List[str]:
    """A pairing name used twice (in one file or across files)."""
    return duplicate_names("amd", [p.name for p in section.pairing]) if section else []
