"""The compiled policy: a plain JSON document the apt hook and the dnf checkers read without pydantic.

``gpuguard policy compile`` validates the TOML policy with the pydantic model and writes this file atomically;
the hook only checks its shape. Standard library only.
"""

from __future__ import annotations

from agent.defaults import AMD_DRIVER_PACKAGE
from agent.errors import InputFileError
from agent.hostfacts.package_keys import package_name
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
# that restores the driver or ROCm must be able to restore all of them.
AMD_STACK_PACKAGES: Sequence[str] = ("amdgpu*", "rocm*", "amdrocm*", "hip-*", "hsa-*", "hsakmt*", "amd-smi*")
# Guarded when no readable compiled policy says otherwise: the kernel, GPU driver and GPU user-space packages.
DEFAULT_GUARDED: Sequence[str] = tuple(AMD_STACK_PACKAGES) + (
    "linux-image-*", "linux-modules-*",
    "linux-headers-*", "linux-generic*", "kernel", "kernel-core", "kernel-modules*", "*-dkms", "dkms",
    "nvidia-*", "libnvidia-*", "cuda-*", "libcuda*", "kmod-nvidia*", "firmware-amd-graphics", "firmware-nvidia-*",
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
)
# Matched by a driver glob but versioned on their own: not driver parts.
NVIDIA_NOT_DRIVER_PARTS = frozenset({"nvidia-driver-assistant", "nvidia-driver-pinning"})
DEFAULT_CUDA_PACKAGES: Sequence[str] = ("cuda-cudart-*", "cuda-runtime-*", "cuda-toolkit-*", "cuda-compat-*")
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


class _Problem(Exception):
    """One thing wrong with a compiled document, as ``where: message``."""


def _expect(ok: bool, where: str, message: str) -> None:
    if not ok:
        raise _Problem(f"{where}: {message}")


def _str_list(value: Any, where: str, non_empty: bool = False) -> None:
    _expect(isinstance(value, list) and all(isinstance(item, str) for item in value), where,
            "not a list of strings")
    _expect(not non_empty or bool(value), where, "empty list")


def _optional_str(value: Any, where: str) -> None:
    _expect(value is None or isinstance(value, str), where, "not a string")


def _action(value: Any, where: str) -> None:
    _expect(value is None or value in ACTIONS, where, f"{value!r} is not one of {', '.join(ACTIONS)}")


def _spec(value: Any, where: str, package_versions: bool = False) -> None:
    from agent.policy.spec import package_spec_errors, spec_errors

    _expect(isinstance(value, str) or (isinstance(value, list) and all(isinstance(v, str) for v in value)), where,
            "not a version spec (a string or a list of strings)")
    problems = package_spec_errors(value) if package_versions else spec_errors(value)
    _expect(not problems, where, "; ".join(problems))


def _table(value: Any, where: str, keys: Sequence[str]) -> Dict[str, Any]:
    _expect(isinstance(value, dict), where, "not an object")
    return {key: value.get(key) for key in keys}


def _check_document(data: Dict[str, Any]) -> None:
    """Every field the readers use, with its type: a string where a list belongs must not drop a rule."""
    _expect(isinstance(data.get("name", ""), str), "name", "not a string")
    _expect(isinstance(data.get("compiled_at", ""), str), "compiled_at", "not a string")
    sources = data.get("sources", [])
    _expect(isinstance(sources, list) and all(isinstance(s, dict) and isinstance(s.get("path"), str)
                                              for s in sources), "sources", "not a list of {path, sha256}")
    minutes = data.get("max_override_minutes", 240)
    _expect(isinstance(minutes, int) and not isinstance(minutes, bool) and 0 < minutes <= 7 * 24 * 60,
            "max_override_minutes", f"{minutes!r} is not a number of minutes from 1 to {7 * 24 * 60}")
    _str_list(data.get("guarded"), "guarded")
    _str_list(data.get("kernel_packages"), "kernel_packages")
    if data.get("amd") is not None:
        amd = _table(data["amd"], "amd", ("driver_package", "rocm_package", "action", "pairings", "side_by_side"))
        _expect(amd["side_by_side"] is None or isinstance(amd["side_by_side"], bool), "amd -> side_by_side",
                "not true or false")
        for key in ("driver_package", "rocm_package"):
            _expect(isinstance(amd[key], str) and bool(amd[key]), f"amd -> {key}", "not a package name")
        _action(amd["action"], "amd -> action")
        _expect(isinstance(amd["pairings"] or [], list), "amd -> pairings", "not a list")
        for index, pairing in enumerate(amd["pairings"] or [], 1):
            where = f"amd -> pairings -> {index}"
            p = _table(pairing, where, ("name", "amdgpu", "rocm", "amdgpu_package", "rocm_package", "kernels",
                                        "action"))
            _expect(isinstance(p["name"], str), f"{where} -> name", "not a string")
            _spec(p["amdgpu"], f"{where} -> amdgpu")
            _spec(p["rocm"], f"{where} -> rocm")
            for key in ("amdgpu_package", "rocm_package"):
                if p[key] is not None:
                    _spec(p[key], f"{where} -> {key}", package_versions=True)
            if p["kernels"] is not None:
                _spec(p["kernels"], f"{where} -> kernels")
            _action(p["action"], f"{where} -> action")
    if data.get("kernel") is not None:
        kernel = _table(data["kernel"], "kernel", ("packages", "allow", "action"))
        if kernel["packages"] is not None:
            _str_list(kernel["packages"], "kernel -> packages")
        if kernel["allow"] is not None:
            _spec(kernel["allow"], "kernel -> allow")
        _action(kernel["action"], "kernel -> action")
    if data.get("nvidia") is not None:
        nvidia = _table(data["nvidia"], "nvidia", ("driver_packages", "cuda_packages", "action", "pairings",
                                                    "side_by_side"))
        _expect(nvidia["side_by_side"] is None or isinstance(nvidia["side_by_side"], bool),
                "nvidia -> side_by_side", "not true or false")
        _str_list(nvidia["driver_packages"], "nvidia -> driver_packages")
        _str_list(nvidia["cuda_packages"], "nvidia -> cuda_packages")
        _action(nvidia["action"], "nvidia -> action")
        _expect(isinstance(nvidia["pairings"] or [], list), "nvidia -> pairings", "not a list")
        for index, pairing in enumerate(nvidia["pairings"] or [], 1):
            where = f"nvidia -> pairings -> {index}"
            p = _table(pairing, where, ("name", "driver", "cuda", "action"))
            _expect(isinstance(p["name"], str), f"{where} -> name", "not a string")
            _spec(p["driver"], f"{where} -> driver")
            _spec(p["cuda"], f"{where} -> cuda")
            _action(p["action"], f"{where} -> action")
    if data.get("frozen") is not None:
        frozen = _table(data["frozen"], "frozen", ("packages", "action"))
        _str_list(frozen["packages"], "frozen -> packages")
        _action(frozen["action"], "frozen -> action")
    _expect(isinstance(data.get("versions", []), list), "versions", "not a list")
    for index, rule in enumerate(data.get("versions") or [], 1):
        where = f"versions -> {index}"
        r = _table(rule, where, ("name", "packages", "allow", "action"))
        _optional_str(r["name"], f"{where} -> name")
        _str_list(r["packages"], f"{where} -> packages", non_empty=True)
        _spec(r["allow"], f"{where} -> allow", package_versions=True)
        _action(r["action"], f"{where} -> action")
    if data.get("companions") is not None:
        companions = _table(data["companions"], "companions", ("fabricmanager", "dcgm", "dcgm_exporter", "amdsmi",
                                                                "action"))
        for key in ("fabricmanager", "dcgm", "dcgm_exporter", "amdsmi"):
            _expect(companions[key] is None or isinstance(companions[key], bool), f"companions -> {key}",
                    "not true or false")
        _action(companions["action"], "companions -> action")
    if data.get("health") is not None:
        health = _table(data["health"], "health", ("after_change",))
        _expect(health["after_change"] in (None, "alert", "rollback"), "health -> after_change",
                f"{health['after_change']!r} is not alert or rollback")
    if data.get("matrix") is not None:
        matrix = _table(data["matrix"], "matrix", ("action", "driver_rocm", "rocm"))
        _action(matrix["action"], "matrix -> action")
        driver_rocm = matrix["driver_rocm"] or {}
        _expect(isinstance(driver_rocm, dict), "matrix -> driver_rocm", "not an object")
        for series, rocm in driver_rocm.items():
            _str_list(rocm, f"matrix -> driver_rocm -> {series}")
        rows = matrix["rocm"] or {}
        _expect(isinstance(rows, dict), "matrix -> rocm", "not an object")
        for series, row in rows.items():
            where = f"matrix -> rocm -> {series}"
            r = _table(row, where, ("os", "kernels", "gpus"))
            for key in ("os", "kernels"):
                table = r[key] or {}
                _expect(isinstance(table, dict), f"{where} -> {key}", "not an object")
                for name, values in table.items():
                    _str_list(values, f"{where} -> {key} -> {name}")
            _str_list(r["gpus"] or [], f"{where} -> gpus")


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
    except _Problem as exc:
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
