"""The compiled policy: a plain JSON document the apt hook and the dnf checkers read without pydantic.

``gpuguard policy compile`` validates the TOML policy with the pydantic model and writes this file atomically;
the hook only checks its shape. Standard library only.
"""

from __future__ import annotations

from agent.defaults import (
    AMD_DRIVER_PACKAGE,
    DISTRIBUTION_CUDA_PACKAGES,
    DISTRIBUTION_ROCM_PACKAGES,
    NVIDIA_GL_PACKAGES,
)
from agent.errors import InputFileError
from agent.hostfacts.package_keys import package_name
from agent.policy.families import FAMILIES
from agent.strictjson import nesting_depth, parse_json_text

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs milliseconds of the apt hook's start-up budget
    from typing import Any, Dict, List, Optional, Sequence, Tuple

COMPILED_FORMAT = 1
ACTIONS = ("warn", "block", "rollback")
FAILSAFE_MODES = ("block-guarded", "block-all", "allow")
DEFAULT_FAILSAFE = "block-guarded"
# The AMD driver and user-space stack, guarded whenever a policy has an [amd] section: AMD's packages depend on
# each other at exact versions (amdgpu-dkms on amdgpu-dkms-firmware, rocm-libs on rocm-core, ...), so a rollback
# that restores the driver or ROCm must be able to restore all of them. Debian's and Ubuntu's ROCm libraries with them.
AMD_STACK_PACKAGES: Sequence[str] = ("amdgpu*", "rocm*", "amdrocm*", "hip-*", "hsa-*", "hsakmt*", "amd-smi*",
                                     *DISTRIBUTION_ROCM_PACKAGES)
# Guarded when no readable compiled policy says otherwise: the kernel, GPU driver and GPU user-space packages.
DEFAULT_GUARDED: Sequence[str] = tuple(AMD_STACK_PACKAGES) + (
    "linux-image-*", "linux-modules-*",
    "linux-headers-*", "linux-generic*", "kernel", "kernel-core", "kernel-modules*", "*-dkms", "dkms",
    "nvidia-*", "libnvidia-*", "cuda-*", "libcuda*", "kmod-nvidia*", "firmware-amd-graphics", "firmware-nvidia-*",
    *DISTRIBUTION_CUDA_PACKAGES, *NVIDIA_GL_PACKAGES,
)
DEFAULT_KERNEL_PACKAGES: Sequence[str] = ("linux-image-*", "linux-modules-*", "kernel", "kernel-core",
                                          "kernel-uek", "kernel-default")
# Every part of the NVIDIA driver as Ubuntu, Debian (nvidia-driver, nvidia-kernel-dkms, libcuda1, ...), NVIDIA's
# CUDA repositories and RHEL ship it: meta packages, the kernel module (dkms, kmod, precompiled), kernel-common, the
# user-space libraries, the tools and fabric manager. They are one build (Ubuntu's depend on each other with
# ``=``), and each is judged.
DEFAULT_NVIDIA_DRIVER_PACKAGES: Sequence[str] = (
    "nvidia-driver-*", "nvidia-dkms-*", "nvidia-kernel-dkms", "nvidia-open", "nvidia-driver", "kmod-nvidia*",
    "nvidia-kernel-common-*", "nvidia-kernel-source-*", "nvidia-kmod-common", "nvidia-compute-utils-*",
    "nvidia-utils-*", "libnvidia-compute-*", "libnvidia-gl-*", "libnvidia-decode-*", "libnvidia-encode-*",
    "libnvidia-extra-*", "libnvidia-cfg1-*", "libnvidia-fbc1-*", "libnvidia-common-*",
    "xserver-xorg-video-nvidia-*", "nvidia-fabricmanager-*", "nvidia-fabric-manager", "cuda-drivers",
    "cuda-drivers-*", "nvidia-kernel-support", "nvidia-alternative", "libcuda1", "libnvidia-ml1", "nvidia-smi",
    # SUSE (NVIDIA's SLES repository and SUSE's own): the G06 generation's kernel module packages (KMPs, signed and
    # not) and user space, versioned like 580.95.05_k6.4.0_150700.53.3-1.1 (the kernel they were built for after _k)
    "nvidia-open-driver-G0*", "nvidia-driver-G0*", "nvidia-compute-G0*", "nvidia-gl-G0*", "nvidia-video-G0*",
)
# Matched by a driver glob but versioned on their own: not driver parts.
NVIDIA_NOT_DRIVER_PARTS = frozenset({"nvidia-driver-assistant", "nvidia-driver-pinning"})
# The packages whose versions carry the CUDA release: NVIDIA's repositories' and Debian's and Ubuntu's (the
# toolkit and the runtime, ``12.4.127~12.4.1-2``: the CUDA release after the tilde, releases.cuda_release).
DEFAULT_CUDA_PACKAGES: Sequence[str] = ("cuda-cudart-*", "cuda-runtime-*", "cuda-toolkit-*", "cuda-compat-*",
                                        "nvidia-cuda-toolkit", "libcudart[0-9]*")
# Packages whose change replaces a kernel module: a reboot is needed before the new one is running.
KERNEL_MODULE_PACKAGES: Sequence[str] = (AMD_DRIVER_PACKAGE, "nvidia-dkms*", "nvidia-kernel-dkms", "kmod-nvidia*",
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

    @property
    def health_after_change(self) -> str:
        """The policy's ``[health] after_change``: "alert" (the default) or "rollback"."""
        return str((self.section("health") or {}).get("after_change") or "alert")

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


# The compiled policy is a few kB (the AMD matrix included); far beyond that it is not ours.
MAX_COMPILED_BYTES = 8 << 20
MAX_COMPILED_DEPTH = 16


class ShapeProblem(Exception):
    """One thing wrong with a compiled document, as ``where: message`` (the families' ``shape`` raise it)."""


def expect(ok: bool, where: str, message: str) -> None:
    """Raise :class:`ShapeProblem` unless ``ok``."""
    if not ok:
        raise ShapeProblem(f"{where}: {message}")


def str_list(value: Any, where: str, non_empty: bool = False) -> None:
    """A list of strings (not empty, if asked)."""
    expect(isinstance(value, list) and all(isinstance(item, str) for item in value), where,
           "not a list of strings")
    expect(not non_empty or bool(value), where, "empty list")


def optional_str(value: Any, where: str) -> None:
    """A string or nothing."""
    expect(value is None or isinstance(value, str), where, "not a string")


def optional_bool(value: Any, where: str) -> None:
    """true, false or nothing."""
    expect(value is None or isinstance(value, bool), where, "not true or false")


def action(value: Any, where: str) -> None:
    """One of :data:`ACTIONS`, or nothing."""
    expect(value is None or value in ACTIONS, where, f"{value!r} is not one of {', '.join(ACTIONS)}")


def spec(value: Any, where: str, package_versions: bool = False) -> None:
    """A version spec (agent/policy/spec.py), of package versions if asked."""
    from agent.policy.spec import package_spec_errors, spec_errors

    expect(isinstance(value, str) or (isinstance(value, list) and all(isinstance(v, str) for v in value)), where,
           "not a version spec (a string or a list of strings)")
    problems = package_spec_errors(value) if package_versions else spec_errors(value)
    expect(not problems, where, "; ".join(problems))


def table(value: Any, where: str, keys: Sequence[str]) -> Dict[str, Any]:
    """An object, as ``{key: its value or None}`` for these keys."""
    expect(isinstance(value, dict), where, "not an object")
    return {key: value.get(key) for key in keys}


def _check_document(data: Dict[str, Any]) -> None:
    """Every field the readers use, with its type: a string where a list belongs must not drop a rule. The
    policy-wide fields here, each family's section by the family's ``shape`` (agent/policy/families/), in the
    order of their table; a family whose section is absent (None, or an empty list) is not imported."""
    expect(isinstance(data.get("name", ""), str), "name", "not a string")
    expect(isinstance(data.get("compiled_at", ""), str), "compiled_at", "not a string")
    sources = data.get("sources", [])
    expect(isinstance(sources, list) and all(isinstance(s, dict) and isinstance(s.get("path"), str)
                                             for s in sources), "sources", "not a list of {path, sha256}")
    minutes = data.get("max_override_minutes", 240)
    expect(isinstance(minutes, int) and not isinstance(minutes, bool) and 0 < minutes <= 7 * 24 * 60,
           "max_override_minutes", f"{minutes!r} is not a number of minutes from 1 to {7 * 24 * 60}")
    str_list(data.get("guarded"), "guarded")
    str_list(data.get("kernel_packages"), "kernel_packages")
    for name in FAMILIES:
        value = data.get(name)
        if value is not None and value != []:
            __import__("agent.policy.families." + name, None, None, ("shape",)).shape(data)
    if data.get("health") is not None:
        health = table(data["health"], "health", ("after_change",))
        expect(health["after_change"] in (None, "alert", "rollback"), "health -> after_change",
               f"{health['after_change']!r} is not alert or rollback")


def check_compiled(data: Any, path: str) -> CompiledPolicy:
    """Check a decoded document deeply (every field the evaluator reads, with its type); InputFileError says
    what is wrong. Used when compiling and when reading: a policy that passes here cannot drop a rule."""
    if nesting_depth(data) > MAX_COMPILED_DEPTH:
        raise InputFileError(path, f"not a compiled gpuguard policy (nested deeper than {MAX_COMPILED_DEPTH} levels)")
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
    try:
        _check_document(data)
    except ShapeProblem as exc:
        raise InputFileError(path, f"invalid compiled policy: {exc}") from None
    return CompiledPolicy(data, path)


def read_compiled(path: str) -> CompiledPolicy:
    """Read and check a compiled policy file; InputFileError when it is missing, unreadable or malformed.

    Read without blocking (a FIFO in its place must not hang apt) and bounded; bytes that are not UTF-8 and
    nesting too deep for the JSON parser are malformed policy like any other (the fail-safe's policy exit, 11).
    """
    from agent.hostfacts.paths import read_regular_file

    try:
        raw = read_regular_file(path, MAX_COMPILED_BYTES)
    except FileNotFoundError:
        raise InputFileError(path, "no compiled policy (run 'gpuguard policy compile')") from None
    except OSError as exc:
        raise InputFileError(path, exc.strerror or str(exc)) from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputFileError(path, f"not UTF-8 (byte {exc.start})") from None
    return check_compiled(parse_json_text(path, text, MAX_COMPILED_DEPTH), path)


def guarded_names(names: Sequence[str], guarded: Sequence[str]) -> list:
    """The names (``name``, ``name:arch`` or ``name@version`` keys) that match a guarded pattern, sorted."""
    from agent.policy.globs import any_glob

    match = any_glob(guarded)
    return sorted(n for n in names if match(package_name(n)))
