"""The pairing policy as operators write it (TOML), validated with frozen pydantic models.

A policy pins what operators freeze (allowed amdgpu driver x ROCm pairings, kernels, NVIDIA driver x CUDA
pairings, per-package version rules such as container toolkits, packages that must not move) and says what a
violation does: ``warn``, ``block`` (refuse the transaction) or ``rollback`` (refuse it, and put back anything
that slipped through, e.g. via ``dpkg -i``). See docs/guard.md and policies/example.toml (installed as
/usr/share/doc/gpuguard/guard.md and /etc/gpuguard/example-policy.toml).

Types are strict: TOML has booleans and numbers, so ``require_amd_matrix = "yes"`` or
``max_override_minutes = "240"`` is an error, not something coerced (load.py words those messages).
"""

from __future__ import annotations

from typing import Annotated, Any, List, Literal, Optional, Union

from pydantic import BeforeValidator, ConfigDict, Field, field_validator

from agent.defaults import AMD_DRIVER_PACKAGE, ROCM_CORE_PACKAGE
from agent.models import FrozenModel
from agent.policy.compiled import DEFAULT_CUDA_PACKAGES, DEFAULT_KERNEL_PACKAGES, DEFAULT_NVIDIA_DRIVER_PACKAGES
from agent.policy.spec import package_spec_errors, spec_errors

Action = Literal["warn", "block", "rollback"]
Failsafe = Literal["block-guarded", "block-all", "allow"]


class PolicyModel(FrozenModel):
    """A policy table: frozen, unknown keys refused, and strict (no string for a bool or a number)."""

    model_config = ConfigDict(**FrozenModel.model_config, strict=True)


def _spec_type(value: Any) -> Any:
    if isinstance(value, str) or (isinstance(value, list) and all(isinstance(v, str) for v in value)):
        return value
    raise ValueError(f"{value!r} is not a version spec: give a string such as \"6.2.*\" or a list of them")


# One error per bad value (a plain Union would report one per union member).
Spec = Annotated[Union[str, List[str]], BeforeValidator(_spec_type)]


def _check_spec(value: Optional[Spec]) -> Optional[Spec]:
    if value is None:
        return value
    problems = spec_errors(value)
    if problems:
        raise ValueError("; ".join(problems))
    return value


def _check_package_spec(value: Optional[Spec]) -> Optional[Spec]:
    """A spec on package versions: its constraint versions are ones dpkg or rpm accepts."""
    if value is None:
        return value
    problems = package_spec_errors(value)
    if problems:
        raise ValueError("; ".join(problems))
    return value


def _check_patterns(value: List[str]) -> List[str]:
    for pattern in value:
        if not pattern.strip() or " " in pattern:
            raise ValueError(f"{pattern!r} is not a package name or glob")
    return value


class PolicySection(PolicyModel):
    """Defaults for the whole policy."""

    name: str = Field("unnamed", min_length=1)
    action: Action = "block"
    failsafe: Failsafe = "block-guarded"
    require_amd_matrix: bool = False
    max_override_minutes: int = Field(240, gt=0, le=7 * 24 * 60)
    guarded: List[str] = []

    _patterns = field_validator("guarded")(_check_patterns)


class AmdPairing(PolicyModel):
    """One allowed combination of amdgpu driver release and ROCm release."""

    name: str = Field(min_length=1)
    amdgpu: Spec
    rocm: Spec
    amdgpu_package: Optional[Spec] = None
    rocm_package: Optional[Spec] = None
    kernels: Optional[Spec] = None
    action: Optional[Action] = None

    _specs = field_validator("amdgpu", "rocm", "kernels")(_check_spec)
    _package_specs = field_validator("amdgpu_package", "rocm_package")(_check_package_spec)


class AmdSection(PolicyModel):
    """Which packages carry the AMD driver and ROCm, and the allowed pairings."""

    driver_package: str = AMD_DRIVER_PACKAGE
    rocm_package: str = ROCM_CORE_PACKAGE
    action: Optional[Action] = None
    side_by_side: bool = False  # may several ROCm releases (rocm-core6.4.1 beside rocm-core) be installed?
    pairing: List[AmdPairing] = []


class KernelSection(PolicyModel):
    """The kernels a host may install (new kernels only: those already installed stay allowed)."""

    packages: List[str] = list(DEFAULT_KERNEL_PACKAGES)
    allow: Optional[Spec] = None
    action: Optional[Action] = None

    _specs = field_validator("allow")(_check_spec)
    _patterns = field_validator("packages")(_check_patterns)


class NvidiaPairing(PolicyModel):
    """One allowed combination of NVIDIA driver release and CUDA release."""

    name: str = Field(min_length=1)
    driver: Spec
    cuda: Spec
    action: Optional[Action] = None

    _specs = field_validator("driver", "cuda")(_check_spec)


class NvidiaSection(PolicyModel):
    """Which packages carry the NVIDIA driver and CUDA, and the allowed pairings."""

    driver_packages: List[str] = list(DEFAULT_NVIDIA_DRIVER_PACKAGES)
    cuda_packages: List[str] = list(DEFAULT_CUDA_PACKAGES)
    action: Optional[Action] = None
    side_by_side: bool = False  # may several CUDA releases (cuda-toolkit-13-1 beside -13-0) be installed?
    pairing: List[NvidiaPairing] = []

    _patterns = field_validator("driver_packages", "cuda_packages")(_check_patterns)


class VersionRule(PolicyModel):
    """Allowed versions of some packages (e.g. the container toolkit)."""

    name: Optional[str] = None
    packages: List[str] = Field(min_length=1)
    allow: Spec
    action: Optional[Action] = None

    _specs = field_validator("allow")(_check_package_spec)
    _patterns = field_validator("packages")(_check_patterns)


class FrozenSection(PolicyModel):
    """Packages that must not move at all (install, upgrade, downgrade or removal)."""

    packages: List[str] = []
    action: Optional[Action] = None

    _patterns = field_validator("packages")(_check_patterns)


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


class HealthSection(PolicyModel):
    """What the daemon does when the health check after a package change finds the GPU stack broken.

    ``alert`` reports it; ``rollback`` also restores the guarded packages recorded before the change (on
    ``cpu_fallback`` or ``failed``, or a ``regression`` a second run on an idle GPU confirms; never on a busy GPU).
    """

    after_change: Literal["alert", "rollback"] = "alert"


class Policy(PolicyModel):
    """A whole policy (one file, or several merged in name order)."""

    policy: PolicySection = PolicySection()
    amd: Optional[AmdSection] = None
    kernel: Optional[KernelSection] = None
    nvidia: Optional[NvidiaSection] = None
    versions: List[VersionRule] = []
    frozen: Optional[FrozenSection] = None
    companions: Optional[CompanionsSection] = None
    health: Optional[HealthSection] = None

    def rule_count(self) -> int:
        """How many rules the policy defines (0 means it constrains nothing)."""
        count = len(self.versions) + int(self.policy.require_amd_matrix)
        if self.amd:
            count += len(self.amd.pairing)
        if self.kernel and self.kernel.allow is not None:
            count += 1
        if self.nvidia:
            count += len(self.nvidia.pairing)
        if self.frozen:
            count += len(self.frozen.packages)
        if self.companions:
            count += len(self.companions.enabled())
        return count
