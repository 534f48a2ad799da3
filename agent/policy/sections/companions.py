"""``[companions]``: packages that must stay paired with the package they serve (agent/policy/families/
companions.py judges them)."""

from __future__ import annotations

from typing import Any, List, Optional, Tuple

from agent.policy.sections import Action, PolicyModel


class CompanionsSection(PolicyModel):
    """Packages that must stay paired with the package they serve (agent/policy/companions.py); each rule is on
    unless set to false, and judges only the packages a host has.

    ``fabricmanager``: fabric manager and NSCQ exactly the NVIDIA driver's build; ``dcgm``: DCGM's packages of one
    release; ``dcgm_exporter``: dcgm-exporter with a DCGM of the series it was built for; ``amdsmi``: the amdsmi
    Python binding and libamd_smi of one ROCm release.
    """

    fabricmanager: bool = True
    dcgm: bool = True
    dcgm_exporter: bool = True
    amdsmi: bool = True
    action: Optional[Action] = None

    def enabled(self) -> List[str]:
        """The rules turned on (field names, in the order they are judged)."""
        return [name for name in ("fabricmanager", "dcgm", "dcgm_exporter", "amdsmi") if getattr(self, name)]


FIELD: Tuple[Any, Any] = (Optional[CompanionsSection], None)


def rule_count(section: Optional[CompanionsSection]) -> int:
    """One rule per companion rule turned on."""
    return len(section.enabled()) if section else 0


def merged_problems(section: Optional[CompanionsSection]) -> List[str]:
    """None: the section's models say everything."""
    return []
