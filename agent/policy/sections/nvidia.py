"""``[nvidia]``: which packages carry the NVIDIA driver and CUDA, and the allowed pairings (agent/policy/families/
nvidia.py judges them)."""

from __future__ import annotations

from typing import Any, List, Optional, Tuple

from pydantic import Field, field_validator

from agent.policy.compiled import DEFAULT_CUDA_PACKAGES, DEFAULT_NVIDIA_DRIVER_PACKAGES
from agent.policy.sections import Action, PolicyModel, Spec, check_patterns, check_spec, duplicate_names


class NvidiaPairing(PolicyModel):
    """One allowed combination of NVIDIA driver release and CUDA release."""

    name: str = Field(min_length=1)
    driver: Spec
    cuda: Spec
    action: Optional[Action] = None

    _specs = field_validator("driver", "cuda")(check_spec)


class NvidiaSection(PolicyModel):
    """Which packages carry the NVIDIA driver and CUDA, and the allowed pairings."""

    driver_packages: List[str] = list(DEFAULT_NVIDIA_DRIVER_PACKAGES)
    cuda_packages: List[str] = list(DEFAULT_CUDA_PACKAGES)
    action: Optional[Action] = None
    side_by_side: bool = False  # may several CUDA releases (cuda-toolkit-13-1 beside -13-0) be installed?
    pairing: List[NvidiaPairing] = []

    _patterns = field_validator("driver_packages", "cuda_packages")(check_patterns)


FIELD: Tuple[Any, Any] = (Optional[NvidiaSection], None)


def rule_count(section: Optional[NvidiaSection]) -> int:
    """One rule per pairing."""
    return len(section.pairing) if section else 0


def merged_problems(section: Optional[NvidiaSection]) -> List[str]:
    """A pairing name used twice (in one file or across files)."""
    return duplicate_names("nvidia", [p.name for p in section.pairing]) if section else []
