"""CUDA toolkits installed under /usr/local/cuda-X.Y and their forward-compat driver libraries."""

from __future__ import annotations

import json
import re
from typing import Dict, List, Optional

from agent.collectors.nvidia import cuda_version_from_int
from agent.errors import CollectorUnavailable
from agent.frozen import Frozen, field, frozen_record
from agent.host import Host
from agent.lazyre import LazyPattern
from agent.log import get_logger

log = get_logger("collectors.cuda")

CUDA_PREFIX = "/usr/local"
DEFAULT_LINK = "/usr/local/cuda"
_TOOLKIT_DIR = LazyPattern(r"^cuda-\d+(?:\.\d+)*$")
_VERSION_TXT = LazyPattern(r"CUDA Version\s+(\d+(?:\.\d+)*)")
_COMPAT_LIBCUDA = LazyPattern(r"^libcuda\.so\.(\d+\.\d+(?:\.\d+)*)$")
_CUDA_H_VERSION = LazyPattern(r"^\s*#\s*define\s+CUDA_VERSION\s+(\d+)\s*$", re.MULTILINE)
_CUDA_H_HEAD_CHARS = 64 * 1024


@frozen_record
class CudaToolkit(Frozen):
    """One CUDA toolkit tree."""

    path: str
    version: Optional[str] = None
    compat_driver_version: Optional[str] = None


@frozen_record
class CudaInfo(Frozen):
    """Every toolkit on disk and which one /usr/local/cuda points at."""

    default_path: Optional[str] = None
    toolkits: List[CudaToolkit] = field(default_factory=list)


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
        if not toolkits and default_path is None:
            raise CollectorUnavailable(f"no CUDA toolkit under {CUDA_PREFIX}")
        # Oldest first; a toolkit without a version file sorts by the version in its directory name.
        ordered = sorted(toolkits.values(), key=lambda t: (_version_tuple(t.version or t.path.rsplit("/", 1)[-1]),
                                                           t.path))
        return CudaInfo(default_path=default_path, toolkits=ordered)
