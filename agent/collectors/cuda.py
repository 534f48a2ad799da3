"""CUDA toolkits installed under /usr/local/cuda-X.Y and their forward-compat driver libraries, and CUDA as Debian and
Ubuntu package it (``nvidia-cuda-toolkit``, ``libcudart12``, ``libcublas12``, ... under /usr/lib/<triplet>, no
/usr/local/cuda): those packages with the CUDA release each carries (``12.4.127~12.4.1-2`` is CUDA 12.4.1); without a
dpkg database, the runtime's library file under the multiarch directories (``libcudart.so.12.4.127`` is 12.4)."""

from __future__ import annotations

import json
import re
from typing import Dict, List, Optional

from agent.collectors.dpkg import DPKG_STATUS
from agent.collectors.nvidia import cuda_version_from_int
from agent.defaults import DISTRIBUTION_CUDA_PACKAGES, DISTRIBUTION_LIBRARY_DIRS
from agent.errors import CollectorUnavailable
from agent.frozen import Frozen, field, frozen_record
from agent.host import Host
from agent.hostfacts.dpkg_status import iter_named
from agent.lazyre import LazyPattern
from agent.log import get_logger
from agent.policy.releases import cuda_release

log = get_logger("collectors.cuda")

CUDA_PREFIX = "/usr/local"
DEFAULT_LINK = "/usr/local/cuda"
_TOOLKIT_DIR = LazyPattern(r"^cuda-\d+(?:\.\d+)*$")
_VERSION_TXT = LazyPattern(r"CUDA Version\s+(\d+(?:\.\d+)*)")
_COMPAT_LIBCUDA = LazyPattern(r"^libcuda\.so\.(\d+\.\d+(?:\.\d+)*)$")
_CUDA_H_VERSION = LazyPattern(r"^\s*#\s*define\s+CUDA_VERSION\s+(\d+)\s*$", re.MULTILINE)
_CUDA_H_HEAD_CHARS = 64 * 1024
# The distribution's packages whose version carries the CUDA release, in the order they are believed.
_RELEASE_PACKAGES = ("nvidia-cuda-toolkit", "libcudart")
_CUDART_LIBRARY = LazyPattern(r"^libcudart\.so\.(\d+)\.(\d+)\.\d+$")  # 12.4.127: the third number is cudart's


@frozen_record
class CudaToolkit(Frozen):
    """One CUDA toolkit tree."""

    path: str
    version: Optional[str] = None
    compat_driver_version: Optional[str] = None


@frozen_record
class PackagedCuda(Frozen):
    """One CUDA package as the distribution ships it: the package, its version and the CUDA release it carries."""

    package: str
    version: str
    release: Optional[str] = None


@frozen_record
class CudaInfo(Frozen):
    """Every toolkit on disk and which one /usr/local/cuda points at; the distribution's CUDA packages and the
    release they carry (``packaged_release``, from nvidia-cuda-toolkit, else libcudart, else with no package and no
    toolkit tree the runtime's library file)."""

    __json_omit_empty__ = ("packaged", "packaged_release")  # added after snapshots were stored (see as_json_data)

    default_path: Optional[str] = None
    toolkits: List[CudaToolkit] = field(default_factory=list)
    packaged: List[PackagedCuda] = field(default_factory=list)
    packaged_release: Optional[str] = None


def packaged_cuda(status: bytes) -> List[PackagedCuda]:
    """The distribution's CUDA packages in a dpkg status file: nvidia-cuda-toolkit, the runtime (libcudart12) and
    the libraries named after their SONAME (libcublas12, libcufft11, libnvrtc12; -dev and -doc left out)."""
    prefixes = [p[:-1] for p in DISTRIBUTION_CUDA_PACKAGES if p.endswith("*")] + ["libcudart"]
    found: Dict[str, PackagedCuda] = {}
    for name, version, _arch, _state in iter_named(status, names=[_RELEASE_PACKAGES[0]], prefixes=prefixes):
        if name[-1:].isdecimal() or name == _RELEASE_PACKAGES[0]:
            found[name] = PackagedCuda(package=name, version=version, release=cuda_release(version))
    return [found[name] for name in sorted(found)]


def cudart_library_release(names: List[str]) -> Optional[str]:
    """The CUDA major.minor of the newest runtime among a library directory's entries (``libcudart.so.12.4.127`` ->
    ``12.4``); None without one."""
    found = [(int(m.group(1)), int(m.group(2))) for name in names for m in [_CUDART_LIBRARY.match(name)] if m]
    return "{}.{}".format(*max(found)) if found else None


def _cudart_library(host: Host) -> Optional[str]:
    for directory in DISTRIBUTION_LIBRARY_DIRS:
        found = cudart_library_release(host.list_dir(directory))
        if found:
            return found
    return None


def packaged_release(packages: List[PackagedCuda]) -> Optional[str]:
    """The CUDA release of the distribution's packages: nvidia-cuda-toolkit's, else libcudart's; None without."""
    for prefix in _RELEASE_PACKAGES:
        for package in packages:
            if package.package.startswith(prefix) and package.release:
                return package.release
    return None


def parse_version_json(text: str) -> Optional[str]:
    """The toolkit version from version.json (CUDA >= 11.1): ``{"cuda": {"name": "CUDA SDK", "version": "13.0.2"}}``.

    Raises ValueError when the text is not JSON.
    """
    data = json.loads(text)
    cuda = data.get("cuda") if isinstance(data, dict) else None
    version = cuda.get("version") if isinstance(cuda, dict) else None
    if not isinstance(version, str):
        return None
    return version.strip() or None


def parse_version_txt(text: str) -> Optional[str]:
    """The toolkit version from the legacy version.txt: ``CUDA Version 11.8.89``."""
    match = _VERSION_TXT.search(text)
    return match.group(1) if match else None


def parse_cuda_h_version(text: str) -> Optional[str]:
    """``major.minor`` from the ``#define CUDA_VERSION 13000`` line of include/cuda.h."""
    match = _CUDA_H_VERSION.search(text)
    return cuda_version_from_int(int(match.group(1))) if match else None


def _version_tuple(version: str) -> tuple:
    return tuple(int(part) for part in re.findall(r"\d+", version))


def compat_driver_version(file_names: List[str]) -> Optional[str]:
    """The driver version of the forward-compat libcuda in ``<toolkit>/compat`` (``libcuda.so.580.95.05``).

    ``libcuda.so`` and ``libcuda.so.1`` are links to the versioned file; the highest version wins if several lie there.
    """
    versions = [m.group(1) for m in map(_COMPAT_LIBCUDA.match, file_names) if m]
    return max(versions, key=_version_tuple) if versions else None


def read_toolkit_version(host: Host, path: str) -> Optional[str]:
    """version.json, then version.txt, then include/cuda.h; None when none says.

    Hosts that install single CUDA component packages (cuda-cudart-13-0, cuda-nvcc-13-0) rather than the
    cuda-toolkit meta package have no version.json; cuda.h (from cuda-cudart-dev) then gives ``major.minor``.
    """
    text = host.read_text(f"{path}/version.json")
    if text is not None:
        try:
            version = parse_version_json(text)
        except ValueError as exc:
            log.warning("cuda_version_json_invalid", path=f"{path}/version.json", error=str(exc))
        else:
            if version:
                return version
    text = host.read_text(f"{path}/version.txt")
    version = parse_version_txt(text) if text is not None else None
    if version is None:
        # CUDA_VERSION is defined near the top of cuda.h (line 263, about 10 KB into 13.0's 1.1 MB): read that much
        # first and the whole file only when the define is not in it.
        header = f"{path}/include/cuda.h"
        text = host.read_text(header, max_chars=_CUDA_H_HEAD_CHARS)
        if text is not None and len(text) == _CUDA_H_HEAD_CHARS:  # cut short: its last line may be cut too
            version = parse_cuda_h_version(text[:text.rfind("\n") + 1])
            if version is None:
                text = host.read_text(header)
        if version is None and text is not None:
            version = parse_cuda_h_version(text)
    return version


class CudaCollector:
    """Lists /usr/local/cuda and /usr/local/cuda-X.Y (links resolved, aliases such as cuda-13 folded in)."""

    name = "cuda"

    def collect(self, host: Host) -> CudaInfo:
        default_path = host.resolve(DEFAULT_LINK) if host.exists(DEFAULT_LINK) else None
        candidates = [DEFAULT_LINK] + [f"{CUDA_PREFIX}/{name}" for name in host.list_dir(CUDA_PREFIX)
                                       if _TOOLKIT_DIR.match(name)]
        toolkits: Dict[str, CudaToolkit] = {}
        for candidate in candidates:
            # Resolve inside the host root first: links such as /usr/local/cuda -> /etc/alternatives/cuda are
            # absolute and would otherwise be followed on the machine running gpuguard.
            path = host.resolve(candidate)
            if path in toolkits or not host.is_dir(path):
                continue
            toolkits[path] = CudaToolkit(
                path=path,
                version=read_toolkit_version(host, path),
                compat_driver_version=compat_driver_version(host.list_dir(f"{path}/compat")),
            )
        status = host.read_bytes(DPKG_STATUS)
        packaged = packaged_cuda(status) if status is not None else []
        release = packaged_release(packaged)
        if release is None and not toolkits and default_path is None:
            release = _cudart_library(host)
        if not toolkits and default_path is None and not packaged and release is None:
            raise CollectorUnavailable(f"no CUDA toolkit under {CUDA_PREFIX}")
        # Oldest first; a toolkit without a version file sorts by the version in its directory name.
        ordered = sorted(toolkits.values(), key=lambda t: (_version_tuple(t.version or t.path.rsplit("/", 1)[-1]),
                                                           t.path))
        return CudaInfo(default_path=default_path, toolkits=ordered, packaged=packaged, packaged_release=release)
