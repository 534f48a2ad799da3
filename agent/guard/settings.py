"""Settings of the package guard ([guard] in agent.toml)."""

from __future__ import annotations

from typing import Any, Literal, Optional, Tuple

from pydantic import Field, ValidationInfo, model_validator

from agent.defaults import DEFAULT_KEYS_DIR, DEFAULT_POLICY_DIR
from agent.models import FrozenModel

# Keys of [guard] renamed for what they are, the old name -> the new one: the old is still read, with a warning.
RENAMED_KEYS = {"apt_timeout_seconds": "package_tool_timeout_seconds"}


class GuardSettings(FrozenModel):
    """Where the policy lives and how rollbacks wait and run; paths are host paths (under --root in tests)."""

    policy_path: str = DEFAULT_POLICY_DIR
    # Default: policies/amd-compat-matrix.toml as shipped (see agent.policy.matrix.MATRIX_SEARCH_PATHS).
    matrix_path: Optional[str] = None
    preferences_dir: str = "/etc/apt/preferences.d"
    lock_timeout_seconds: float = Field(300.0, gt=0)
    # How long one package-manager command of a rollback or pin apply may run: apt-get/dpkg, or dnf/rpm.
    package_tool_timeout_seconds: float = Field(900.0, gt=0)
    rollback_enabled: bool = True
    # The most the kept package files (known-good set and the set before the last change) may take; 0: no cap.
    # docs/guard.md "Bounded disk" says what CUDA and ROCm sets cost.
    kept_packages_max_bytes: int = Field(32 * 1024 ** 3, ge=0)
    # Put before every dnf command of the rollback and pin apply (``-c FILE``, ``--setopt=...``); rpm hosts only.
    dnf_options: Tuple[str, ...] = ()
    # Which policy the compiled file comes from: the files in policy_path ("local"), or the signed policy bundle
    # in force (``gpuguard policy install``, the daemon's fetch from the hub: "bundle"). docs/guard.md, "Signed policy".
    policy_source: Literal["local", "bundle"] = "local"
    # The trusted OpenPGP keyrings (*.gpg) a policy bundle's signature is checked against.
    keys_dir: str = DEFAULT_KEYS_DIR

    @model_validator(mode="before")
    @classmethod
    def _read_renamed_keys(cls, data: Any, info: ValidationInfo) -> Any:
        """An old key is read as its new one, with a ``config_key_renamed`` warning naming the file and both keys;
        both at once is an error."""
        if not isinstance(data, dict) or not any(old in data for old in RENAMED_KEYS):
            return data
        from agent.log import get_logger

        path = (info.context or {}).get("path", "<settings>")
        data = dict(data)
        for old, new in RENAMED_KEYS.items():
            if old not in data:
                continue
            if new in data:
                raise ValueError(f"{old} is the old name of {new}: give only {new}")
            get_logger("config").warning("config_key_renamed", path=path, key=f"guard.{old}",
                                         replaced_by=f"guard.{new}")
            data[new] = data.pop(old)
        return data
