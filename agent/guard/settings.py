"""Settings of the package guard ([guard] in agent.toml)."""

from __future__ import annotations

from typing import Optional, Tuple

from pydantic import Field

from agent.models import FrozenModel


class GuardSettings(FrozenModel):
    """Where the policy lives and how rollbacks wait and run; paths are host paths (under --root in tests)."""

    policy_path: str = "/etc/gpuguard/policy.d"
    # Default: policies/amd-compat-matrix.toml as shipped (see agent.policy.matrix.MATRIX_SEARCH_PATHS).
    matrix_path: Optional[str] = None
    preferences_dir: str = "/etc/apt/preferences.d"
    lock_timeout_seconds: float = Field(300.0, gt=0)
    apt_timeout_seconds: float = Field(900.0, gt=0)
    rollback_enabled: bool = True
    # Put before every dnf command of the rollback and pin apply (``-c FILE``, ``--setopt=...``); rpm hosts only.
    dnf_options: Tuple[str, ...] = ()
