"""Container runtimes and GPU container toolkits: docker, containerd, podman, runc, crun, NVIDIA and AMD toolkits,
and the running containers that bring CUDA or ROCm user space (read from /proc: agent/hostfacts/containers.py).

Versions come from each tool's own ``--version`` (static installs have no package), and docker's configured
runtimes from /etc/docker/daemon.json, where the NVIDIA/AMD runtime hooks are registered.
"""

from __future__ import annotations

import json
from typing import Dict, List, Optional, Tuple

from agent.collectors.factcache import MISSING, FactCache, file_identity
from agent.errors import CollectorUnavailable, CommandError
from agent.frozen import Frozen, field, frozen_record
from agent.host import Host
from agent.hostfacts.containers import running_containers
from agent.lazyre import LazyPattern
from agent.log import get_logger

log = get_logger("collectors.containers")

# (tool name, program, argv after the program)
TOOLS: Tuple[Tuple[str, str, Tuple[str, ...]], ...] = (
    ("docker", "docker", ("--version",)),
    ("containerd", "containerd", ("--version",)),
    ("podman", "podman", ("--version",)),
    ("runc", "runc", ("--version",)),
    ("crun", "crun", ("--version",)),
    ("nvidia-container-toolkit", "nvidia-ctk", ("--version",)),
    ("nvidia-container-cli", "nvidia-container-cli", ("--version",)),
    ("amd-container-toolkit", "amd-ctk", ("--version",)),
)

_VERSION = LazyPattern(r"\bv?(\d+\.\d+(?:\.\d+)?(?:[-+~][0-9A-Za-z.\-+~]*)?)")


@frozen_record
class ContainerTool(Frozen):
    """One container tool found on the host."""

    path: str
    version: Optional[str] = None


@frozen_record
class RunningGpuContainer(Frozen):
    """A running container that brings CUDA or ROCm user space (agent/hostfacts/containers.py reads it)."""

    runtime: str
    container_id: str
    pid: int
    cuda_version: Optional[str] = None
    require_cuda: Optional[str] = None
    rocm_release: Optional[str] = None


@frozen_record
class ContainersInfo(Frozen):
    """Tools present, docker's runtime configuration, and the running containers' GPU user space."""

    __json_omit_empty__ = ("running_gpu",)  # added after snapshots were stored
    tools: Dict[str, ContainerTool]
    docker_default_runtime: Optional[str] = None
    docker_runtimes: List[str] = field(default_factory=list)
    running_gpu: List[RunningGpuContainer] = field(default_factory=list)


def parse_tool_version(output: str) -> Optional[str]:
    """The first version-looking token of a ``--version`` output (``Docker version 28.2.2, build e6534b4``)."""
    for line in output.splitlines():
        lowered = line.lower()
        # nvidia-container-cli prints "cli-version: 1.17.8" then "lib-version"; nvidia-ctk "NVIDIA Container
        # Toolkit CLI version 1.17.8" then "commit: ...": the first versioned line is the tool's own.
        if lowered.startswith(("commit", "build", "spec:", "go:", "git commit")):
            continue
        match = _VERSION.search(line)
        if match:
            return match.group(1).rstrip(",")
    return None


def parse_docker_daemon_json(text: str) -> Tuple[Optional[str], List[str]]:
    """(default runtime, runtime names) from daemon.json; raises ValueError on invalid JSON."""
    data = json.loads(text) if text.strip() else {}
    if not isinstance(data, dict):
        raise ValueError("daemon.json is not a JSON object")
    runtimes = data.get("runtimes") or {}
    return data.get("default-runtime"), sorted(runtimes) if isinstance(runtimes, dict) else []


class ContainersCollector:
    """Finds each tool under the host root and asks it for its version."""

    name = "containers"

    def __init__(self, timeout_seconds: float = 5.0) -> None:
        self.timeout_seconds = timeout_seconds

    def collect(self, host: Host) -> ContainersInfo:
        tools: Dict[str, ContainerTool] = {}
        versions = FactCache(host, "tool-versions")
        for tool, program, args in TOOLS:
            path = host.which(program)
            if path is None:
                continue
            tools[tool] = ContainerTool(path=path, version=self._version(host, versions, tool, path, args))
        versions.save()
        default_runtime: Optional[str] = None
        runtimes: List[str] = []
        daemon_json = host.read_text("/etc/docker/daemon.json")
        if daemon_json is not None:
            try:
                default_runtime, runtimes = parse_docker_daemon_json(daemon_json)
            except ValueError as exc:
                log.warning("docker_daemon_json_invalid", path="/etc/docker/daemon.json", error=str(exc))
        if not tools and daemon_json is None:
            raise CollectorUnavailable("no container runtime or toolkit found")
        running = [RunningGpuContainer(runtime=c.runtime, container_id=c.container_id, pid=c.pid,
                                       cuda_version=c.cuda_version, require_cuda=c.require_cuda,
                                       rocm_release=c.rocm_release) for c in running_containers(str(host.root))]
        return ContainersInfo(tools=tools, docker_default_runtime=default_runtime, docker_runtimes=runtimes,
                              running_gpu=running)

    def _version(self, host: Host, versions: FactCache, tool: str, path: str, args: Tuple[str, ...]) -> Optional[str]:
        """The tool's ``--version``, asked once per binary identity; a failure is not cached (asked again next time)."""
        program = host.file(path)
        identity = file_identity(program)
        cached = versions.get(tool, identity)
        if cached is not MISSING:
            return cached if isinstance(cached, str) else None
        try:
            result = host.run([program, *args], self.timeout_seconds)
        except CommandError as exc:
            log.warning("container_tool_version_failed", tool=tool, error=str(exc))
            return None
        version = parse_tool_version(result.stdout + "\n" + result.stderr)
        versions.put(tool, identity, version)
        return version
