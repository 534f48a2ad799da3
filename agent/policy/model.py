"""The pairing policy as operators write it (TOML), validated with frozen pydantic models.

A policy pins what operators freeze (allowed amdgpu driver x ROCm pairings, kernels, NVIDIA driver x CUDA
pairings, per-package version rules such as container toolkits, packages that must not move) and says what a
violation does: ``warn``, ``block`` (refuse the transaction) or ``rollback`` (refuse it, and put back anything
that slipped through, e.g. via ``dpkg -i``). See docs/guard.md and policies/example.toml (installed as
/usr/share/doc/gpuguard/guard.md and /etc/gpuguard/example-policy.toml).

``Policy`` is assembled from the table of rule families (agent/policy/families/__init__.py, ``FAMILIES``): each family
with a TOML section of its own has its pydantic model in agent/policy/sections/<name>.py, and its field here comes
from that module's ``FIELD`` (:data:`SECTIONS`). Besides those, the policy-wide ``[policy]`` and ``[health]``
sections are this module's. For mypy the same fields are declared below; tests/policy/families/test_families.py
fails when they and the table disagree.

Types are strict: TOML has booleans and numbers, so ``require_amd_matrix = "yes"`` or
``max_override_minutes = "240"`` is an error, not something coerced (load.py words those messages).
"""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType
from typing import TYPE_CHECKING, Dict, List, Literal, Optional

from pydantic import Field, create_model, field_validator

from agent.policy.families import FAMILIES
from agent.policy.sections import Action, PolicyModel, check_patterns

if TYPE_CHECKING:  # the families' section models, for the declaration of Policy below (mypy's view only)
    from agent.policy.sections.amd import AmdSection
    from agent.policy.sections.bake import BakeRule
    from agent.policy.sections.companions import CompanionsSection
    from agent.policy.sections.containers import ContainersSection
    from agent.policy.sections.frozen import FrozenSection
    from agent.policy.sections.kernel import KernelSection
    from agent.policy.sections.nvidia import NvidiaSection
    from agent.policy.sections.versions import VersionRule
    from agent.policy.sections.workloads import WorkloadsSection

Failsafe = Literal["block-guarded", "block-all", "allow"]


def _sections() -> Dict[str, ModuleType]:
    """The section module of each family that has one (agent/policy/sections/<name>.py), in table order."""
    return {name: importlib.import_module(f"agent.policy.sections.{name}") for name in FAMILIES
            if importlib.util.find_spec(f"agent.policy.sections.{name}") is not None}


SECTIONS: Dict[str, ModuleType] = _sections()


class PolicySection(PolicyModel):
    """Defaults for the whole policy."""

    name: str = Field("unnamed", min_length=1)
    action: Action = "block"
    failsafe: Failsafe = "block-guarded"
    require_amd_matrix: bool = False
    max_override_minutes: int = Field(240, gt=0, le=7 * 24 * 60)
    guarded: List[str] = []

    _patterns = field_validator("guarded")(check_patterns)


class HealthSection(PolicyModel):
    """What the daemon does when the health check after a package change finds the GPU stack broken.

    ``alert`` reports it; ``rollback`` also restores the guarded packages recorded before the change (on
    ``cpu_fallback`` or ``failed``, or a ``regression`` a second run on an idle GPU confirms; never on a busy GPU).
    """

    after_change: Literal["alert", "rollback"] = "alert"


class PolicyBase(PolicyModel):
    """What a policy has besides the families' sections: ``[policy]``, and the rule count over every section."""

    policy: PolicySection = PolicySection()

    def rule_count(self) -> int:
        """How many rules the policy defines (0 means it constrains nothing)."""
        count = int(self.policy.require_amd_matrix)  # the matrix family's switch
        for name, section in SECTIONS.items():
            count += section.rule_count(getattr(self, name))
        return count


if TYPE_CHECKING:  # mypy's view of the model assembled below; test_families.py holds the two to each other
    class Policy(PolicyBase):
        """A whole policy (one file, or several merged in name order)."""

        frozen: Optional[FrozenSection] = None
        amd: Optional[AmdSection] = None
        kernel: Optional[KernelSection] = None
        nvidia: Optional[NvidiaSection] = None
        versions: List[VersionRule] = []
        companions: Optional[CompanionsSection] = None
        containers: Optional[ContainersSection] = None
        workloads: Optional[WorkloadsSection] = None
        bake: List[BakeRule] = []
        health: Optional[HealthSection] = None
else:
    Policy = create_model(
        "Policy", __base__=PolicyBase, __module__=__name__,
        __doc__="A whole policy (one file, or several merged in name order).",
        **{name: section.FIELD for name, section in SECTIONS.items()},
        health=(Optional[HealthSection], None),
    )
