"""What release a package version stands for: the amdgpu driver release, the ROCm release, a kernel release.

AMD encodes the release inside amdgpu-dkms versions: ``1:6.8.5.60202-2041575.22.04`` is kernel-driver base 6.8.5
built for ROCm 6.2.2 (``MMmmpp`` code 60202). From driver 30.10 on, the code is 8 digits ``AABBCCDD``
(``1:6.14.14.30100100-...`` is driver 30.10.1): the driver got its own numbering when it split from ROCm.
Standard library only (used by the apt hook).
"""

from __future__ import annotations

from agent.defaults import THEROCK_BASE_PACKAGE
from agent.hostfacts.package_keys import package_name
from agent.versions import upstream_dotted

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs milliseconds of the apt hook's start-up budget
    from typing import Optional, Tuple

# Kernel image package names are PREFIX + release, the release ``\d+\.\d+`` then [A-Za-z0-9.+~_-]*.
_KERNEL_PREFIXES = ("linux-image-unsigned-", "linux-modules-unsigned-", "linux-image-", "linux-modules-")
_RELEASE_TAIL_CHARS = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.+~_-"
# rpm kernel packages whose version-release.arch is the kernel release (uname -r).
RPM_KERNEL_NAMES = frozenset({"kernel", "kernel-core", "kernel-uek", "kernel-uek-core", "kernel-default",
                              "kernel-rt-core", "kernel-64k-core"})


def amdgpu_driver_release(version: Optional[str]) -> Optional[str]:
    """The driver release an amdgpu-dkms version stands for (``6.2.2``, ``30.20.1``), or None when not encoded."""
    if not version:
        return None
    dotted = upstream_dotted(version)
    if not dotted:
        return None
    parts = dotted.split(".")
    if len(parts) < 4 or not parts[3].isdigit():
        return None
    code = parts[3]
    if len(code) == 8:
        major, minor, patch, hotfix = int(code[0:2]), int(code[2:4]), int(code[4:6]), int(code[6:8])
        return f"{major}.{minor}.{patch}" + (f".{hotfix}" if hotfix else "")
    return rocm_code_release(code)


def amdgpu_same_build(driver: str, firmware: str) -> bool:
    """Whether an amdgpu-dkms and an amdgpu-dkms-firmware version are one build. Equal versions always are; in the
    31.x numbering the firmware is versioned apart (``1:31.60.0.0.31600000-2403767.26.04`` beside the driver's
    ``1:7.1.9.31600000-2403767.26.04``, seen on a 31.60 host), so there the 8-digit release code and the build
    (the revision) must agree."""
    if driver == firmware:
        return True
    key = _build_key(driver)
    return key is not None and key == _build_key(firmware)


def _build_key(version: str) -> Optional[Tuple[str, str]]:
    upstream, dash, revision = version.rpartition("-")
    code = (upstream_dotted(upstream) or "").rpartition(".")[2]
    return (code, revision) if dash and len(code) == 8 and code.isdigit() else None


def amdgpu_kernel_base(version: Optional[str]) -> Optional[str]:
    """The DKMS kernel-driver base of an amdgpu-dkms version (``1:6.8.5.60202-...`` -> ``6.8.5``)."""
    return upstream_dotted(version, parts=3) if version else None


def rocm_release(version: Optional[str]) -> Optional[str]:
    """The ROCm release of a rocm-core version (``6.2.2.60202-116~22.04`` -> ``6.2.2``) or a TheRock amdrocm-base
    version (deb ``10.0.0-4``, rpm ``7.13.0``, nightly ``7.13.0~20260401`` -> ``10.0.0``, ``7.13.0``)."""
    return upstream_dotted(version, parts=3) if version else None


def rocm_code_release(code: str) -> Optional[str]:
    """The ROCm release of AMD's ``MMmmpp`` code (5 or 6 digits): ``70002`` -> ``7.0.2``, ``71400`` -> ``7.14.0``,
    ``100000`` -> ``10.0.0``; None for anything else."""
    if not code.isdigit() or len(code) not in (5, 6):
        return None
    number = int(code)
    return f"{number // 10000}.{(number // 100) % 100}.{number % 100}"


# amdsmi's own numbering (24.6.2, 25.3.0, 26.0.2, 27.0.0) starts here; ROCm's releases are below it.
AMDSMI_OWN_MAJOR_FROM = 20
THEROCK_AMDSMI_PACKAGE = "amdrocm-amdsmi"


def amdsmi_build(name: str, version: str) -> Tuple[Optional[str], Optional[str]]:
    """(amdsmi's own version, the ROCm release it was built for) of an amdsmi package or pip binding; either is
    None where the version does not say it. The one reading of amdsmi versions (the companion rule, the snapshot,
    the apt and dnf hooks, freeze).

    - AMD's packages fold the ROCm release in after amdsmi's version, deb and rpm alike: ``amd-smi-lib
      26.0.2.70002-56~24.04`` (rpm ``26.0.2.70002-56.el9``) is amdsmi 26.0.2 for ROCm 7.0.2; ``26.1.0.70100`` for
      7.1.0, ``27.0.0.71400`` for 7.14.0, ``27.0.0.100000`` for 10.0.0.
    - TheRock's ``amdrocm-amdsmi10.0 10.0.0-4`` (and the alias ``amdrocm-amdsmi 10.0.0-4``), the PyPI wheel
      ``amdsmi 7.0.2`` and Debian's ``libamd-smi27 10.1-1`` carry the ROCm release itself (TheRock's name too).
    - A version in amdsmi's own numbering with nothing folded in (``26.0.2``, a binding pip built from ROCm's
      tree) says amdsmi's version only.
    """
    dotted = upstream_dotted(version) if version else None
    parts = dotted.split(".") if dotted else []
    if len(parts) >= 4:
        folded = rocm_code_release(parts[3])
        if folded is not None:
            return ".".join(parts[:3]), folded
    tail = name[len(THEROCK_AMDSMI_PACKAGE):] if name.startswith(THEROCK_AMDSMI_PACKAGE) else ""
    if tail and tail[0].isdigit():
        three = ".".join(parts[:3])
        return None, three if series(three) == tail else tail
    if not parts:
        return None, None
    if AMDSMI_OWN_MAJOR_FROM <= int(parts[0]) < 100:
        return ".".join(parts[:3]), None
    return None, ".".join(parts[:3])


def rocm_package_patterns(rocm_name: str) -> Tuple[str, ...]:
    """The packages whose versions carry the ROCm releases present: the policy's ROCm package and its versioned
    side-by-side installs (``rocm-core``, ``rocm-core6.4.1``), and TheRock's base package with its versioned
    installs (``amdrocm-base``, ``amdrocm-base7.13``, ``amdrocm-base10.0``). Globs, one home for the hook, the
    pins, freeze and the snapshot."""
    return (rocm_name, rocm_name + "[0-9]*", THEROCK_BASE_PACKAGE, THEROCK_BASE_PACKAGE + "[0-9]*")


def dotted_release(version: Optional[str], parts: Optional[int] = None) -> Optional[str]:
    """The leading dotted number of a version (NVIDIA driver ``580.159.04``, CUDA ``13.0.96``)."""
    return upstream_dotted(version, parts=parts) if version else None


def cuda_release(version: Optional[str]) -> Optional[str]:
    """The CUDA release a CUDA package's version stands for. Debian and Ubuntu version each CUDA component by its
    own number with the toolkit release after a tilde (libcudart12 ``12.4.127~12.4.1-2``, libcufft11
    ``11.2.1.3~12.4.1-2``, nvidia-cuda-toolkit ``12.4.131~12.4.1-2``: all CUDA 12.4.1); NVIDIA's repositories lead
    with the release (cuda-cudart-13-0 ``13.0.96-1``)."""
    if not version:
        return None
    text = version.split(":", 1)[1] if ":" in version.split("-", 1)[0] else version
    upstream = text.rpartition("-")[0] or text
    _, tilde, after = upstream.partition("~")
    if tilde and after[:1].isdecimal():
        found = upstream_dotted(after)
        if found:
            return found
    return dotted_release(version)


def series(release: Optional[str], parts: int = 2) -> Optional[str]:
    """The first ``parts`` components of a release (``6.2.2`` -> ``6.2``; ``30.20.1`` -> ``30.20``)."""
    if not release:
        return None
    return ".".join(release.split(".")[:parts])


def kernel_release_of(name: str, version: str, arch: str = "", manager: str = "dpkg") -> Optional[str]:
    """The kernel release (``uname -r``) a package installs, or None when it is not a kernel image package.

    dpkg: from the name (``linux-image-6.1.0-26-amd64``; meta packages such as ``linux-image-amd64`` are not
    kernels). rpm: ``kernel-core`` ``5.14.0-427.el9`` on x86_64 is ``5.14.0-427.el9.x86_64``.
    """
    if manager == "rpm":
        # install-only packages (several kernels side by side) are keyed ``name@version`` in installed sets
        base = package_name(name)
        if base not in RPM_KERNEL_NAMES:
            return None
        evr = version.split(":", 1)[1] if ":" in version else version
        return f"{evr}.{arch}" if arch else evr
    base = name.split(":", 1)[0]
    if base.endswith(("-dbg", "-dbgsym")):
        return None
    for prefix in _KERNEL_PREFIXES:
        if base.startswith(prefix) and _is_kernel_release(base[len(prefix):]):
            return base[len(prefix):]
    return None


# The architecture suffix of an rpm kernel's ``uname -r`` (5.14.0-427.el9.x86_64).
_RPM_KERNEL_ARCHES = (".x86_64", ".aarch64", ".ppc64le", ".s390x", ".i686", ".noarch")


def policy_kernel_release(uname_release: str, manager: str = "dpkg") -> str:
    """A running kernel's release (``uname -r``) as policies and the evaluator write it: on rpm hosts the package's
    version-release, without the architecture (``5.14.0-427.el9.x86_64`` -> ``5.14.0-427.el9``)."""
    if manager == "rpm":
        for arch in _RPM_KERNEL_ARCHES:
            if uname_release.endswith(arch):
                return uname_release[: -len(arch)]
    return uname_release


def _is_kernel_release(text: str) -> bool:
    """``\\d+\\.\\d+`` then only letters, digits and ``.+~_-`` (``6.8.0-45-generic``), without ``re``."""
    major, dot, rest = text.partition(".")
    if not dot or not major.isdecimal():
        return False
    i = 0
    while i < len(rest) and rest[i].isdecimal():
        i += 1
    return i > 0 and not rest[i:].strip(_RELEASE_TAIL_CHARS)
