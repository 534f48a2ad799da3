"""The compiled policy: a plain JSON document the apt hook and the dnf checkers read without pydantic.

``gpuguard policy compile`` validates the TOML policy with the pydantic model and writes this file atomically;
the hook only checks its shape. Standard library only.
"""

from __future__ import annotations

import fnmatch

from agent.errors import InputFileError
from agent.files import read_json_file

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs milliseconds of the apt hook's start-up budget
    from typing import Any, Dict, List, Optional, Sequence, Tuple

COMPILED_FORMAT = 1
ACTIONS = ("warn", "block", "rollback")
FAILSAFE_MODES = ("block-guarded", "block-all", "allow")
DEFAULT_FAILSAFE = "block-guarded"
# Guarded when no readable compiled policy says otherwise: the kernel, GPU driver and GPU user-space packages.
DEFAULT_GUARDED: Sequence[str] = (
    "amdgpu*", "rocm*", "hip-*", "hsa-*", "hsakmt*", "amd-smi*", "linux-image-*", "linux-modules-*",
    "linux-headers-*", "linux-generic*", "kernel", "kernel-core", "kernel-modules*", "*-dkms", "dkms",
    "nvidia-*", "libnvidia-*", "cuda-*", "libcuda*", "kmod-nvidia*", "firmware-amd-graphics", "firmware-nvidia-*",
)
DEFAULT_KERNEL_PACKAGES: Sequence[str] = ("linux-image-*", "linux-modules-*", "kernel", "kernel-core",
                                          "kernel-uek", "kernel-default")
DEFAULT_NVIDIA_DRIVER_PACKAGES: Sequence[str] = ("nvidia-driver-*", "nvidia-dkms-*", "nvidia-kernel-dkms",
                                                 "nvidia-open", "nvidia-driver", "kmod-nvidia*")
DEFAULT_CUDA_PACKAGES: Sequence[str] = ("cuda-cudart-*", "cuda-runtime-*", "cuda-toolkit-*", "cuda-compat-*")
# Packages whose change replaces a kernel module: a reboot is needed before the new one is running.
KERNEL_MODULE_PACKAGES: Sequence[str] = ("amdgpu-dkms", "nvidia-dkms*", "nvidia-kernel-dkms", "kmod-nvidia*",
                                         "linux-image-*", "linux-modules-*", "kernel", "kernel-core")


class CompiledPolicy:
    """Read-only view of a compiled policy document with the defaults the evaluator relies on."""

    def __init__(self, data: Dict[str, Any], path: str = "<compiled>") -> None:
        self.data = data
        self.path = path

    @property
    def name(self) -> str:
        return str(self.data.get("name") or "unnamed")

    @property
    def action(self) -> str:
        return str(self.data.get("action") or "block")

    @property
    def failsafe(self) -> str:
        return str(self.data.get("failsafe") or DEFAULT_FAILSAFE)

    @property
    def guarded(self) -> List[str]:
        return list(self.data.get("guarded") or DEFAULT_GUARDED)

    @property
    def max_override_minutes(self) -> int:
        return int(self.data.get("max_override_minutes") or 240)

    @property
    def sources(self) -> List[str]:
        return [str(s.get("path")) for s in self.data.get("sources", []) if isinstance(s, dict)]

    @property
    def kernel_packages(self) -> List[str]:
        """The kernel package globs (the [kernel] section's, or the defaults, as compiled)."""
        return list(self.data["kernel_packages"])

    @property
    def amd_packages(self) -> Tuple[str, str]:
        """The AMD driver and ROCm package names (as compiled); only meaningful with an ``amd`` section."""
        amd = self.section("amd") or {}
        return str(amd.get("driver_package")), str(amd.get("rocm_package"))

    @property
    def nvidia_packages(self) -> Tuple[List[str], List[str]]:
        """The NVIDIA driver and CUDA package globs (as compiled); empty without an ``nvidia`` section."""
        nvidia = self.section("nvidia") or {}
        return list(nvidia.get("driver_packages") or []), list(nvidia.get("cuda_packages") or [])

    def section(self, key: str) -> Optional[Dict[str, Any]]:
        value = self.data.get(key)
        return value if isinstance(value, dict) else None

    def rules(self, key: str) -> List[Dict[str, Any]]:
        value = self.data.get(key)
        return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []

    def action_for(self, *candidates: Optional[str]) -> str:
        """The first action given (rule, then section), else the policy's default."""
        for candidate in candidates:
            if candidate in ACTIONS:
                return str(candidate)
        return self.action


def check_compiled(data: Any, path: str) -> CompiledPolicy:
    """Check a decoded document's shape; InputFileError says what is wrong."""
    if not isinstance(data, dict):
        raise InputFileError(path, "not a compiled gpuguard policy (top level is not an object)")
    fmt = data.get("format")
    if fmt != COMPILED_FORMAT:
        raise InputFileError(path, f"compiled policy format {fmt!r} is not {COMPILED_FORMAT}; "
                                   "run 'gpuguard policy compile' with this gpuguard version")
    if data.get("action") not in ACTIONS:
        raise InputFileError(path, f"action {data.get('action')!r} is not one of {', '.join(ACTIONS)}")
    if data.get("failsafe") not in FAILSAFE_MODES:
        raise InputFileError(path, f"failsafe {data.get('failsafe')!r} is not one of {', '.join(FAILSAFE_MODES)}")
    for key in ("guarded", "kernel_packages"):
        if not _is_str_list(data.get(key)):
            raise InputFileError(path, f"{key} is not a list of strings")
    for key in ("amd", "kernel", "nvidia", "frozen", "matrix"):
        if data.get(key) is not None and not isinstance(data.get(key), dict):
            raise InputFileError(path, f"{key} is not an object")
    # Defaults are applied once, when compiling: the readers rely on these being there.
    for key in ("driver_package", "rocm_package"):
        if data.get("amd") is not None and not isinstance(data["amd"].get(key), str):
            raise InputFileError(path, f"amd -> {key} is not a string")
    for key in ("driver_packages", "cuda_packages"):
        if data.get("nvidia") is not None and not _is_str_list(data["nvidia"].get(key)):
            raise InputFileError(path, f"nvidia -> {key} is not a list of strings")
    if not isinstance(data.get("versions", []), list):
        raise InputFileError(path, "versions is not a list")
    return CompiledPolicy(data, path)


def _is_str_list(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(item, str) for item in value)


def read_compiled(path: str) -> CompiledPolicy:
    """Read and check a compiled policy file; InputFileError when it is missing, unreadable or malformed."""
    data = read_json_file(path, missing_reason="no compiled policy (run 'gpuguard policy compile')")
    return check_compiled(data, path)


def guarded_names(names: Sequence[str], guarded: Sequence[str]) -> list:
    """The names (``name``, ``name:arch`` or ``name@version`` keys) that match a guarded pattern, sorted."""
    import re

    match = re.compile("|".join(fnmatch.translate(p) for p in guarded) or "(?!)").match
    return sorted(n for n in names if match(n.split(":", 1)[0].split("@", 1)[0]))
