"""``[containers]``: a driver change must leave running containers' CUDA/ROCm user space usable
(agent/policy/families/containers.py judges it)."""

from __future__ import annotations

from typing import Any, List, Optional, Tuple

from agent.policy.sections import Action, PolicyModel


class ContainersSection(PolicyModel):
    """On when present: the driver a transaction leaves must support every running container's CUDA release
    (NVIDIA_REQUIRE_CUDA / CUDA_VERSION) and, with ``require_amd_matrix``, its image's ROCm release."""

    action: Optional[Action] = None


FIELD: Tuple[Any, Any] = (Optional[ContainersSection], None)


def rule_count(section: Optional[ContainersSection]) -> int:
    """One rule when the section is there."""
    return 1 if section is not None else 0


def merged_problems(section: Optional[ContainersSection]) -> List[str]:
    """None: the section's model says everything."""
    return []
