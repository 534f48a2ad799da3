"""The GPU user space of the containers running on the host, read from /proc: no runtime is asked.

A container's processes carry its image's environment (``CUDA_VERSION``, ``NVIDIA_REQUIRE_CUDA``: what NVIDIA's
CUDA images set, and what the NVIDIA container toolkit checks against the driver when the container starts) and see
its image's files through ``/proc/<pid>/root`` (``/opt/rocm*/.info/version``: the ROCm release of AMD's images).
Which container a process belongs to is in its ``/proc/<pid>/cgroup``: docker (``docker-<id>.scope``,
``/docker/<id>``), podman (``libpod-<id>``), containerd and CRI (``cri-containerd-<id>``, kubepods paths) and CRI-O
(``crio-<id>``), each a 64-hex id. So docker, containerd/CRI and podman containers are all seen the same way,
without a command on the apt hook's path, and a container counts as long as any of its processes runs.

Standard library only (the apt hook reads this when a policy has a ``[containers]`` section). Bounded: at most
``MAX_PIDS`` processes looked at, ``MAX_CONTAINERS`` containers kept, a few KiB read per file.
"""

from __future__ import annotations

import posix

from agent.hostfacts.paths import read_small_text, under
from agent.records import Record

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs milliseconds of the apt hook's start-up budget
    from typing import Dict, List, Optional, Tuple

MAX_PIDS = 65536
MAX_CONTAINERS = 1024
_ENVIRON_BYTES = 256 << 10
_HEX = frozenset("0123456789abcdef")
# cgroup path markers before a container id, and the runtime each names.
_MARKERS = (("docker-", "docker"), ("/docker/", "docker"), ("libpod-", "podman"), ("cri-containerd-", "containerd"),
            ("crio-", "cri-o"), ("/kubepods", "kubernetes"), ("/containerd/", "containerd"))
ROCM_VERSION_FILES = ("/opt/rocm/.info/version", "/opt/rocm/core/.info/version")


class ContainerStack(Record):
    """One running container's GPU user space: its runtime and short id, one of its pids, and what its image
    says (``cuda_version`` from CUDA_VERSION, ``require_cuda`` the lowest CUDA release NVIDIA_REQUIRE_CUDA asks
    for, ``rocm_release`` from the image's ROCm version file); None where the image says nothing."""

    __slots__ = ("runtime", "container_id", "pid", "cuda_version", "require_cuda", "rocm_release")
    runtime: str
    container_id: str
    pid: int
    cuda_version: Optional[str]
    require_cuda: Optional[str]
    rocm_release: Optional[str]

    def __init__(self, runtime: str, container_id: str, pid: int, cuda_version: Optional[str] = None,
                 require_cuda: Optional[str] = None, rocm_release: Optional[str] = None) -> None:
        Record.__init__(self, runtime, container_id, pid, cuda_version, require_cuda, rocm_release)

    def describe(self) -> str:
        return f"{self.runtime} container {self.container_id} (pid {self.pid})"

    def uses_gpu_stack(self) -> bool:
        return bool(self.cuda_version or self.require_cuda or self.rocm_release)


def container_of(cgroup_text: str) -> Optional[Tuple[str, str]]:
    """(runtime, 12-hex short id) of the container a process's /proc/<pid>/cgroup names, else None."""
    for line in cgroup_text.splitlines():
        path = line.rpartition(":")[2]
        for marker, runtime in _MARKERS:
            at = path.find(marker)
            if at < 0:
                continue
            # The id is the last 64-hex run in the path after the marker (kubepods nest pod, then container).
            for part in reversed(path[at:].replace(".scope", "/").replace("-", "/").split("/")):
                if len(part) == 64 and set(part) <= _HEX:
                    return runtime, part[:12]
    return None


def _series(text: str) -> Optional[str]:
    """``12.8`` of ``12.8.1``/``12.8``; None for what is not a version."""
    parts = text.strip().split(".")
    if len(parts) >= 2 and parts[0].isdecimal() and parts[1].isdecimal():
        return f"{int(parts[0])}.{int(parts[1])}"
    return None


def require_cuda_of(value: str) -> Optional[str]:
    """The lowest CUDA release of NVIDIA_REQUIRE_CUDA (``cuda>=12.8 brand=tesla,driver>=535,driver<536 ...``).

    The toolkit reads the ``cuda>=`` constraint (one or several alternatives); the brand/driver terms are forward
    compatibility exceptions on older drivers and are not needed to judge a driver move up.
    """
    found: List[str] = []
    for term in value.replace(",", " ").split():
        if term.startswith("cuda>="):
            series = _series(term[len("cuda>="):])
            if series is not None:
                found.append(series)
    if not found:
        return None
    return min(found, key=lambda s: tuple(int(p) for p in s.split(".")))


def parse_environ(text: str) -> Dict[str, str]:
    """CUDA_VERSION and NVIDIA_REQUIRE_CUDA of a /proc/<pid>/environ (NUL-separated NAME=value)."""
    out: Dict[str, str] = {}
    for item in text.split("\0"):
        name, _, value = item.partition("=")
        if name in ("CUDA_VERSION", "NVIDIA_REQUIRE_CUDA") and len(value) <= 4096:
            out[name] = value
    return out


def _rocm_release(root: str, pid: str) -> Optional[str]:
    base = under(root, f"/proc/{pid}/root")
    paths = list(ROCM_VERSION_FILES)
    try:
        paths += [f"/opt/{name}/.info/version" for name in sorted(posix.listdir(base + "/opt"))
                  if name.startswith("rocm-")][:8]
    except OSError:
        pass
    for path in paths:
        text = read_small_text("/", base + path, 256)
        if text:
            series = _series(text.split("-")[0])
            if series is not None:
                return text.strip().split("-")[0]
    return None


def running_containers(root: str) -> Tuple[ContainerStack, ...]:
    """Every running container with GPU user space, one entry per container (its lowest pid), sorted by id."""
    proc = under(root, "/proc")
    try:
        names = posix.listdir(proc)
    except OSError:
        return ()
    pids = sorted((int(n) for n in names if n.isdecimal()))[:MAX_PIDS]
    seen: Dict[str, ContainerStack] = {}
    for pid in pids:
        cgroup = read_small_text("/", f"{proc}/{pid}/cgroup", 16 << 10)
        found = container_of(cgroup) if cgroup else None
        if found is None or found[1] in seen:
            continue
        if len(seen) >= MAX_CONTAINERS:
            break
        env = parse_environ(read_small_text("/", f"{proc}/{pid}/environ", _ENVIRON_BYTES) or "")
        cuda = env.get("CUDA_VERSION")
        require = require_cuda_of(env.get("NVIDIA_REQUIRE_CUDA", ""))
        seen[found[1]] = ContainerStack(found[0], found[1], pid, _series(cuda) if cuda else None, require,
                                        _rocm_release(root, str(pid)))
    return tuple(stack for _, stack in sorted(seen.items()) if stack.uses_gpu_stack())
